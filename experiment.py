"""
The communication sweep, this repository's main experiment (the machinery: tpcomm/experiments/sweep.py,
results.py, plots.py, report.py).

$ python experiment.py cpu                          # Shakespeare-char, one run per communication budget
$ python experiment.py cpu --seeds=1337,1338,1339   # more seeds (finished runs are skipped)
$ python experiment.py cpu --jobs=2                 # two runs at a time, one thread each (make experiment)
$ python experiment.py cpu --report-only            # tables and plots again from the result files
$ python experiment.py cpu-long                     # the axes (docs/axes.md), convergence among them
$ python experiment.py gpt2 --nproc=8               # GPT-2 124M on OpenWebText (GPUs)
$ python experiment.py gpu-node                     # real TP on one 8-GPU node: every way to give up a sync
$ python experiment.py gpu-scale --budget-minutes=8 # the next chunk of the 3-size sweep on one GPU
$ python experiment.py report                       # README/docs tables and plots from the result files
$ python experiment.py report --check               # exit 1, one line per mismatch, when they are stale
"""

import sys

from tpcomm.experiments.report.report import main as report_main
from tpcomm.experiments.sweep import cli

if __name__ == "__main__":
    if sys.argv[1:2] == ["gpu-node"]:  # its own runner: tpcomm/experiments/gpu_node.py
        from tpcomm.experiments.gpu_node import cli as gpu_node_cli

        gpu_node_cli(sys.argv[2:])
    # the sweep machinery plus a time budget: tpcomm/experiments/gpu_scale.py
    elif sys.argv[1:2] == ["gpu-scale"]:
        from tpcomm.experiments.gpu_scale import cli as gpu_scale_cli

        gpu_scale_cli(sys.argv[2:])
    else:
        cli(sys.argv[1:], report_main=report_main)
