"""
The communication cost model: fit, validate, predict GPU step and decode times (the machinery:
tpcomm/cost_model.py).

$ python comm_model.py predict                                   # published-figure checks, then the GPU tables
$ python comm_model.py --tp_overlap=4 --efficiency=0.8           # other overlap assumptions
$ python comm_model.py measure --out=calibration.json            # calibrate on this machine (real TP, gloo)
$ python comm_model.py validate --calibration=calibration.json   # leave-one-pattern-out errors
"""

import sys

from tpcomm.cost_model import main

if __name__ == "__main__":
    main(sys.argv[1:])
