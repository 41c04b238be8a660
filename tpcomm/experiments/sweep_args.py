"""
experiment.py's command line: the sweep's name, the runner's options and train.py's overrides, each checked
before anything is planned (a bad one: SweepError, one line, exit 2).
"""

import re

from tpcomm.configuration import parse_flag
from tpcomm.train.output_path import check_makeable
from tpcomm.experiments.sweep_plan import SWEEPS
from tpcomm.experiments.sweep_records import SweepError

RUNNER_OPTIONS = ("seeds", "nproc", "jobs", "out", "report-only", "dry-run", "counts", "check", "allow-dirty",
                  "runs")
# sweeps experiment.py hands to a runner of their own (tpcomm/experiments/gpu_node.py)
OWN_RUNNERS = ("gpu-node",)
RUNNER_FLAGS = ("report-only", "dry-run", "counts", "allow-dirty")  # --flag, --flag=True or --flag=False


def parse_args(argv):
    """Split argv into (sweep name, runner options, train.py overrides); `report [SWEEP ...] [--check]` gives
    ('report', {'sweeps': [...], 'check': bool}, [])."""
    if argv and argv[0] == "report":
        return parse_report_args(argv[1:])
    sweep, opts, overrides = None, {}, []
    for arg in argv:
        key = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if key is None:
            if sweep is not None:
                raise SweepError(f"one sweep at a time, got {sweep!r} and {arg!r}")
            sweep = arg
        elif key in RUNNER_FLAGS:
            opts[key] = parse_flag(arg)
        elif key in RUNNER_OPTIONS and key != "check":
            opts[key] = arg.split("=", 1)[1] if "=" in arg else True
        elif "=" in arg:
            overrides.append(arg)
        else:
            raise SweepError(f"argument {arg!r}: runner options are "
                             f"{', '.join('--' + o for o in RUNNER_OPTIONS if o != 'check')}; "
                             f"train.py overrides look like --key=value")
    if sweep not in SWEEPS:
        raise SweepError(f"sweep must be one of {sorted([*SWEEPS, *OWN_RUNNERS])} (or report), got {sweep!r}")
    opts["seeds"] = parse_seeds(opts["seeds"]) if "seeds" in opts else None
    opts.setdefault("nproc", None)
    for key in ("nproc", "jobs"):
        if opts.get(key) is not None:
            given = "nothing" if opts[key] is True else repr(opts[key])  # `--jobs` alone: no number
            try:
                opts[key] = int(opts[key] if opts[key] is not True else "")
            except (TypeError, ValueError):
                raise SweepError(f"--{key} takes an integer >= 1, got {given}") from None
            if opts[key] < 1:
                raise SweepError(f"--{key} must be >= 1, got {opts[key]}")
    if "out" in opts and (opts["out"] is True or not opts["out"]):
        raise SweepError("--out takes a directory: --out=DIR")
    if "out" in opts:  # a file, or a folder that cannot be made (/proc/x): refused before any planning
        check_makeable(opts["out"], key="--out")
    if "seed" in {o[2:].split("=", 1)[0] for o in overrides}:
        raise SweepError("use --seeds=S1,S2 (the runner's option) rather than --seed")
    return sweep, opts, overrides


def parse_report_args(argv):
    sweeps, check = [], False
    for arg in argv:
        if arg.split("=", 1)[0] == "--check":
            check = parse_flag(arg)
        elif arg.startswith("-"):
            raise SweepError(f"argument {arg!r}: report takes sweep names and --check")
        elif arg not in SWEEPS:
            raise SweepError(f"report: sweep must be one of {sorted(SWEEPS)}, got {arg!r}")
        else:
            sweeps.append(arg)
    return "report", dict(sweeps=sweeps, check=check), []


def parse_seeds(text):
    """--seeds=S1,S2: distinct integers >= 0."""
    seeds = [int(x) for x in str(text).split(",") if re.fullmatch(r"\d+", x)] if text is not True else []
    if not seeds or len(seeds) != len(str(text).split(",")) or len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds takes distinct integers >= 0 separated by commas (--seeds=1337,1338), "
                         f"got {'nothing' if text is True else repr(text)}")
    return seeds
