"""
The metrics a run writes: JSON lines in out_dir/metrics.jsonl, one record per logged step and per evaluation,
so plots and the sweeps' result files (tpcomm/experiments/results.py) never need wandb.
"""

import json
import os
import time


class MetricsLog:
    """JSON lines in out_dir/metrics.jsonl (one record per logged step and per evaluation), so plots never
    need wandb. Written by the master rank only."""

    def __init__(self, out_dir, *, enabled):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.enabled = enabled
        self.cut = None  # truncate's iteration, applied at the first write

    def write(self, **record):
        if self.enabled:
            if self.cut is not None:
                self._drop_from(self.cut)
                self.cut = None
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def truncate(self, iter_num):
        """Drop the records of iterations >= iter_num (a resumed run writes them again), atomically, when the
        run writes its first record: a resume that fails before it logs anything leaves the file as it was."""
        self.cut = iter_num

    def _drop_from(self, iter_num):
        if not os.path.isfile(self.path):
            return
        with open(self.path) as f:
            lines = f.readlines()
        keep = []
        for line in lines:
            try:
                if json.loads(line)["iter"] >= iter_num:
                    continue
            except (ValueError, KeyError, TypeError):  # a torn last line of a killed run
                continue
            keep.append(line if line.endswith("\n") else line + "\n")
        with open(self.path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(self.path + ".tmp", self.path)


def eta(done, left, start, *, eval_seconds=0.0, evals=0, evals_left=0):
    """Progress for the log line (plain text: a log file gets no progress-bar escape codes): the steps left at
    the mean pace of this process's steps so far, evaluations left out, plus the evaluations left at theirs
    (one long evaluation at step 0 would otherwise weigh on every step's pace)."""
    step_s = max(time.perf_counter() - start - eval_seconds, 0.0) / max(done, 1)
    seconds = round(step_s * left + (eval_seconds / evals if evals else 0.0) * evals_left)
    return f"eta {seconds // 3600}h{seconds // 60 % 60:02d}m{seconds % 60:02d}s"
