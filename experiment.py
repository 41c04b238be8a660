"""
The communication sweep, this repository's main experiment (the machinery: tpcomm/sweep.py, tpcomm/results.py).

$ python experiment.py cpu                          # Shakespeare-char, one run per communication budget
$ python experiment.py cpu --seeds=1337,1338,1339   # more seeds (finished runs are skipped)
$ python experiment.py cpu --report-only            # tables and plots again from the finished runs
$ python experiment.py gpt2 --nproc=8               # GPT-2 124M on OpenWebText (GPUs)
"""

import sys

from tpcomm.sweep import cli

if __name__ == "__main__":
    cli(sys.argv[1:])
