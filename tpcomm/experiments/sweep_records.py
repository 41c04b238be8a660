"""
What a sweep knows of its runs from their files: a run directory's done.json (train.py finished), the result
file written from it (tpcomm/experiments/results.py), and the git state and machine each result records.
tpcomm/experiments/sweep.py runs the sweeps; this module only reads and writes their files.
"""

import json
import os
import platform
import re
import subprocess

from tpcomm import ROOT
from tpcomm.experiments import results
from tpcomm.experiments.result_check import ResultsError


class SweepError(ValueError):
    """A sweep that must not start (bad overrides, unequal token budgets, missing data): one line, exit 2."""


SCRATCH_DIR = os.path.join("experiments", "scratch")  # --allow-dirty's result files (ignored by git)


def read_done(out_dir):
    """The run's done.json, or None when it is missing or unreadable. The runner writes done.json
    last, atomically, after train.py succeeded; one that is not a JSON object with a non-empty
    'config' object (truncated, edited, from elsewhere) marks no finished run, so the run is redone
    rather than reported from unknown files."""
    try:
        with open(os.path.join(out_dir, "done.json")) as f:
            done = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(done, dict) or not isinstance(done.get("config"), dict) or not done["config"]:
        return None
    return done


def same_config(recorded, cfg):
    """The first key whose value differs (keys that train.py gained or lost since are ignored), or None."""
    return next((k for k, v in cfg.items() if k in recorded and recorded[k] != v), None)


def run_dir_finished(job):
    """train.py finished in the run directory: a valid done.json records this run's config (a changed config
    value makes the run stale)."""
    done = read_done(job.out_dir)
    return done is not None and same_config(done["config"], job.cfg) is None


def check_code_state(record, path):
    """Refuse a scratch result file (written from a dirty tree with --allow-dirty) anywhere but
    experiments/scratch/ (where only its own sweep's tables read it): ResultsError naming it. Called where the
    report loads result files (sweep_records.load_result); a file from a dirty tree written before the sweep
    refused them is read, and flagged by the report as from unnamed code."""
    git = record.get("git")
    scratch = os.path.join(ROOT, SCRATCH_DIR) + os.sep
    if isinstance(git, dict) and git.get("scratch") and not os.path.abspath(path).startswith(scratch):
        raise ResultsError(f"{path}: a scratch result file (written with --allow-dirty from commit "
                           f"{str(git.get('commit'))[:7]} with uncommitted changes): the report reads "
                           f"only result files from clean commits; rerun it from a clean checkout")


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            found = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        if found:
            return found
    return platform.processor() or platform.machine()


def machine_info():
    """What a run's numbers depend on. cpu_capability is the vector-instruction level torch dispatches its CPU
    kernels by ('AVX2', 'AVX512'): two hosts of another level round differently, so their runs differ."""
    import torch

    return dict(cpu_count=os.cpu_count(), torch=torch.__version__, python=platform.python_version(),
                arch=platform.machine(), cpu=cpu_model(),
                cpu_capability=torch.backends.cpu.get_cpu_capability(),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"), cuda=torch.cuda.get_device_name(0)
                if torch.cuda.is_available() else None)


def _check_ignore(path):
    """git check-ignore's exit status for a path (relative to the repository root, or absolute), run in the
    nearest existing folder above it, so a path in another work tree is asked of that tree: 0 ignored, 1 not
    ignored (or tracked), 128 not in a work tree; None when git cannot run."""
    path = os.path.join(ROOT, path)
    here = os.path.dirname(path)
    while not os.path.isdir(here):
        here = os.path.dirname(here)
    try:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=here, capture_output=True,
                              timeout=60).returncode
    except (OSError, subprocess.SubprocessError):
        return None


def committed(path):
    """git would track this result file (not ignored): the sweep writes it only from a clean tree."""
    return _check_ignore(path) == 1


def ignored_by_git(path):
    """git ignores this file, so a commit would leave it out (a clean clone would not have it)."""
    return _check_ignore(path) == 0


class DirtyTreeError(ValueError):
    """A committed result file from a tree with uncommitted changes: refused before
    the run (one line, exit 2)."""


def refuse_dirty(job, git):
    """A committed result file must name the code that wrote it: from a tree with uncommitted changes to
    tracked files (outside experiments/), DirtyTreeError, unless --allow-dirty made it a scratch file."""
    if job.scratch or not (git and git["dirty"]) or not committed(job.result_path):
        return
    raise DirtyTreeError(f"{job.label}: the checkout ({git['commit'][:7]}) has uncommitted changes (git "
                         "status), and " f"{job.result_path} would be committed: commit first, or pass "
                         "--allow-dirty to write " f"scratch files under {SCRATCH_DIR}/ (the report refuses "
                         "them)")


def scratch_mark(job):
    """What a scratch result file's git record adds (check_code_state refuses it outside scratch/)."""
    return dict(scratch=True) if job.scratch else {}


def record_job(job, *, git):
    """Write the job's result file from its finished run directory; returns the record."""
    record = results.run_record(job.out_dir, sweep=job.sweep, run=job.run.name, config=job.cfg, git=git,
                                machine=machine_info())
    results.write_record(record, job.result_path)
    return record


def finished_seeds(dirs, runs):
    """Seeds with a result file or a run directory in the sweep's directories, so the report covers seeds
    added by earlier invocations."""
    names = {r.name for r in runs}
    seeds = set()
    for d in dirs:
        for where, pattern in ((d, r"(.+)-seed(\d+)"), (os.path.join(d, "runs"), r"(.+)-seed(\d+)\.json")):
            for f in os.listdir(where) if os.path.isdir(where) else ():
                m = re.fullmatch(pattern, f)
                if m and m.group(1) in names:
                    seeds.add(int(m.group(2)))
    return seeds


def load_result(job, *, say=print):
    """The job's result record; None when there is none, or a stale one (said so). A corrupt file raises
    ResultsError naming it."""
    if not os.path.exists(job.result_path):
        return None
    record = results.read_record(job.result_path, sweep=job.sweep)
    check_code_state(record, job.result_path)
    key = same_config(record["config"], job.cfg)
    if key is not None:
        say(f"left out {job.label}: {job.result_path} is stale ({key}={record['config'][key]!r}, the sweep "
            "has " f"{job.cfg[key]!r})")
        return None
    return record


def rows_of(jobs, *, say=print):
    """Summarized rows (results.summarize) of the jobs' result files, one per run name,
    and the names without one."""
    groups = {}
    for j in jobs:
        record = load_result(j, say=say)
        groups.setdefault(j.run.name, []).extend([record] if record else [])
    return results.summarize(list(groups.items())), [name for name, recs in groups.items() if not recs]
