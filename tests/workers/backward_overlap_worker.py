"""
tp_async_grad (the asynchronous backward all-reduce of f) under real tensor parallelism, run under torchrun on
CPU with gloo by tests/tp/test_backward_overlap.py, all checks of a world size in one launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/backward_overlap_worker.py OUT_DIR
2 processes (tp 2): asynchronous == blocking, bitwise in float32 with keyed dropout (logits, loss, every
gradient, after tp_overlap=1 and 2), the same == the simulation (float64, real_tp_worker.TOL), 3 AdamW steps
with clipping bitwise, one weight perturbed (the comparison can fail), and a torch.profiler trace of one
training step per rank (OUT_DIR/trace-<pattern>.rank<r>.json) with the order of the backward all-reduces'
issues and waits and the compute run between each issue and its wait. 4 processes: tp 4, then dp 2 x tp 2
under FSDP2 and DDP, then pp 2 x tp 2 (GPipe), each asynchronous == blocking bitwise in float32. Rank 0 writes
OUT_DIR/results.json; the assertions live in the test file.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from real_tp_worker import (TOL, batch, held_by, make_gpt, name, ratio, simulated, with_dropout,  # noqa: E402
                            worst)
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.parallel.data_parallel import apply_data_parallel  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402
from tpcomm.bench.trace import collective_events, trace_steps  # noqa: E402

PATTERNS = [
    ["tp"] * 4,
    ["spd"] * 4,
    ["ladder"] * 4,
    ["parallel", "tp", "parallel", "spd"],  # desynced streams into tp and spd, 'parallel' entered synced
    ["tp", "ladder", "ladder", "spd"],  # ladder after a synced block, pending outputs into spd
    ["ladder", "parallel", "ladder", "ladder"],  # a desynced stream into a ladder block
]
KEY = (1337, 3, 1)  # keyed dropout 0.2 (docs/model.md): the same masks for both paths and both modes
STEPS, LR, CLIP = 3, 1e-2, 0.1  # clipping active (real_tp_worker)


def ks(block_types):
    return (1, 2) if {"tp", "spd"} & set(block_types) else (1,)


def build(gpt, block_types, pd, dtype, *, sim=False, **kw):
    """Real TP over pd's tp group, or (sim) simulated with the same tp_size."""
    return DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=None if sim else pd, **kw).to(dtype).train()


def step(model, idx, tgt, run=None):
    """One forward and backward with the dropout key: (logits, loss, {name: this rank's gradient})."""
    model.zero_grad(set_to_none=True)
    model.seed_dropout(*KEY)
    logits, loss = (run or model)(idx, tgt)
    loss.backward()
    model.sync_replicated_grads()
    return logits.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def bitwise(a, b):
    """{'ok': every tensor equal, bit for bit; 'max': the largest difference, for the message}."""
    flat = lambda x: [x[0], x[1], *x[2].values()] if isinstance(x, tuple) else list(x)  # noqa: E731
    pairs = list(zip(flat(a), flat(b)))
    diff = max(((u.double() - v.double()).abs().max().item() for u, v in pairs if u.numel()), default=0.0)
    return dict(ok=all(torch.equal(u, v) for u, v in pairs) and len(pairs) > 2, max=diff)


def check_equal(pd, gpt, results, patterns):
    """Asynchronous == blocking, bitwise in float32 with dropout; asynchronous ==
    the simulation in float64."""
    idx, tgt = batch(0)
    dropped = with_dropout(gpt, 0.2)
    cases = [(block_types, K) for block_types in patterns for K in ks(block_types)]
    sims = simulated([lambda block_types=block_types, K=K: step(build(
        dropped, block_types, pd, torch.float64, sim=True, tp_async_grad=True, tp_overlap=K), idx, tgt)
        for block_types, K in cases])
    for (block_types, K), (ls, losss, gs) in zip(cases, sims):
        kw = dict(tp_overlap=K)
        tag = f"{name(block_types)}/K{K}"
        results[f"tp{pd.tp}/equal/{tag}"] = bitwise(
            step(build(dropped, block_types, pd, torch.float32, tp_async_grad=True, **kw), idx, tgt),
            step(build(dropped, block_types, pd, torch.float32, **kw), idx, tgt))
        real = build(dropped, block_types, pd, torch.float64, tp_async_grad=True, **kw)
        lr, lossr, gr = step(real, idx, tgt)  # this rank's gradients, against its part of the simulated ones
        out = {"logits": ratio(lr, ls, TOL["float64"]), "loss": ratio(lossr, losss, TOL["float64"]),
               "grads": ratio(gr, held_by(real, gs), TOL["float64"])}
        results[f"tp{pd.tp}/sim/{tag}"] = dict(ratio=max(v["ratio"] for v in out.values()), parts=out)
    for block_types in patterns:
        # no dropout: the pending biases (C,), not masked (N, C), summed over tokens
        if "ladder" in block_types:
            results[f"tp{pd.tp}/equal/{name(block_types)}/p0"] = bitwise(
                step(build(gpt, block_types, pd, torch.float32, tp_async_grad=True), idx, tgt),
                step(build(gpt, block_types, pd, torch.float32), idx, tgt))


def check_can_fail(pd, gpt, results):
    """One weight of the last rank's shard perturbed on the asynchronous side: the
    bitwise comparison fails."""
    idx, tgt = batch(0)
    block_types = ["tp", "ladder", "ladder", "spd"]
    model = build(gpt, block_types, pd, torch.float32, tp_async_grad=True)
    if pd.tp_rank == pd.tp - 1:
        with torch.no_grad():
            model.transformer.h[1].mlp.c_fc.weight[0, 3] += 1e-3
    results[f"can_fail/tp{pd.tp}/perturbed_shard"] = bitwise(step(model, idx, tgt),
                                                             step(build(gpt, block_types, pd, torch.float32),
                                                                  idx, tgt))


def train(model, run, pd, data):
    """STEPS AdamW steps with clipping and dropout: the losses, the gradient norms and the final weights."""
    opt = model.configure_optimizers(0.1, LR, (0.9, 0.95), "cpu")
    losses, norms = [], []
    for it, (x, y) in enumerate(data):
        model.seed_dropout(1337, it, 0)
        _, loss = (run or model)(x, y)
        loss.backward()
        model.sync_replicated_grads()
        norms.append(model.clip_grad_norm_(CLIP).detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    weights = [p.detach().to_local() if hasattr(p, "to_local") else p.detach() for p in model.parameters()]
    return [torch.stack(losses), torch.stack(norms), *weights]


def check_training(pd, gpt, results, variants):
    dropped = with_dropout(gpt, 0.2)
    data = [batch(10 + i) for i in range(STEPS)]
    for block_types, kw in variants:
        a = build(dropped, block_types, pd, torch.float32, tp_async_grad=True, **kw)
        b = build(dropped, block_types, pd, torch.float32, **kw)
        results[f"tp{pd.tp}/train/{name(block_types)}/K{kw.get('tp_overlap', 1)}"] = bitwise(
            train(a, None, pd, data), train(b, None, pd, data))


def check_order(pd, gpt, out_dir, results):
    """One traced training step per pattern (tp_async_grad): the backward all-reduces' issues
    and waits in order, with the compute ops (matmuls) that ran between each issue and its wait
    on the thread that issued it."""
    idx, tgt = batch(0)
    for label, block_types, kw in (("tp-overlap2", ["tp"] * 4, dict(tp_overlap=2)),
                                   ("ladder", ["ladder"] * 4, {}), ("tp", ["tp"] * 4, {})):
        model = build(gpt, block_types, pd, torch.float32, tp_async_grad=True, **kw)
        path = os.path.join(out_dir, f"trace-{label}.rank{pd.tp_rank}.json")
        with trace_steps(path) as tracer:
            with tracer.step():
                model(idx, tgt)[1].backward()
        with open(path) as f:
            trace = json.load(f)
        spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        events = [e for e in collective_events(trace, waits=True) if e["op"] == "f_async"]
        issued = {}
        log = [["wait" if ev["category"] == "wait" else "issue", ev["layer"], ev["site"], ev["ts"],
                ev["ts"] + ev["dur"]] for ev in events]
        # the matmuls that ran between each issue's end and its wait's start, on the issuing thread
        for entry in log:
            kind, layer, site, start, end = entry
            if kind != "wait":
                issued.setdefault((layer, site), []).append(end)
        between = []
        for kind, layer, site, start, end in log:
            if kind == "wait":
                t0 = issued[(layer, site)].pop(0)
                between.append([layer, site, sum(1 for e in spans if e["name"] in ("aten::bmm", "aten::mm")
                                                 and t0 <= e["ts"] and e["ts"] + e["dur"] <= start)])
        results[f"order/{label}/rank{pd.tp_rank}"] = dict(log=[e[:3] for e in log], between=between)


def check_data_parallel(pd, gpt, results):
    """dp 2 x tp 2, FSDP2 (its blocks wait for the ladder's attention all-reduce in their own forward) and DDP
    (all 'ladder': each block hands the next its ColumnInput) over dp: 3 steps asynchronous == blocking,
    bitwise (float32, dropout)."""
    dropped = with_dropout(gpt, 0.2)
    rows = slice(pd.dp_rank * 2, pd.dp_rank * 2 + 2)
    data = [(x[rows], y[rows]) for x, y in (batch(20 + i) for i in range(STEPS))]
    for kind, block_types, kw in (("fsdp", ["tp", "ladder", "ladder", "spd"], dict(tp_overlap=2)),
                                  ("ddp", ["ladder"] * 4, {})):
        out = []
        for async_grad in (True, False):
            print(f"rank {dist.get_rank()}: {kind} async={async_grad}", file=sys.stderr, flush=True)
            model = build(dropped, block_types, pd, torch.float32, tp_async_grad=async_grad, **kw)
            run = apply_data_parallel(model, pd, kind=kind, device_type="cpu")
            out.append(train(model, run, pd, data))
        results[f"{kind}/dp2tp2/train"] = bitwise(*out)


def check_pipeline(pd, gpt, results):
    """pp 2 x tp 2, GPipe with 2 micro-batches: the first step's loss and every gradient,
    asynchronous == blocking."""
    from tpcomm.parallel.pipeline import build_pipeline

    dropped = with_dropout(gpt, 0.2)
    x, y = batch(30)
    out = []
    for async_grad in (True, False):
        model = build(dropped, ["tp", "ladder", "ladder", "spd"], pd, torch.float32, tp_async_grad=async_grad)
        pipe = build_pipeline(model, pd, schedule="gpipe", n_microbatches=2, batch_size=4, seq_len=x.shape[1])
        loss = pipe.step([(x[:2], y[:2]), (x[2:], y[2:])], dropout_key=(1337, 3, 0))
        grads = pipe.gpt_grads()
        out.append([torch.tensor(float(loss)), *(grads[k] for k in sorted(grads))])
    results["pp/pp2tp2/step"] = bitwise(*out)


def main(argv):
    out_dir = argv[0]
    world = int(os.environ["WORLD_SIZE"])
    gpt, results = make_gpt(), {}
    pd = init_parallel(dp=1, tp=world, device_type="cpu", backend="gloo")
    try:
        if world == 2:
            check_equal(pd, gpt, results, PATTERNS)
            check_can_fail(pd, gpt, results)
            check_training(pd, gpt, results, [(["tp", "ladder", "ladder", "spd"], {}),
                                              (["tp"] * 4, dict(tp_overlap=2))])
            check_order(pd, gpt, out_dir, results)
        else:
            only = argv[1].split(",") if len(argv) > 1 else ("tp4", "dp", "pp")
            if "tp4" in only:
                check_equal(pd, gpt, results, [PATTERNS[0], PATTERNS[4]])
            if "dp" in only:
                pd = init_parallel(dp=2, tp=2, device_type="cpu", backend="gloo")
                check_data_parallel(pd, gpt, results)
            if "pp" in only:
                pd = init_parallel(dp=1, tp=2, pp=2, device_type="cpu", backend="gloo")
                check_pipeline(pd, gpt, results)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, results)
        if dist.get_rank() == 0:
            merged = worst(per_rank)
            for res in per_rank:  # the order logs per rank, not merged
                merged.update({k: v for k, v in res.items() if k.startswith("order/")})
            with open(os.path.join(out_dir, "results.json"), "w") as f:
                json.dump(dict(world=world, results=merged), f, indent=1)
    finally:
        shutdown(pd, finished=True)


if __name__ == "__main__":
    main(sys.argv[1:])
