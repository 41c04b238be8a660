"""The machinery behind the top-level scripts: process groups, collectives, sharding, data and pipeline parallelism,
checkpoints, traces, the cost model, sweeps and their results. docs/layout.md draws the layout."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root (scripts, config/, data/)
