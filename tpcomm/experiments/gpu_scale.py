"""
`python experiment.py gpu-scale`: cpu-long's model family at three sizes (0.6M, 3.2M, 15.9M non-embedding
parameters; tpcomm/experiments/sweep_plan.py SCALE_SIZES) in four patterns and 3 seeds, on the Linux C
corpus, trained on one GPU in chunks that each fit a short GPU window. The runs are the sweep machinery's
(sweep.plan, run_one, the result files, the locks); this module adds the time budget, the data unpacking
and the GPU-minute estimate.

$ python experiment.py gpu-scale --dry-run
  # the plan, each run's estimate, GPU-minutes in all
$ python experiment.py gpu-scale --budget-minutes=8
  # the next runs that fit 8 minutes; resumes
$ python experiment.py gpu-scale --budget-minutes=8 --concurrent=2
  # 2 runs at a time on the GPU (unmeasured)
$ python experiment.py gpu-scale --rehearsal --out=DIR --data_dir=D --budget-minutes=1
  # tiny, on CPU

Each finished run writes experiments/gpu-scale/runs/<run>-seed<S>.json at once (the sweeps' schema:
the machine's GPU named, the median step time recorded). A run is started only when its estimate
fits what is left of the budget; a run cut off anyway (the window closed) goes on from its last
checkpoint (one every 250 steps) next time.
"""

import os
import statistics
import subprocess
import sys
import time

from tpcomm.errors import ConfigError
from tpcomm import ROOT
from tpcomm.costmodel.cost_bands import GPU_JSON
from tpcomm.experiments import results
from tpcomm.experiments import sweep as sweeps
from tpcomm.experiments import sweep_records
from tpcomm.experiments.sweep_args import parse_seeds
from tpcomm.experiments.sweep_records import SweepError
from tpcomm.train.output_path import check_makeable
from tpcomm.experiments.result_check import ResultsError
from tpcomm.experiments.sweep_plan import REHEARSAL_SIZES, SCALE_SEEDS, SCALE_SIZES, scale_runs

NAME = "gpu-scale"
OPTIONS = ("dry-run", "budget-minutes", "concurrent", "seeds", "out", "rehearsal", "slot")
# The estimate before a size has a finished run (then its measured wall time replaces it). Assumed, not
# measured:
STARTUP_S = 15.0  # per run: python, torch and CUDA start-up, the data check
# inductor's compile grows with the graph: gpu-check's GPT-2 section (12 layers, eager and
COMPILE_S_PER_LAYER = 3.0
# compiled timings and the compile) took 32 s in all, ~2.7 s a layer; the simulated model's graph is larger
# per layer per step: small models are kernel-launch bound (~25 kernels x ~10 us per layer)
LAYER_FLOOR_S = 2.5e-4
# Measured (docs/gpu.json, `make gpu-check` on one H100): GPT-2 124M's compiled bf16 tokens/s, so 6 x params x
# that FLOP/s, and simulated tp 8's step over GPT's per block type (eager): the rate a pattern gets here.
REHEARSAL = ("--device=cpu", "--dtype=float32", "--compile=False", "--max_iters=4", "--lr_decay_iters=4",
             "--warmup_iters=1", "--eval_interval=2", "--eval_iters=2", "--log_interval=1")


def parse(argv):
    """(options, train.py overrides); SweepError (one line, exit 2) on a bad one."""
    opts, overrides = {}, []
    for arg in argv:
        key = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if key in OPTIONS:
            opts[key] = arg.split("=", 1)[1] if "=" in arg else True
        elif key is not None and "=" in arg:
            overrides.append(arg)
        else:
            raise SweepError(f"gpu-scale: argument {arg!r}: options are "
                                    f"{', '.join('--' + o for o in OPTIONS)}; train.py overrides look "
                                    "like --key=value")
    for key, low in (("budget-minutes", 0.0), ("concurrent", 1), ("slot", 0)):
        if key in opts:
            kind, raw = float if key == "budget-minutes" else int, opts[key]
            try:
                opts[key] = None if raw is True else kind(raw)  # `--budget-minutes` alone: no number given
            except (TypeError, ValueError):
                opts[key] = None
            if opts[key] is None or not low <= opts[key] < float("inf"):
                raise SweepError(f"gpu-scale: --{key} takes a number >= {low}"
                                 f"{'' if kind is float else ' (an integer)'}, got {raw!r}")
    if "out" in opts and (opts["out"] is True or not opts["out"]):
        raise SweepError("gpu-scale: --out takes a directory: --out=DIR")
    if "out" in opts:  # a file, or a folder that cannot be made: refused before planning, as in sweeps
        check_makeable(opts["out"], key="gpu-scale: --out")
    if "seeds" in opts:
        opts["seeds"] = parse_seeds(opts["seeds"])
    if not opts.get("dry-run") and "budget-minutes" not in opts:
        raise SweepError("gpu-scale: give --budget-minutes=N (the chunk to run) or --dry-run (the plan)")
    return opts, overrides


def plan_jobs(opts, overrides):
    rehearsal = bool(opts.get("rehearsal"))
    overrides = [*REHEARSAL, *overrides] if rehearsal else overrides
    sweep_dir = opts.get("out") or sweeps.sweep_dir_for(NAME, overrides)
    runs = scale_runs(REHEARSAL_SIZES if rehearsal else SCALE_SIZES)
    return sweeps.plan(runs, sweep_dir=sweep_dir, seeds=opts.get("seeds") or list(SCALE_SEEDS),
                       overrides=overrides, nproc=1, check_data=False, sweep=NAME), sweep_dir


def ensure_data(jobs, *, say=print):
    """Each data directory's train.bin and val.bin, unpacked from its compact form (linux-char.tar.xz) when
    they are missing; SweepError naming the directory when neither is there."""
    from data import linux_corpus

    for data_dir in sorted({j.cfg["data_dir"] or os.path.join(ROOT, "data", j.cfg["dataset"]) for j in jobs}):
        if all(os.path.isfile(os.path.join(data_dir, f"{s}.bin")) for s in ("train", "val")):
            continue
        compact = os.path.join(data_dir, linux_corpus.COMPACT)
        if not os.path.isfile(compact):
            raise SweepError(f"gpu-scale: {data_dir} has no train.bin/val.bin and no "
                                    f"{linux_corpus.COMPACT} to unpack (make it: python "
                                    "data/linux/prepare.py --compact; docs/data.md)")
        try:
            linux_corpus.unpack(compact, data_dir, say=say)
        except (ValueError, OSError, KeyError) as e:
            raise SweepError(f"gpu-scale: cannot unpack {compact}: {e}") from None


def gpu_rates(path=GPU_JSON):
    """(FLOP/s of GPT-2's compiled step, {block type: step over GPT's}) from gpu-check's raw numbers."""
    import json

    with open(path) as f:
        sections = json.load(f)["sections"]
    train = sections["gpt_train"]
    return 6 * train["params"] * train["compiled"]["tokens_per_s"], dict(sections["sim_tp8"]["ratio_to_gpt"],
                                                                         gpt=1.0)


def assumed_seconds(job, rates):
    """Start-up (and compile) plus steps x the larger of the compute time (6 x params x tokens at GPT-2's
    measured rate, times the block type's measured simulation cost) and the launch floor."""
    flops, ratio = rates
    cfg = job.cfg
    total, _ = results.count_params(cfg, 97)
    compute = 6 * total * results.tokens_per_iter(cfg) / flops * ratio.get(kind_of(cfg), max(ratio.values()))
    start = STARTUP_S + (COMPILE_S_PER_LAYER * cfg["n_layer"] if cfg["compile"] else 0.0)
    return start + cfg["max_iters"] * max(compute, LAYER_FLOOR_S * cfg["n_layer"])


def kind_of(cfg):
    return "gpt" if cfg["model_type"] == "gpt" else cfg["block_types"][0]


def measured_seconds(jobs):
    """{run name: median wall s} and {model size: [(block type, wall s), ...]} of the finished runs."""
    by_run, by_size = {}, {}
    for j in jobs:
        rec = sweep_records.load_result(j, say=lambda *_: None) if os.path.exists(j.result_path) else None
        wall = rec and rec["timing"].get("wall_s")
        if wall:
            by_run.setdefault(j.run.name, []).append(wall)
            by_size.setdefault(sweeps.model_size(j.cfg), []).append((kind_of(j.cfg), wall))
    return {k: statistics.median(v) for k, v in by_run.items()}, by_size


def estimate(job, measured, rates):
    """(seconds, where from): the run's own measured wall time; else its size's, each finished run's wall time
    scaled by the block types' measured simulation costs (the largest of those); else the assumption."""
    by_run, by_size = measured
    if job.run.name in by_run:
        return by_run[job.run.name], "measured"
    ratio = rates[1]
    if sweeps.model_size(job.cfg) in by_size:
        mine = ratio.get(kind_of(job.cfg), max(ratio.values()))
        return max(wall * mine / ratio.get(kind, 1.0) for kind,
                   wall in by_size[sweeps.model_size(job.cfg)]), \
            "measured, size"
    return assumed_seconds(job, rates), "assumed"


def next_chunk(jobs, budget_s, rates, measured):
    """The unfinished runs, in order, up to the first whose estimate no longer fits the budget (a contiguous
    chunk, so the sweep fills in seed by seed, size by size); [(job, seconds, where from)]."""
    chunk, left = [], budget_s
    for j in jobs:
        if sweeps.is_finished(j):
            continue
        sec, where = estimate(j, measured, rates)
        if sec > left:
            break
        chunk.append((j, sec, where))
        left -= sec
    return chunk


def dry_run(jobs, sweep_dir, budget_s=None):
    rates, measured = gpu_rates(), measured_seconds(jobs)
    todo = [j for j in jobs if not sweeps.is_finished(j)]
    print(f"gpu-scale: {len(jobs)} runs ({len(jobs) - len(todo)} finished) in {sweep_dir}")
    total = 0.0
    for j in jobs:
        done = sweeps.is_finished(j)
        sec, where = estimate(j, measured, rates)
        total += 0 if done else sec
        print(f"{'skip' if done else 'run '}  {j.label:<28} {sec / 60:5.1f} min ({where}), "
              f"{sweeps.tokens_of(j.cfg):,} tokens")
    print(f"GPU-minutes still to run: {total / 60:.0f} ({len(todo)} runs). Assumed until measured: "
          f"{STARTUP_S:.0f} s start-up per run and {COMPILE_S_PER_LAYER:.0f} s of compile per layer; "
          f"GPT-2's compiled rate on the H100 ({rates[0] / 1e12:.0f} TFLOP/s at 6 x params per token) "
          "times the block type's simulated step over GPT's at tp 8 "
          "(" f"{', '.join(f'{k} {v:.2f}x' for k, v in rates[1].items() if k != 'gpt')}); at least "
          f"{LAYER_FLOOR_S * 1e3:.2f} ms per layer per step (launch-bound)")
    if budget_s is not None:
        chunk = next_chunk(jobs, budget_s, rates, measured)
        print(f"next chunk of {budget_s / 60:g} min: {len(chunk)} run(s), "
              f"~{sum(c[1] for c in chunk) / 60:.1f} min: "
              f"{', '.join(j.label for j, _, _ in chunk) or 'none fits'}")


def run_chunk(jobs, budget_s, *, say=print):
    """Train the next chunk (next_chunk, planned from the estimates at the start); a run whose estimate no
    longer fits what is left of the budget (an earlier one ran long) is not started. Returns the number
    trained. A run another process holds (--concurrent) is left to it."""
    import signal

    signal.signal(signal.SIGTERM, sweeps.stop_on_sigterm)
    t0, trained = time.time(), 0
    chunk = next_chunk(jobs, budget_s, gpu_rates(), measured_seconds(jobs))
    say(f"gpu-scale: next chunk of {budget_s / 60:g} min: {len(chunk)} run(s)")
    for k, (job, sec, where) in enumerate(chunk, 1):
        left = budget_s - (time.time() - t0)
        if sec > left:
            say(f"stop: {job.label} needs ~{sec / 60:.1f} min ({where}), {max(left, 0) / 60:.1f} min of the "
                "budget left")
            break
        lock = sweeps.job_lock(job)
        if not lock.acquire():
            say(f"busy {job.label}: another gpu-scale process is training it")
            continue
        try:
            problem = sweeps.result_problem(job)
            if problem is not None:
                sweeps.run_one(job, f"[{k}/{len(chunk)}] ", problem, bar=None, tty=False, say=say)
                trained += 1
        finally:
            lock.release()
    return trained


def concurrent(argv, k, sweep_dir):
    """k copies of this command at once (--slot=i), each with its own GPU-lock directory (TMPDIR), so their
    runs share the one GPU; the job locks share the runs out. Returns the worst exit status."""
    procs = []
    for i in range(k):
        tmp = os.path.join(sweep_dir, f".slot{i}")  # ignored by git, as the run directories
        os.makedirs(tmp, exist_ok=True)
        cmd = [sys.executable, os.path.join(ROOT, "experiment.py"), NAME,
               *[a for a in argv if not a.startswith("--concurrent")], f"--slot={i}"]
        procs.append(subprocess.Popen(cmd, env=dict(os.environ, TMPDIR=tmp)))
        time.sleep(2)  # the first takes the first run's lock before the next looks
    return max(p.wait() for p in procs)


def check_device(jobs):
    """The sweep's runs pick CUDA (device 'auto'); without a GPU they would run for days on the estimates of
    minutes: refused (the rehearsal, or an explicit --device=..., is the user's choice)."""
    import torch

    if any(j.cfg["device"] == "auto" for j in jobs) and not torch.cuda.is_available():
        raise SweepError("gpu-scale: no CUDA GPU here (its runs and estimates are a GPU's); on CPU "
                                "run --rehearsal, or --dry-run for the plan")


def main(argv):
    opts, overrides = parse(argv)
    jobs, sweep_dir = plan_jobs(opts, overrides)
    budget_s = opts["budget-minutes"] * 60 if "budget-minutes" in opts else None
    if opts.get("dry-run"):
        dry_run(jobs, sweep_dir, budget_s)
        return 0
    check_device(jobs)
    if opts.get("concurrent", 1) > 1 and "slot" not in opts:
        ensure_data([j for j in jobs if not sweeps.is_finished(j)])
        return concurrent(argv, opts["concurrent"], sweep_dir)
    ensure_data([j for j in jobs if not sweeps.is_finished(j)])
    sweeps.check_data_files([j for j in jobs if not sweeps.is_finished(j)])
    t0 = time.time()
    try:
        trained = run_chunk(jobs, budget_s)
    except RuntimeError as e:  # a run failed: its log's tail
        print(f"error: {e}", file=sys.stderr)
        return 1
    left = sum(not sweeps.is_finished(j) for j in jobs)
    print(f"gpu-scale: trained {trained} run(s) in {time.time() - t0:.0f} s; {left} of {len(jobs)} still to "
          "run" + (" (same command again)" if left else " (the sweep is complete)") + f"; result files in "
          f"{os.path.join(sweep_dir, 'runs')}")
    return 0


def cli(argv):
    """main with user errors as one line, exit status 2."""
    try:
        status = main(argv)
    except (SweepError, ConfigError, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept; the same command continues", file=sys.stderr)
        sys.exit(130)
    sys.exit(status)
