"""
The cost model measured on this machine: a gloo all-reduce microbenchmark and bench.py under real tensor
parallelism (`python comm_model.py measure`), then the model's predictions of each block pattern's step time
checked against them, leave one pattern out (`python comm_model.py validate`). The equations are
tpcomm/costmodel/cost_model.py's.
"""

import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure

from tpcomm import ROOT
from tpcomm.costmodel.cost_model import allreduce_time, error, overlapped_syncs
from tpcomm.costmodel.fitting import fit_allreduce, fit_line, fit_step, leave_one_out
from tpcomm.train.output_path import check_output_file, json_with, replace_atomically

# ---------- python comm_model.py measure: this machine ----------

MEASURE_DEFAULTS = {
    "out": None,  # the calibration JSON to write
    "procs": 2,  # gloo processes: the microbenchmark's ranks and bench.py's tp_size
    "sizes": None,  # all-reduce sizes in bytes; None: 1 KiB .. 64 MiB in powers of 4
    "reps": 10,  # timed all-reduces per size (median taken)
    "iters": 30,  # bench.py --iters (timed steps per pattern, over 3 interleaved rounds)
    "warmup": 5,  # bench.py --warmup (untimed steps per pattern and round)
    "patterns": None,  # bench.py --patterns; None: the 12-layer patterns of the CPU sweep (experiment.py cpu)
    # the model bench.py times: README's real-TP command
    "n_layer": 12, "n_head": 8, "n_embd": 128, "block_size": 64, "batch_size": 12, "vocab_size": 65,
}


class MeasureError(RuntimeError):
    """A measurement that failed (a benchmark process died, bench.py printed no
    row): one line, exit status 1."""


BENCH_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "vocab_size", "iters", "warmup")


def measure(cfg):
    from tpcomm.bench import bench_config
    from tpcomm.model.options import validate_tp_args

    out = cfg["out"]
    if not isinstance(out, str) or not out:
        raise ConfigError(f"out must be the calibration file to write (--out=FILE.json), got {out!r}")
    # an earlier calibration: replaced
    check_output_file(out, key="out", own=json_with("format", "microbenchmark"))
    for key, least in (("procs", 2), ("reps", 1)):
        if type(cfg[key]) is not int or cfg[key] < least:
            raise ConfigError(f"{key} must be an int >= {least}, got {cfg[key]!r}")
    # before minutes of measuring
    bench_config.validate(dict(bench_config.defaults(), **{k: cfg[k] for k in BENCH_KEYS}))
    sizes = cfg["sizes"] if cfg["sizes"] is not None else [1024 * 4 ** k for k in range(9)]
    if not isinstance(sizes, list) or not sizes or any(type(n) is not int or n < 4 or n % 4 for n in sizes):
        raise ConfigError(f"sizes must be a non-empty list of byte counts, multiples of 4 (float32), got "
                          f"{sizes!r}")
    patterns = cfg["patterns"] if cfg["patterns"] is not None else cpu_sweep_patterns()
    if not isinstance(patterns, list) or not patterns:
        raise ConfigError(f"patterns must be a non-empty list of block_types values, got {patterns!r}")
    for i, p in enumerate(patterns):
        try:
            validate_tp_args(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                             tp_size=cfg["procs"], block_types=p)
        except ConfigError as e:
            raise ConfigError(f"patterns[{i}] = {shown(p)}: {e}") from None
    record = {"format": "comm_model calibration 1", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "argv": sys.argv, "machine": machine()}
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores: other work on the machine "
          "inflates every time below")
    print(f"all-reduce microbenchmark: gloo, {cfg['procs']} processes, float32, {len(sizes)} sizes x "
          f"{cfg['reps']} repetitions")
    samples = microbenchmark(procs=cfg["procs"], sizes=sizes, reps=cfg["reps"])
    for s in samples:
        print(f"  {s['bytes']:>10,} B  {s['seconds'] * 1e3:9.3f} ms")
    fit = {"method": "least squares of the relative error of t = alpha + 2(p-1)/p * n / B"}
    try:
        fit["alpha_s"], fit["bus_bw_Bps"] = fit_allreduce([(s["bytes"], s["seconds"]) for s in samples],
                                                          cfg["procs"])
        print(f"  fit: alpha = {fit['alpha_s'] * 1e6:.1f} us, B = {fit['bus_bw_Bps'] / 1e9:.3f} GB/s")
    # noise swamped the sizes: keep the samples (and go on), validate will refuse them
    except ValueError as e:
        fit["error"] = str(e)
        print(f"  fit failed: {e}; add larger --sizes")
    record["microbenchmark"] = {"backend": "gloo", "procs": cfg["procs"], "dtype": "float32",
                                "reps": cfg["reps"], "threads_per_process": 1, "statistic": "median over "
                                "repetitions of the slowest rank's time; each repetition starts after a "
                                "barrier", "samples": samples, "loadavg_after": loadavg(), "fit": fit}
    record["training"] = training(cfg, patterns)
    record["machine"]["loadavg_after"] = loadavg()
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
    replace_atomically(write, out)
    print(f"wrote {out}; next: python comm_model.py validate --calibration={out}")


def shown(pattern):
    """A block_types value as a short expression that configure() reads back: 'spd', ['parallel','spd']*6."""
    from tpcomm.model.options import compact_list

    return repr(pattern) if isinstance(pattern, str) else compact_list(pattern)


def cpu_sweep_patterns():
    """The block_types of the CPU sweep's budget configs (experiment.py's 'cpu' runs, 24 down to 1 forward
    syncs; not its delayed or compressed variants of them)."""
    from tpcomm.experiments.sweep_plan import SWEEPS
    from tpcomm.train.train_config import defaults

    return [configure(defaults(), [os.path.join(ROOT, run.config)])["block_types"] for run in SWEEPS["cpu"]
            if not run.overrides]


def machine():
    """What the timings depend on: CPU, cores, torch, and the load on the machine when they started."""
    import torch

    from tpcomm.experiments.sweep_records import cpu_model
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "loadavg_before": loadavg()}


def loadavg():
    """The machine's load average over 1, 5 and 15 minutes: other work there slows every timing."""
    return [round(x, 2) for x in os.getloadavg()]


def microbenchmark(*, procs, sizes, reps):
    """[{bytes, seconds, all_seconds}]: gloo all-reduces of each size among `procs` spawned processes."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "samples.json")
        try:
            mp.spawn(_allreduce_worker, args=(procs, sizes, reps, os.path.join(d, "store"), out),
                     nprocs=procs)
        except ProcessException as e:  # a worker raised or died: its traceback's last line
            raise MeasureError(f"all-reduce microbenchmark failed: "
                               f"{str(e).strip().splitlines()[-1]}") from None
        with open(out) as f:
            return json.load(f)


def _allreduce_worker(rank, procs, sizes, reps, store, out):
    import torch
    import torch.distributed as dist
    from tqdm import tqdm

    torch.set_num_threads(1)  # as bench.py under OMP_NUM_THREADS=1
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=procs)
    try:
        samples = []
        for n in tqdm(sizes, desc="all-reduce sizes", disable=rank != 0):
            x = torch.zeros(n // 4)  # float32, n bytes; zeros stay zeros however often they are summed
            for _ in range(2):  # warm-up: gloo's buffers for this size
                dist.all_reduce(x)
            times = torch.zeros(reps, dtype=torch.float64)
            for r in range(reps):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(x)
                times[r] = time.perf_counter() - start
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a repetition lasts until its slowest rank is done
            samples.append({"bytes": n, "seconds": statistics.median(times.tolist()),
                            "all_seconds": times.tolist()})
        if rank == 0:
            with open(out, "w") as f:
                json.dump(samples, f)
    finally:
        dist.destroy_process_group()


def training(cfg, patterns):
    """bench.py under torchrun with real TP over cfg['procs'] gloo processes, all patterns interleaved in one
    run; its printed rows parsed into step ms, collectives ms and the measured all-reduce counts and sizes."""
    from tpcomm.bench.bench_config import pattern_label

    listed = "[" + ", ".join(shown(p) for p in patterns) + "]"
    args = ["bench.py", "--model_type=distributed_gpt", f"--tp_size={cfg['procs']}", "--tp_mode=real",
            "--device=cpu", "--dtype=float32", *(f"--{k}={cfg[k]}" for k in BENCH_KEYS),
            f"--patterns={listed}"]
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg['procs']}"]
    command = "OMP_NUM_THREADS=1 torchrun " + " ".join(launch[2:] + args[:-1]) + f' --patterns="{listed}"'
    print(f"in-training: {command}")
    r = subprocess.run([sys.executable, *launch, *args], check=False, cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(r.stdout, end="")
    if r.returncode:
        last = next((line for line in reversed(r.stderr.splitlines()) if line.strip()), "")
        raise MeasureError(f"bench.py under torchrun failed (exit {r.returncode}): {last.strip()}")
    row = re.compile(r"^(?P<name>.+?)\s+(?P<ms>[\d.]+) ms/iter .* all-reduces fwd (?P<fwd>\d+) bwd "
                     r"(?P<bwd>\d+)\s+(?P<bpt>[\d.]+) B/token\s+collectives (?P<coll>[\d.]+) ms/iter")
    found = {m["name"]: m for m in map(row.match, r.stdout.splitlines()) if m}
    tokens = cfg["batch_size"] * cfg["block_size"]
    rows = []
    for p in patterns:
        m = found.get(pattern_label(p))
        if m is None:
            raise MeasureError(f"bench.py printed no timing row for pattern {pattern_label(p)}")
        fwd, bwd = int(m["fwd"]), int(m["bwd"])
        rows.append({"pattern": p, "name": pattern_label(p), "fwd_allreduces": fwd, "bwd_allreduces": bwd,
                     "allreduces_per_step": fwd + bwd, "bytes_per_token": float(m["bpt"]),
                     "bytes_per_allreduce": round(float(m["bpt"]) * tokens / (fwd + bwd)),
                     "step_ms": float(m["ms"]), "collectives_ms": float(m["coll"])})
    model = {k: cfg[k] for k in BENCH_KEYS[:-2]}
    return {"command": command, "procs": cfg["procs"], "model": dict(model, tokens_per_iter=tokens,
                                                                     dtype="float32"), "iters": cfg["iters"],
            "warmup": cfg["warmup"], "statistic": "bench.py: best of 3 interleaved rounds of iters/3 steps; "
            "collectives include the per-step all-reduce of the block-replicated gradients and waiting "
            "for the other rank", "patterns": rows, "bench_output": r.stdout}


# ---------- python comm_model.py validate: measured against predicted ----------

VALIDATE_DEFAULTS = {"calibration": None}  # the JSON `measure` wrote


def validate(cfg):
    """The validation table of a calibration file: per pattern, measured ms/iter
    against predictors (i) and (ii)."""
    data, path = load_calibration(cfg["calibration"])
    micro, train = data["microbenchmark"], data["training"]
    m = train["model"]
    rows, summary = validation(micro["samples"], train["patterns"], procs=micro["procs"],
                               n_layer=m["n_layer"])
    print(f"calibration {path}: {data.get('created', '?')}, {data['machine'].get('cpu', '?')}, "
          f"load average (1, 5, 15 min) before {data['machine'].get('loadavg_before', '?')}, after "
          f"{data['machine'].get('loadavg_after', '?')}")
    print(f"microbenchmark: gloo, {micro['procs']} processes, {len(micro['samples'])} sizes: alpha = "
          f"{summary['alpha'] * 1e6:.1f} us, B = {summary['busbw'] / 1e9:.3f} GB/s; t(n = "
          f"{summary['nbytes']:,} B, p = {micro['procs']}) = {summary['t_micro'] * 1e3:.3f} ms")
    print(f"training: bench.py, real TP over {train['procs']} processes, {m['n_layer']} x {m['n_embd']}, "
          f"{m['tokens_per_iter']} tokens/iter, {train['iters']} iters\n")
    print("| pattern | all-reduces / step | of them overlapped | measured ms/iter | in collectives ms/iter "
          "| (i) microbenchmark ms/iter | (i) error | (ii) in-training, leave-one-out ms/iter | (ii) error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ii = "n/a" if r["loo_ms"] is None else f"{r['loo_ms']:.1f}"
        print(f"| `{r['name']}` | {r['n']} | {r['overlapped']} | {r['step_ms']:.1f} | "
              f"{r['collectives_ms']:.1f} | {r['micro_ms']:.1f} | "
              f"{'anchor' if r['anchor'] else pct(r['micro_err'])} | {ii} | {pct(r['loo_err'])} |")
    print(f"\n(i) microbenchmark alpha, B: ms/iter = compute + N x t(n, p), compute = the measured ms/iter "
          "of " f"`{summary['anchor']}` (fewest all-reduces) minus its own {summary['anchor_n']} modelled "
          "all-reduces = " f"{summary['compute_ms']:.1f} ms (so the per-step gradient sync and all "
          "pattern-independent work are in " f"it). That row is the anchor, exact by construction. Mean "
          "|error| of the others: " f"{pct(summary['micro_mae'], sign=False)}.")
    print(f"(ii) in-training: ms/iter = C + N x t_eff - N_ovl x h (N_ovl: forward all-reduces overlapped by "
          f"'ladder', h: the time each hides; h = 0 when no fitted pattern overlaps), least squares on "
          "every pattern " f"but the predicted one (leave-one-pattern-out). Mean |error|: "
          f"{pct(summary['loo_mae'], sign=False)}. On all patterns: C = "
          "" + (f"{summary['C_ms']:.1f} ms, t_eff = {summary['t_eff_ms']:.3f} ms per "
                "all-reduce." if summary["t_eff_ms"] is not None else "n/a (fewer than two distinct "
                "all-reduce counts)."))
    if summary["hidden_ms"] is not None:
        print(f"Overlap: h = {summary['hidden_ms']:.3f} ms hidden per overlapped all-reduce, "
              f"{summary['hidden_ms'] / summary['t_eff_ms']:.0%} of t_eff (100% would be fully hidden, 0 "
              "nothing). " f"Without the overlap term (h = 0, a line in N): leave-one-out mean |error| "
              f"{pct(summary['loo_line_mae'], sign=False)}.")
    if summary["t_eff_ms"] is not None:
        print(f"Contention factor t_eff / t(n, p) = {summary['t_eff_ms'] / (summary['t_micro'] * 1e3):.2f}: "
              "an " f"all-reduce costs the training step that many microbenchmark all-reduces. The slope of "
              "the measured " f"collectives ms/iter on N is {summary['t_coll_ms']:.3f} ms "
              f"({summary['t_coll_ms'] / (summary['t_micro'] * 1e3):.2f} x the microbenchmark).")
    print("GPU predictions (python comm_model.py) use (i)'s form, compute + N x t(n, p), with t from the "
          "published NVLink / InfiniBand constants; no contention factor is applied.")


def pct(x, *, sign=True):
    return "n/a" if x is None else (f"{x:+.1f}%" if sign else f"{x:.1f}%")


def row_overlapped(row, n_layer):
    """A calibration row's overlapped forward all-reduces per step (overlapped_syncs of its pattern; a pattern
    given as one block type is that type in all n_layer layers); 0 for a row that names no pattern."""
    pattern = row.get("pattern")
    if pattern is None:
        return 0
    return overlapped_syncs([pattern] * n_layer if isinstance(pattern, str) else pattern)


def validation(samples, patterns, *, procs, n_layer=1):
    """Per pattern: measured ms/iter, predictor (i) (microbenchmark t(n, p) + compute from the fewest-syncs
    pattern, nothing hidden) and predictor (ii) (leave-one-pattern-out fit of ms/iter = C + N t_eff - N_ovl h,
    N_ovl the overlapped all-reduces, h the time each hides), with signed errors in %."""
    alpha, busbw = fit_allreduce([(s["bytes"], s["seconds"]) for s in samples], procs)
    t_ms = [allreduce_time(p["bytes_per_allreduce"], procs, alpha=alpha, busbw=busbw) * 1e3 for p in patterns]
    ns = [p["allreduces_per_step"] for p in patterns]
    steps = [p["step_ms"] for p in patterns]
    a = min(range(len(patterns)), key=lambda i: ns[i])
    compute = steps[a] - ns[a] * t_ms[a]
    ovl = [row_overlapped(p, n_layer) for p in patterns]
    loo = leave_one_out(ns, steps, zs=ovl)
    # h = 0 always
    line = [abs(error(y, m)) for y, m in zip(leave_one_out(ns, steps), steps) if y is not None]
    rows = []
    for i, p in enumerate(patterns):
        micro = compute + ns[i] * t_ms[i]
        rows.append({"name": p["name"], "n": ns[i], "overlapped": ovl[i], "step_ms": steps[i],
                     "collectives_ms": p["collectives_ms"], "micro_ms": micro,
                     "micro_err": error(micro, steps[i]), "anchor": i == a, "loo_ms": loo[i],
                     "loo_err": None if loo[i] is None else error(loo[i], steps[i])})
    try:
        C, t_eff, hidden = fit_step(ns, steps, ovl)
        _, t_coll = fit_line(ns, [p["collectives_ms"] for p in patterns])
    except ValueError:
        C = t_eff = t_coll = hidden = None
    others = [abs(r["micro_err"]) for r in rows if not r["anchor"]]
    looe = [abs(r["loo_err"]) for r in rows if r["loo_err"] is not None]
    return rows, {"alpha": alpha, "busbw": busbw, "nbytes": patterns[a]["bytes_per_allreduce"],
                  "t_micro": t_ms[a] / 1e3, "anchor": patterns[a]["name"], "anchor_n": ns[a],
                  "compute_ms": compute, "C_ms": C, "t_eff_ms": t_eff, "t_coll_ms": t_coll,
                  "hidden_ms": hidden if any(ovl) else None, "micro_mae": statistics.mean(others) if others
                  else None, "loo_mae": statistics.mean(looe) if looe else None,
                  "loo_line_mae": statistics.mean(line) if line and any(ovl) else None}


def load_calibration(path):
    """The calibration JSON, checked for every key `validate` reads: ConfigError
    naming the file and the key."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"calibration must be the file `measure` wrote (--calibration=FILE.json), got "
                          f"{path!r}")
    if not os.path.isfile(path):
        raise ConfigError(f"calibration file {path!r} not found")
    try:
        with open(path) as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"calibration file {path!r} is not valid JSON: {e}") from None

    def need(obj, where, key, kind):
        if not isinstance(obj, dict) or key not in obj:
            raise ConfigError(f"calibration file {path!r} lacks key {where + key!r}")
        value = obj[key]
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and kind is not list and kind is not dict:
            ok = math.isfinite(value) and value > 0
        if not ok:
            what = {list: "a non-empty list", dict: "an object"}.get(kind, "a positive number")
            raise ConfigError(f"calibration file {path!r}: {where}{key} must be {what}, got {value!r}")
        if kind is list and not value:
            raise ConfigError(f"calibration file {path!r}: {where}{key} must be a non-empty list, got []")
        return value

    number = (int, float)
    micro, train = need(data, "", "microbenchmark", dict), need(data, "", "training", dict)
    need(data, "", "machine", dict)
    need(micro, "microbenchmark.", "procs", int)
    for i, s in enumerate(need(micro, "microbenchmark.", "samples", list)):
        for key in ("bytes", "seconds"):
            need(s, f"microbenchmark.samples[{i}].", key, number)
    for key in ("procs", "iters"):
        need(train, "training.", key, int)
    for key in ("n_layer", "n_embd", "tokens_per_iter"):
        need(need(train, "training.", "model", dict), "training.model.", key, int)
    for i, p in enumerate(need(train, "training.", "patterns", list)):
        for key in ("allreduces_per_step", "bytes_per_allreduce", "step_ms", "collectives_ms"):
            need(p, f"training.patterns[{i}].", key, number)
        if not isinstance(p.get("name"), str):
            raise ConfigError(f"calibration file {path!r}: training.patterns[{i}].name must be a string")
    try:
        fit_allreduce([(s["bytes"], s["seconds"]) for s in micro["samples"]], micro["procs"])
    except ValueError as e:
        raise ConfigError(f"calibration file {path!r}: microbenchmark.samples: {e}") from None
    return data, path
