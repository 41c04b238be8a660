"""
The communication cost model: fit, validate, predict GPU step and decode times (the machinery:
tpcomm/cost_model.py).

$ python comm_model.py predict                                   # the GPU table from named constants
$ python comm_model.py measure --out=calibration.json            # calibrate on this machine (real TP, gloo)
$ python comm_model.py validate --calibration=calibration.json   # leave-one-pattern-out errors
"""

import sys

from tpcomm.cost_model import main

if __name__ == "__main__":
    main(sys.argv[1:])
