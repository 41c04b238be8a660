"""
The 'ladder' block under real tensor parallelism (one shard per process) against the simulation, run under
torchrun on CPU with gloo by tests/tp/test_ladder.py, all checks in one launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/ladder_worker.py OUT_DIR
Every rank runs the same checks; rank 0 writes OUT_DIR/results.json, per check the worst result over the ranks
(tests/workers/real_tp_worker.py's `ratio`: <= 1 is torch.testing.assert_close passing at TOL), plus each
rank's log of asynchronous all-reduces. Each rank also writes torch.profiler traces of one forward pass,
OUT_DIR/trace<rank>.json (all-ladder), trace-mixed<rank>.json and trace-sync<rank>.json (all-ladder, every
all-reduce waited for at once). The assertions live in the test file.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# test_generate, test_tensor_parallel
sys.path[1:1] = [os.path.join(TESTS, "model"), os.path.join(TESTS, "tp")]

import tpcomm.model.blocks as blocks  # noqa: E402
import real_tp_worker  # noqa: E402
from real_tp_worker import (TOL, VOCAB, batch, held_by, local_grads, make_gpt, name, ratio,  # noqa: E402
                            simulated)
from real_tp_worker import with_dropout, worst  # noqa: E402
from test_generate import stepwise_logits  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402

PATTERNS = [
    ["ladder"] * 4,
    ["tp", "ladder", "ladder", "spd"],  # ladder after a synced block; its pending outputs added before 'spd'
    # pending before 'parallel'; a desynced stream entering 'ladder'
    ["ladder", "parallel", "ladder", "ladder"],
]
MIXED = PATTERNS[1:]


def log_async(patch):
    """Record the ladder blocks' all-reduces as they are issued and waited for, in a list of ('issue', layer,
    site, whether a torch.distributed work is in flight) and ('wait', layer, site). patch(fn) installs fn as
    blocks.reduce_from_tp_region_async."""
    log = []
    issue = blocks.reduce_from_tp_region_async

    def logged(x, group, *, site):
        handle = issue(x, group, site=site)
        log.append(("issue", site[0], site[2], handle.work is not None))
        wait = handle.wait

        def logged_wait():
            if not handle.waited:
                log.append(("wait", site[0], site[2]))
            return wait()

        handle.wait = logged_wait
        return handle

    patch(logged)
    return log


def expected_log(n_layer):
    """All-ladder, one forward pass: module i's all-reduce is waited for after module i+1's is issued."""
    out = [("issue", 0, "attn"), ("issue", 0, "mlp")]
    for layer in range(1, n_layer):
        out += [("wait", layer - 1, "attn"), ("issue", layer, "attn"), ("wait", layer - 1, "mlp"),
                ("issue", layer, "mlp")]
    return out + [("wait", n_layer - 1, "attn"), ("wait", n_layer - 1, "mlp")]


def forward_backward(model, idx, tgt, *, dropout_key=None):
    model.zero_grad(set_to_none=True)
    model.reset_comm_counts()
    if dropout_key is not None:
        model.seed_dropout(*dropout_key)
    logits, loss = model(idx, tgt)
    loss.backward()
    model.sync_replicated_grads()
    report = model.comm_report(micro_steps=1, tokens=idx.numel())
    counts = {k: report[k] for k in ("fwd_allreduces", "bwd_allreduces", "async_allreduces")}
    return dict(logits=logits, loss=loss, grads=local_grads(model)), counts


def compare(real_out, sim_out, tol, real_model):
    """forward_backward of real_model against the simulated one's (its gradients cut
    as real_model holds them)."""
    (real, real_counts), (sim, sim_counts) = real_out, sim_out
    sim = dict(sim, grads=held_by(real_model, sim["grads"]))
    out = {k: ratio(real[k], sim[k], tol) for k in ("logits", "loss", "grads")}
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["counts"] = dict(real=real_counts, sim=sim_counts)
    return out


def check_forward_backward(pd, gpt, results):
    """Logits, loss, every gradient and the counts, real vs simulated, fp64 and fp32, without and with
    dropout (0.2, keyed masks)."""
    idx, tgt = batch(0)
    # weights, dropout key
    sources = {"fwd_bwd": (gpt, None), "dropout": (with_dropout(gpt, 0.2), (1337, 3, 1))}
    cases = [(check, dtype, block_types) for dtype in ("float64", "float32") for block_types in PATTERNS
             for check in sources]

    def run(check, dtype, block_types, *, real):
        source, key = sources[check]
        model = DistributedGPT.from_gpt(source, pd.tp, block_types, pd=pd if real else None)
        return model, forward_backward(model.to(getattr(torch, dtype)).train(), idx, tgt, dropout_key=key)

    sims = simulated([lambda case=case: run(*case, real=False)[1] for case in cases])
    for (check, dtype, block_types), sim_out in zip(cases, sims):
        real, real_out = run(check, dtype, block_types, real=True)
        results[f"{check}/{dtype}/{name(block_types)}"] = compare(real_out, sim_out, TOL[dtype], real)
    # the comparison can fail: one weight of the last rank's shard; a real model of another pattern
    block_types = PATTERNS[0]
    sim_out = sims[cases.index(("fwd_bwd", "float64", block_types))]
    real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).double()
    if pd.tp_rank == pd.tp - 1:
        with torch.no_grad():
            real.transformer.h[1].attn.c_attn.weight[0, 3] += 0.1
    results["can_fail/perturbed_shard"] = compare(forward_backward(real, idx, tgt), sim_out, TOL["float64"],
                                                  real)
    real = DistributedGPT.from_gpt(gpt, pd.tp, ["tp"] * 4, pd=pd).double()
    results["can_fail/other_pattern"] = compare(forward_backward(real, idx, tgt), sim_out, TOL["float64"],
                                                real)


def check_generation(pd, gpt, results):
    """Tokens (greedy and seeded sampling, with and without the KV cache) equal the simulated model's on every
    rank; the cached steps' logits equal recomputing (fp64)."""
    # tokens equal the simulated model's
    real_tp_worker.check_generation(pd, gpt, results, PATTERNS, torch.float64)
    prompt = torch.randint(VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))
    for block_types in PATTERNS:
        real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd).double().eval()
        tokens = real.generate(prompt, 15, temperature=0)
        results[f"generate/cached_logits/{name(block_types)}"] = ratio(
            stepwise_logits(real, tokens, 5, cached=True), stepwise_logits(real, tokens, 5, cached=False),
            TOL["float64"])


def traced_forward(model, path):
    idx, tgt = batch(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(idx, tgt)
    prof.export_chrome_trace(path)


def check_async(pd, gpt, out_dir, results):
    """The order of issues and waits (a log per rank), and traces of one forward pass: all-ladder, mixed, and
    all-ladder with every all-reduce waited for at once (the order check must fail on that one)."""
    issue = blocks.reduce_from_tp_region_async

    def patch(fn):
        blocks.reduce_from_tp_region_async = fn

    try:
        log = log_async(patch)
        idx, tgt = batch(0)
        DistributedGPT.from_gpt(gpt, pd.tp, PATTERNS[0], pd=pd)(idx, tgt)
        results[f"async/log/rank{pd.tp_rank}"] = dict(log=log)
    finally:
        patch(issue)
    traced_forward(DistributedGPT.from_gpt(gpt, pd.tp, PATTERNS[0], pd=pd),
                   os.path.join(out_dir, f"trace{pd.tp_rank}.json"))
    traced_forward(DistributedGPT.from_gpt(gpt, pd.tp, PATTERNS[2], pd=pd),
                   os.path.join(out_dir, f"trace-mixed{pd.tp_rank}.json"))

    def waited_at_once(x, group, *, site):
        handle = issue(x, group, site=site)
        handle.wait()
        return handle

    try:
        patch(waited_at_once)
        traced_forward(DistributedGPT.from_gpt(gpt, pd.tp, PATTERNS[0], pd=pd),
                       os.path.join(out_dir, f"trace-sync{pd.tp_rank}.json"))
    finally:
        patch(issue)


def main(argv):
    out_dir = argv[0]
    pd = init_parallel(dp=1, tp=int(os.environ["WORLD_SIZE"]), device_type="cpu", backend="gloo")
    try:
        gpt = make_gpt()
        results = {}
        check_forward_backward(pd, gpt, results)
        check_generation(pd, gpt, results)
        check_async(pd, gpt, out_dir, results)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, results)
        if pd.is_master:
            merged = worst(per_rank)
            for rank, res in enumerate(per_rank):  # the logs are per rank, not merged
                merged[f"async/log/rank{rank}"] = res[f"async/log/rank{rank}"]["log"]
            with open(os.path.join(out_dir, "results.json"), "w") as f:
                json.dump(dict(tp=pd.tp, results=merged), f, indent=1)
    finally:
        shutdown(pd)


if __name__ == "__main__":
    main(sys.argv[1:])
