"""The machinery behind the top-level scripts: process groups, collectives, sharding, data and
pipeline parallelism, checkpoints, traces, the cost model, sweeps and their results.
docs/layout.md draws the layout."""

import os
import subprocess

# the repository root (scripts, config/, data/)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_state():
    """{"commit": HEAD, "dirty": tracked files changed} of the checkout, or None outside git: the code
    state that result files (the sweeps', gpu_check's) name. Result files are not code: changes under
    experiments/ (a sweep replacing its own result files) and to docs/gpu.json and docs/gpu.md
    (gpu_check's) leave the tree clean."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                 ":(exclude)experiments", ":(exclude)docs/gpu.json", ":(exclude)docs/gpu.md"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode or status.returncode:
        return None
    return dict(commit=head.stdout.strip(), dirty=bool(status.stdout.strip()))
