"""
The communication cost model: predict GPU step and decode times, or calibrate and validate it on this machine
(the equations: tpcomm/costmodel/cost_model.py; the tables: tpcomm/costmodel/cost_tables.py; the measurements:
tpcomm/experiments/calibration.py; docs/cost_model.md).

$ python comm_model.py predict                                  # published-figure checks, then the GPU tables
$ python comm_model.py --tp_overlap=4 --efficiency=0.8          # other overlap assumptions
$ python comm_model.py --baseline=blocking                      # speedups over blocking all 'tp' (default:
                                                                # megatron)
$ python comm_model.py measure --out=calibration.json           # calibrate on this machine (real TP, gloo)
$ python comm_model.py validate --calibration=calibration.json  # leave-one-pattern-out errors
"""

import sys

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_in_one_line, exit_on_config_error
from tpcomm.experiments.calibration import (MEASURE_DEFAULTS, VALIDATE_DEFAULTS, MeasureError, measure,
                                            validate)
from tpcomm.costmodel.cost_model import PREDICT_DEFAULTS
from tpcomm.costmodel.cost_tables import predict

COMMANDS = {"predict": (PREDICT_DEFAULTS, predict), "measure": (MEASURE_DEFAULTS, measure),
            "validate": (VALIDATE_DEFAULTS, validate)}


@exit_in_one_line(MeasureError, 1)
@exit_on_config_error
def main(argv):
    command = "predict"
    if argv and not argv[0].startswith("--"):
        command, argv = argv[0], argv[1:]
    if command not in COMMANDS:
        raise ConfigError(f"unknown command {command!r}; use {', '.join(COMMANDS)} (no command: predict)")
    defaults, run = COMMANDS[command]
    run(configure(defaults, argv))


if __name__ == "__main__":
    main(sys.argv[1:])
