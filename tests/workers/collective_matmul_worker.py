"""
tp_collective_matmul under real tensor parallelism (one shard per gloo process), run by
tests/tp/test_collective_matmul.py in the shared launches of 2 and 4 processes, all checks in one launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/collective_matmul_worker.py OUT
Rank 0 writes OUT/results.json: per check the worst ratio over the ranks (real_tp_worker.ratio: <= 1
is torch.testing.assert_close passing at the tolerance), the counts, and each rank's trace of one
step (the ring's transfers, each with the matmuls that ran between its issue and its wait). The
assertions live in the test file.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from real_tp_worker import (TOL, batch, held_by, local_grads, make_gpt, ratio, simulated,  # noqa: E402
                            with_dropout)
from real_tp_worker import worst  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402
from tpcomm.bench.trace import collective_events, trace_steps  # noqa: E402

COUNT_KEYS = ("fwd_all_gathers", "bwd_all_gathers", "fwd_reduce_scatters", "bwd_reduce_scatters",
              "fwd_ring_transfers", "bwd_ring_transfers", "ring_bytes_per_token", "sp_bytes_per_token")


def forward_backward(model, idx, tgt, *, dropout_key=None):
    model.zero_grad(set_to_none=True)
    model.reset_comm_counts()
    if dropout_key is not None:
        model.seed_dropout(*dropout_key)
    logits, loss = model(idx, tgt)
    loss.backward()
    model.sync_replicated_grads()
    report = model.comm_report(micro_steps=1, tokens=idx.numel())
    return dict(logits=logits, loss=loss, grads=local_grads(model)), {k: report.get(k, 0) for k in COUNT_KEYS}


def compare(a, b, tol, real):
    """forward_backward of the real model `real` against the simulated one's (its
    gradients cut as real holds them)."""
    (x, x_counts), (y, y_counts) = a, b
    y = dict(y, grads=held_by(real, y["grads"]))
    out = {k: ratio(x[k], y[k], tol) for k in ("logits", "loss", "grads")}
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["counts"] = dict(real=x_counts, sim=y_counts)
    return out


def model(gpt, pd, *, ring, perturb=False):
    m = DistributedGPT.from_gpt(gpt, pd.tp, ["tp"] * 4, pd=pd, sequence_parallel=True,
                                tp_collective_matmul=ring).train()
    if perturb and pd.tp_rank == pd.tp - 1:
        with torch.no_grad():
            m.transformer.h[1].mlp.c_fc.weight[0, 3] += 0.1
    return m


def check_real_equals_sim(pd, gpt, results):
    """fp32, without and with keyed dropout 0.2: real collective matmul == simulated plain SP (the math) and
    == simulated collective matmul (the counts)."""
    idx, tgt = batch(0)
    # weights, dropout key
    sources = {"fwd_bwd": (gpt, None), "dropout": (with_dropout(gpt, 0.2), (1337, 3, 1))}
    # simulated: plain SP, collective matmul
    cases = [(check, ring) for check in sources for ring in (False, True)]

    def sim_run(check, ring):
        source, key = sources[check]
        sim = DistributedGPT.from_gpt(source, pd.tp, ["tp"] * 4, sequence_parallel=True,
                                      tp_collective_matmul=ring).train()
        return forward_backward(sim, idx, tgt, dropout_key=key)

    sims = dict(zip(cases, simulated([lambda case=case: sim_run(*case) for case in cases])))
    for check, (source, key) in sources.items():
        real = model(source, pd, ring=True)
        real_out = forward_backward(real, idx, tgt, dropout_key=key)
        results[f"real_vs_sp/{check}"] = compare(real_out, sims[check, False], TOL["float32"], real)
        results[f"real_vs_sim_ring/{check}"] = compare(real_out, sims[check, True], TOL["float32"], real)
    real = model(gpt, pd, ring=True, perturb=True)
    results["can_fail/perturbed_shard"] = compare(forward_backward(real, idx, tgt), sims["fwd_bwd", False],
                                                  TOL["float32"], real)


def check_trace(pd, gpt, out_dir, results):
    """One traced step: every ring transfer's issue and wait, and the matmuls on this thread between them."""
    idx, tgt = batch(0)
    m = model(gpt, pd, ring=True)
    path = os.path.join(out_dir, f"trace.rank{pd.tp_rank}.json")
    with trace_steps(path) as tracer:
        with tracer.step():
            m(idx, tgt)[1].backward()
    with open(path) as f:
        trace = json.load(f)
    gemms = [e for e in trace["traceEvents"] if e.get("ph") == "X"
             and e.get("name") in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")]
    issued, between = {}, []
    for ev in collective_events(trace, waits=True):
        if ev["collective"] != "ring_p2p":
            continue
        if ev["category"] != "wait":
            issued.setdefault(ev["name"], []).append(ev["ts"] + ev["dur"])
            continue
        t0 = issued[ev["name"][len("wait "):]].pop(0)
        between.append([ev["direction"], ev["site"], sum(1 for e in gemms if t0 <= e["ts"]
                                                         and e["ts"] + e["dur"] <= ev["ts"])])
    results[f"trace/rank{pd.tp_rank}"] = dict(between=between, unwaited=sum(len(v) for v in issued.values()))


def main(argv):
    out_dir = argv[0]
    pd = init_parallel(dp=1, tp=int(os.environ["WORLD_SIZE"]), device_type="cpu", backend="gloo")
    try:
        gpt = make_gpt()
        results = {}
        check_real_equals_sim(pd, gpt, results)
        check_trace(pd, gpt, out_dir, results)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, results)
        if pd.is_master:
            merged = worst(per_rank)
            for rank, res in enumerate(per_rank):
                merged[f"trace/rank{rank}"] = res[f"trace/rank{rank}"]
            with open(os.path.join(out_dir, "results.json"), "w") as f:
                json.dump(dict(tp=pd.tp, results=merged), f, indent=1)
    finally:
        shutdown(pd)


if __name__ == "__main__":
    main(sys.argv[1:])
