"""
Sync-Point Drop (arXiv 2502.20727) on a trained checkpoint: per-block sensitivity, distillation, the converted
model (the machinery: tpcomm/sync_point_drop.py).

$ python spd.py --out_dir=out-shakespeare-char --tp_size=4
$ python sample.py --out_dir=out-shakespeare-char/spd       # the converted model
"""

import sys

from tpcomm.sync_point_drop import main

if __name__ == "__main__":
    main(sys.argv[1:])
