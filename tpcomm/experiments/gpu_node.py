"""
`python experiment.py gpu-node`: what giving up a sync saves under real tensor parallelism on one GPU node (tp
8, NCCL). Every way of giving one up with a gpu-node row in tpcomm/experiments/ways.py (drop, hide, delay,
shrink; timed_ways) is timed on GPT-2 124M and on a 1.3B shape, all the ways of a shape interleaved in rounds
in one torchrun launch (as bench.py interleaves; best round kept): ms/iter, tokens/s, the time in collectives
and its exposed part, measured counts; then the cost model's prediction for the same runs
(tpcomm.costmodel.cost_model.train_variants, NVLink) beside each, with its error.

$ python experiment.py gpu-node                # 8 GPUs, NCCL: 2 shapes x 9 ways, ~10 min (--dry-run says)
$ python experiment.py gpu-node --dry-run      # the plan, each launch's command and the expected GPU-hours
$ python experiment.py gpu-node --report-only  # the table again from the result files
$ python experiment.py gpu-node --rehearsal    # the same code path on CPU: gloo, 2 processes, a tiny model
                                               # (~30 s)

Options: --nproc=N (tp, default 8), --shapes=gpt2-124m,1.3b, --out=DIR (default experiments/gpu-node; the
rehearsal's experiments/gpu-node-rehearsal), --batch_size --block_size --iters --warmup --rounds, --mfu=F (the
prediction's assumed MFU; default the cost model's), --backend=nccl|gloo, --device=cuda|cpu. Each shape's
launch leaves one result file, OUT/runs/<shape>.json, committed like the CPU sweeps' (config, machine, git
commit, every way's numbers); a launch whose result file exists with the same config is skipped, so the sweep
resumes after a kill and a report needs only the files. The report: OUT/results.md. The in-collective and
exposed columns come from the tp group's counters (tpcomm/tp/collectives.py), which time NCCL's collectives
with CUDA events (tpcomm/tp/counting.py CudaEventClock); the 64 MiB all-reduce check each launch records
(gpu_tools.allreduce_sanity) holds that clock against a physical floor. Eager, for the reason docs/gpu.md
states. A way that raises on any rank is dropped on every rank at the end of its round (agree_on_failure), its
error in the result file, and the other ways go on.
"""

import datetime
import json
import os
import shlex
import sys
import time

from tpcomm.errors import ConfigError
from tpcomm.configuration import parse_flag
from tpcomm import ROOT
from tpcomm.experiments import ways
from tpcomm.train.output_path import check_output_dir



def timed_ways():
    """[(name, what it does, block_types for n layers, TP_COMM_OPTIONS, the cost model's train_variants
    key or None (priced with every sync blocking: step_seconds), priced with the asynchronous backward
    where the options say tp_async_grad)]: every way of tpcomm/experiments/ways.py with a gpu-node row
    (Way.node), both baselines among them."""
    return [(w.node.name, w.node.what, w.blocks, w.sync if w.node.sync is None else w.node.sync,
             None if w.node.blocking else w.price.label.format(chunks=2)) for w in ways.WAYS if w.node]


# n_layer, n_embd, n_head: GPT-2 124M with 8 heads of 96 (its 12 do not split over 8 ranks; parameters and
# FLOPs are GPT-2's), and GPT-3 XL's 24 x 2048 with 16 heads of 128 (the cost model's "1.3B" shape)
NODE_SHAPES = {"gpt2-124m": (12, 768, 8), "1.3b": (24, 2048, 16), "tiny": (4, 32, 4)}
GPU = dict(nproc=8, shapes="gpt2-124m,1.3b", batch_size=8, block_size=1024, iters=10, warmup=3, rounds=3,
           backend="nccl", device="cuda", out=os.path.join("experiments", "gpu-node"))
REHEARSAL = dict(nproc=2, shapes="tiny", batch_size=4, block_size=16, iters=1, warmup=1, rounds=2,
                 backend="gloo", device="cpu", out=os.path.join("experiments", "gpu-node-rehearsal"))
VOCAB = {"tiny": 64}  # else GPT-2's, padded to a multiple of 64 (nanoGPT's 50304)
OPTIONS = ("nproc", "shapes", "batch_size", "block_size", "iters", "warmup", "rounds", "backend", "device",
           "out", "mfu")
FLAGS = ("dry-run", "report-only", "rehearsal")
MFU_LEAST = 0.001  # below this a prediction is meaningless (and its times run to hundreds of digits)
LAUNCH_S = {"gpt2-124m": 60, "1.3b": 150, "tiny": 10}  # start-up, NCCL init and building the models (assumed)


class NodeError(ConfigError):
    """A gpu-node sweep that must not start: one line, exit 2."""


def parse(argv):
    """(options dict, flags set) from argv; NodeError naming the key and the value."""
    flags, given = set(), {}
    for arg in argv:
        key = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if key in FLAGS:
            if parse_flag(arg):
                flags.add(key)
        elif key in OPTIONS and "=" in arg:
            given[key] = arg.split("=", 1)[1]
        else:
            raise NodeError(f"gpu-node: unknown argument {arg!r}; options are "
                            f"{', '.join('--' + o + '=...' for o in OPTIONS)} and "
                            f"{', '.join('--' + f for f in FLAGS)}")
    cfg = dict(REHEARSAL if "rehearsal" in flags else GPU)
    for key in ("nproc", "batch_size", "block_size", "iters", "warmup", "rounds"):
        if key in given:
            try:
                cfg[key] = int(given[key])
            except ValueError:
                raise NodeError(f"{key} must be an integer, got {given[key]!r}") from None
            if cfg[key] < (0 if key == "warmup" else 1):
                raise NodeError(f"{key} must be >= {0 if key == 'warmup' else 1}, got {cfg[key]}")
    cfg.update({k: given[k] for k in ("shapes", "backend", "device", "out") if k in given})
    from tpcomm.costmodel.cost_model import const
    cfg["mfu"] = const("mfu")
    if "mfu" in given:
        try:
            cfg["mfu"] = float(given["mfu"])
        except ValueError:
            cfg["mfu"] = None
        if cfg["mfu"] is None or not MFU_LEAST <= cfg["mfu"] <= 1:
            raise NodeError(f"mfu must be a fraction in [{MFU_LEAST}, 1], got {given['mfu']!r}")
    shapes = cfg["shapes"].split(",")
    bad = [s for s in shapes if s not in NODE_SHAPES]
    if bad or len(set(shapes)) != len(shapes):  # an empty name or a repeated one too
        raise NodeError(f"shapes must be a comma-separated subset of {list(NODE_SHAPES)}, got "
                        f"{cfg['shapes']!r}")
    cfg["shapes"] = shapes
    check_output_dir(cfg["out"], key="out")
    if cfg["backend"] not in ("nccl", "gloo"):
        raise NodeError(f"backend must be 'nccl' or 'gloo', got {cfg['backend']!r}")
    if cfg["device"] not in ("cuda", "cpu"):
        raise NodeError(f"device must be 'cuda' or 'cpu', got {cfg['device']!r}")
    if cfg["backend"] == "nccl" and cfg["device"] != "cuda":
        raise NodeError(f"backend='nccl' needs device='cuda', got device={cfg['device']!r}")
    for shape in shapes:
        check_shape(shape, cfg)
    return cfg, flags


def check_shape(shape, cfg):
    """Every way of the shape must run at this tp and batch, as train.py would check it (TPConfig)."""
    from tpcomm.model.options import TPConfig

    n_layer, n_embd, n_head = NODE_SHAPES[shape]
    for name, _, pattern, opts, _ in timed_ways():
        try:
            TPConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=cfg["block_size"],
                     vocab_size=64, bias=False, tp_size=cfg["nproc"], block_types=pattern(n_layer), **opts)
        except ConfigError as e:
            raise NodeError(f"{shape} '{name}' at nproc (tp) {cfg['nproc']}: {e}") from None
        if cfg["batch_size"] % opts.get("tp_overlap", 1):
            raise NodeError(f"batch_size ({cfg['batch_size']}) must be divisible by tp_overlap "
                            f"({opts['tp_overlap']}) for '{name}'")
        if opts.get("sequence_parallel") and (cfg["batch_size"] * cfg["block_size"]) % cfg["nproc"]:
            raise NodeError(f"batch_size x block_size must be divisible by nproc ({cfg['nproc']}) for "
                            f"'{name}'")


def run_config(shape, cfg):
    """What a result file records as its config: a file whose config differs is stale and rerun."""
    n_layer, n_embd, n_head = NODE_SHAPES[shape]
    return dict(shape=shape, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                vocab_size=VOCAB.get(shape, 50304), tp=cfg["nproc"], batch_size=cfg["batch_size"],
                block_size=cfg["block_size"], iters=cfg["iters"], warmup=cfg["warmup"], rounds=cfg["rounds"],
                backend=cfg["backend"], device=cfg["device"], dtype="bfloat16" if cfg["device"] == "cuda"
                else "float32", ways=[w[0] for w in timed_ways()])


def result_path(cfg, shape):
    return os.path.join(cfg["out"], "runs", f"{shape}.json")


def finished(cfg, shape):
    path = result_path(cfg, shape)
    if not os.path.exists(path):
        return False
    try:
        return read_node_result(path, shape)["config"] == run_config(shape, cfg)
    except ValueError:  # ResultsError: not a valid result file, so the shape is run again
        return False


def launch_command(cfg, shape, out):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg['nproc']}",
            "-m", "tpcomm.experiments.gpu_node", "worker",
            f"--config={json.dumps(run_config(shape, cfg), separators=(',', ':'))}", f"--out={out}"]


# ---------- the cost model's prediction ----------

def predictions(config, *, mfu, peak=None):
    """{way: (predicted ms/iter, predicted exposed comm ms)} for one result's config: train_variants on NVLink
    (one node), the step's tokens, at `mfu` of `peak` (None: the H100 datasheet's)."""
    from tpcomm.costmodel.cost_model import LINKS, Options, Shape, forward_syncs, step_seconds, train_variants

    shape = Shape(config["shape"], config["n_layer"], config["n_embd"], config["n_head"],
                  config["vocab_size"])
    kw = dict(tp=config["tp"], link=LINKS[0], tokens=config["batch_size"] * config["block_size"],
              seq_len=config["block_size"], mfu=mfu, peak=peak)
    variants = {a: train_variants(shape, opts=Options(chunks=2), async_grad=a, **kw) for a in (False, True)}
    out = {}
    for name, _, pattern, opts, key in timed_ways():
        compute, comm = variants[opts.get("tp_async_grad", False)][key] if key else step_seconds(
            shape, fwd_syncs=forward_syncs(pattern(config["n_layer"])), **kw)
        out[name] = ((compute + comm) * 1e3, comm * 1e3)
    return out


def expected_seconds(cfg, shape):
    """Wall seconds of one shape's launch as the cost model predicts it: start-up plus every way's steps."""
    config = run_config(shape, cfg)
    # + the counts' and the sanity check's passes
    steps = config["warmup"] + config["rounds"] * config["iters"] + 2
    pred = predictions(config, mfu=cfg["mfu"])
    return LAUNCH_S[shape] + sum(ms for ms, _ in pred.values()) * steps / 1e3


# ---------- the worker: one rank of a launch ----------

def time_ways(models, opts, ctx, X, Y, config, device):
    """Every way's steps, interleaved in rounds (best round kept): ({way: row}, {way: its error}). A way that
    raises on any rank is dropped on every rank (agree_on_failure) and the others go on."""
    import torch

    from tpcomm.gpu.gpu_tools import timed_steps

    B, T = X.shape
    best, errors = {}, {}
    for r in range(config["rounds"]):
        for name, m in models.items():
            if name in errors:
                continue
            try:
                if r == 0:
                    timed_steps(m, m, opts[name], ctx, X, Y, config["warmup"], device)
                m.reset_comm_counts()
                dt = timed_steps(m, m, opts[name], ctx, X, Y, config["iters"], device)
                rep = m.comm_report(micro_steps=config["iters"], tokens=X.numel())
                row = dict(ms_per_iter=dt * 1e3, tokens_per_s=B * T / dt,
                           in_collectives_ms=rep.get("comm_busy_seconds", 0.0) / config["iters"] * 1e3,
                           exposed_ms=rep.get("comm_seconds", 0.0) / config["iters"] * 1e3,
                           **{k: v for k, v in rep.items() if k not in ("comm_seconds", "comm_busy_seconds")})
                if name not in best or row["ms_per_iter"] < best[name]["ms_per_iter"]:
                    best[name] = row
            except Exception as e:  # noqa: BLE001 (an OOM in one way must not lose the others)
                mine = f"{type(e).__name__}: {str(e)[:300]}"
                if config["device"] == "cuda":
                    torch.cuda.empty_cache()
            else:
                mine = None
            failed = agree_on_failure(mine, device)  # every rank drops the way together, and goes on in step
            if failed:
                errors[name] = failed
                best.pop(name, None)
    return best, errors


def worker(argv):
    """Under torch.distributed.run: build every way's model (real TP over all ranks), time them interleaved,
    run the 64 MiB all-reduce check; rank 0 writes the result file."""
    import torch
    import torch.distributed as dist

    from model import device_peak_flops
    from tpcomm.train.build import build_model
    from tpcomm.gpu.gpu_tools import allreduce_sanity
    from tpcomm.gpu.gpu_report import write_json
    from tpcomm.parallel.parallel_dims import init_parallel, shutdown
    from tpcomm.train.runtime import autocast_context, setup_runtime, sync

    args = dict(a[2:].split("=", 1) for a in argv)
    config, out = json.loads(args["config"]), args["out"]
    device_type = config["device"]
    pd = init_parallel(dp=1, tp=config["tp"], device_type=device_type, backend=config["backend"])
    device = f"cuda:{pd.local_rank}" if device_type == "cuda" else "cpu"
    setup_runtime(device_type, 1337)
    ctx = autocast_context(device_type, config["dtype"])
    base = dict(n_layer=config["n_layer"], n_embd=config["n_embd"], n_head=config["n_head"],
                vocab_size=config["vocab_size"], block_size=config["block_size"], bias=False, dropout=0.0,
                tp_size=config["tp"])
    models, ref = {}, None
    # one initialisation, copied: every way has the same parameters
    for name, _, pattern, opts, _ in timed_ways():
        m = build_model("distributed_gpt", dict(base, block_types=pattern(config["n_layer"]), **opts), pd=pd,
                        init_device="meta")
        if ref is None:
            # GPT's layout: a way's rank may hold wte by vocabulary
            ref = m.materialize_(device).gpt_state_dict()
        else:
            m.to_empty(device=device)
            m.transformer.wte.weight = m.lm_head.weight
            m.load_gpt_state_dict(ref)
        models[name] = m
    g = torch.Generator().manual_seed(1337)
    B, T = config["batch_size"], config["block_size"]
    X = torch.randint(config["vocab_size"], (B, T), generator=g).to(device)
    Y = torch.randint(config["vocab_size"], (B, T), generator=g).to(device)
    opts = {n: m.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device_type) for n, m in models.items()}
    t0 = time.perf_counter()
    best, errors = time_ways(models, opts, ctx, X, Y, config, device)
    sync(device)
    timing_s = time.perf_counter() - t0
    try:
        sanity = dict(allreduce_sanity(next(iter(models.values())).group, device), backend=config["backend"],
                      ranks=config["tp"])
    except Exception as e:  # noqa: BLE001
        sanity = dict(error=f"{type(e).__name__}: {e}")
    rows = [None] * pd.world_size
    dist.all_gather_object(rows, best)
    if pd.is_master:
        # the slowest rank's step and collectives: a step ends when every rank's does
        for name, row in best.items():
            row["ms_per_iter_max_rank"] = max(r[name]["ms_per_iter"] for r in rows if name in r)
            row["in_collectives_ms_max_rank"] = max(r[name]["in_collectives_ms"] for r in rows if name in r)
        cuda = device_type == "cuda"
        write_json(dict(schema=1, sweep="gpu-node", config=config, ways=best, errors=errors,
                        allreduce_sanity=sanity, timing_s=timing_s,
                        machine=dict(device=torch.cuda.get_device_name(device) if cuda else "CPU (rehearsal)",
                                     peak_flops=device_peak_flops(device, config["dtype"]),
                                     torch=torch.__version__, cuda=torch.version.cuda,
                                     nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                                     date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d "
                                                                                                "%H:%M UTC")),
                        git=git_commit()), out)
    shutdown(pd, finished=True)


def agree_on_failure(error, device):
    """At the end of each way's round, on every rank: a flag (1 where this rank's way raised) all-reduced with
    MAX over the group, so the ranks agree that the way failed and none runs the next way's collectives
    against another rank still in this one's; where it failed, each failed rank's error, gathered ("rank r:
    ...", None where none did). A rank that fails between two collectives of a step still leaves the others
    waiting in the next one (until the process group's timeout ends the launch): the ranks' shards are alike,
    so an out-of-memory strikes them alike."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([0.0 if error is None else 1.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0.0:
        return None
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None)


def git_commit():
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------- experiment.py gpt2 --dry-run: what the quality sweep costs on GPUs ----------

def gpt2_gpu_hours(jobs):
    """One line for `experiment.py gpt2 --dry-run`: the GPU-hours of the jobs still to train, from their FLOPs
    (tpcomm.costmodel.cost_model: 6 N + 12 L d T per token trained, a third of that per token evaluated) on
    H100 SXM bf16 at the cost model's assumed MFU; and the wall time with each job's processes."""
    from tpcomm.costmodel.cost_model import Shape, const

    peak, mfu = const("h100_bf16_flops"), const("mfu")
    gpu_s = wall_s = 0.0
    for j in jobs:
        c = j.cfg
        shape = Shape("", c["n_layer"], c["n_embd"], c["n_head"], 50304)
        per_token = 6 * shape.params + 12 * c["n_layer"] * c["n_embd"] * c["block_size"]
        tokens = c["batch_size"] * c["block_size"] * c["gradient_accumulation_steps"] * (c["max_iters"] + 1)
        evals = (c["max_iters"] // c["eval_interval"]
                 + 1) * 2 * c["eval_iters"] * c["batch_size"] * c["block_size"]
        s = (tokens * per_token + evals * per_token / 3) / (peak * mfu)
        gpu_s += s
        wall_s += s / j.nproc
    return (f"expected: {len(jobs)} run(s) to train, {gpu_s / 3600:,.0f} GPU-hours "
            f"({gpu_s / 3600 / max(1, len(jobs)):,.1f} per run; H100 SXM bf16 at the cost model's "
            f"assumed {mfu:.0%} MFU, measured by `make gpu-check`), {wall_s / 3600:,.0f} h wall with "
            "each run's processes (--nproc); simulated TP computes every shard on " f"each GPU (docs/gpu.md: "
            "sim_tp8's ratio to GPT), real TP adds its exposed communication (gpu-node)")


# ---------- the runner and the report ----------

def read_node_result(path, shape):
    """A result file, checked by the one validator (tpcomm/experiments/result_check.py):
    ResultsError naming it otherwise."""
    from tpcomm.experiments.result_check import check_node_result
    from tpcomm.experiments.results import _read_json

    record = _read_json(path)
    check_node_result(path, record, shape=shape)
    return record


def report(cfg):
    """results.md from the result files: measured beside predicted, per shape."""
    from tpcomm.costmodel.cost_model import error

    lines = ["# gpu-node: real tensor parallelism, every way of giving up a sync\n", "Written by `python "
             "experiment.py gpu-node` from the result files in `runs/`. Measured: best of the interleaved "
             "rounds, rank 0 (the slowest rank's step in `runs/`). Predicted: tpcomm/costmodel/cost_model.py "
             "train_variants, NVLink 4 within one node, at the MFU shown and the device's dense bf16 peak "
             "(H100 SXM's when unknown). In-collective and exposed times are the tp group's counters "
             "(CUDA events on NCCL; the 64 MiB all-reduce check below holds them against a floor).\n"]
    found = 0
    for shape in cfg["shapes"]:
        path = result_path(cfg, shape)
        if not os.path.exists(path):
            lines.append(f"## {shape}\n\nno result file yet ({path})\n")
            continue
        res = read_node_result(path, shape)
        found += 1
        c, m = res["config"], res["machine"]
        pred = predictions(c, mfu=cfg["mfu"], peak=m.get("peak_flops"))
        base = res["ways"].get("all tp")
        lines += [f"## {shape}: {c['n_layer']} x {c['n_embd']}, {c['n_head']} heads, tp {c['tp']} "
                  f"({c['backend']}), batch {c['batch_size']} x {c['block_size']}, {c['dtype']}\n",
                  f"{m['device']}, torch {m['torch']}, CUDA {m['cuda'] or 'n/a'}, NCCL {m['nccl'] or 'n/a'}, "
                  f"{m['date']}, commit {str(res.get('git'))[:10]}. Predictions at MFU "
                  f"{cfg['mfu']:.0%}.\n", "| way | what | fwd all-reduces | ms/iter | tokens/s | vs all tp | "
                  "in collectives ms | exposed ms | predicted ms/iter | error | predicted exposed ms |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, what, _, _, _ in timed_ways():
            p_ms, p_comm = pred[name]
            r = res["ways"].get(name)
            if r is None:
                lines.append(f"| {name} | {what} | | failed: {res['errors'].get(name, 'not run')} | | | | | "
                             f"{p_ms:.2f} | | {p_comm:.2f} |")
                continue
            vs = f"{base['ms_per_iter'] / r['ms_per_iter']:.2f}x" if base else "n/a"
            sp = (f" (+{r['fwd_reduce_scatters']} RS, {r['fwd_all_gathers']} "
                  "AG)" if r.get("fwd_reduce_scatters") else "")
            lines.append(f"| {name} | {what} | {r.get('fwd_allreduces', '')}{sp} | {r['ms_per_iter']:.2f} | "
                         f"{r['tokens_per_s']:,.0f} | {vs} | {r['in_collectives_ms']:.2f} | "
                         f"{r['exposed_ms']:.2f} | {p_ms:.2f} | {error(p_ms, r['ms_per_iter']):+.0f}% | "
                         f"{p_comm:.2f} |")
        s = res["allreduce_sanity"]
        lines.append("")
        if "error" in s:
            lines.append(f"64 MiB all-reduce check: failed ({s['error']})\n")
        else:
            lines.append(f"64 MiB all-reduce check ({s['backend']}, {s['ranks']} ranks): "
                         f"{s['in_collective_ms']:.3f} ms "
                         f"in the collective, step {s['step_ms']:.3f} ms, floor {s['floor_ms']:.3f} ms: "
                         f"**{'ok' if s['ok'] else 'FAILED: the in-collective clock does not time it'}**\n")
    text = "\n".join(lines)
    if found:  # nothing is written (nor a directory made) for a report without result files
        os.makedirs(cfg["out"], exist_ok=True)
        with open(os.path.join(cfg["out"], "results.md"), "w") as f:
            f.write(text)
    return text, found


def main(argv):
    cfg, flags = parse(argv)
    plan = [(shape, finished(cfg, shape)) for shape in cfg["shapes"]]
    if "report-only" in flags:
        text, found = report(cfg)
        if not found:
            raise NodeError(f"no result files in {os.path.join(cfg['out'], 'runs')}")
        print(text)
        return
    total = 0.0
    print(f"gpu-node: {len(cfg['shapes'])} shape(s) x {len(timed_ways())} ways, tp {cfg['nproc']} "
          f"({cfg['backend']}, {cfg['device']}), batch {cfg['batch_size']} x {cfg['block_size']}, "
          f"{cfg['warmup']} warm-up + {cfg['rounds']} x {cfg['iters']} timed steps per way, into "
          f"{cfg['out']}")
    for shape, done in plan:
        secs = 0.0 if done else expected_seconds(cfg, shape)
        total += secs
        print(f"{'skip' if done else 'run '}  {shape}: {', '.join(w[0] for w in timed_ways())}; expected "
              f"{secs / 60:.1f} min" + (" (result file up to date)" if done else ""))
        if "dry-run" in flags and not done:
            print("      " + shlex.join(launch_command(cfg, shape, result_path(cfg, shape))))
    gpus = cfg["nproc"] if cfg["device"] == "cuda" else 0
    print(f"expected: {total / 60:.1f} min wall" + (f", {total * gpus / 3600:.2f} GPU-hours ({gpus} GPUs; "
                                                    "cost " f"model at MFU {cfg['mfu']:.0%} plus "
                                                    "start-up)" if gpus else " (CPU rehearsal: the cost "
                                                    "model's GPU times say nothing about it)"))
    if "dry-run" in flags:
        return
    os.makedirs(os.path.join(cfg["out"], "runs"), exist_ok=True)
    from tpcomm.gpu.gpu_tools import launch

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    if cfg["device"] == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    for shape, done in plan:
        if done:
            continue
        t0 = time.time()
        code, log = launch(launch_command(cfg, shape, result_path(cfg, shape)), env=env, timeout=None)
        if code != 0:
            print(log[-3000:], file=sys.stderr)
            print(f"error: gpu-node {shape}: the launch failed (exit {code}); finished shapes are kept",
                  file=sys.stderr)
            sys.exit(1)
        print(f"done  {shape}: {time.time() - t0:.0f} s -> {result_path(cfg, shape)}")
    text, _ = report(cfg)
    print()
    print(text)
    print(f"report: {os.path.join(cfg['out'], 'results.md')}")


def cli(argv):
    """experiment.py gpu-node: user errors as one line, exit 2."""
    from tpcomm.experiments.result_check import ResultsError

    try:
        main(argv)
    except (ConfigError, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\ninterrupted: finished shapes are kept; run the same command again to continue",
              file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2:])
    else:
        cli(sys.argv[1:])
