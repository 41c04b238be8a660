"""
tp_overlap and sequence_parallel under real tensor parallelism (one shard per process) against the
simulation, run under torchrun on CPU with gloo by tests/tp/test_overlap.py and
tests/tp/test_sequence_parallel.py, all checks in one
launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/overlap_sp_worker.py OUT
Every rank runs the same checks; rank 0 writes OUT/results.json, per check the worst result over the ranks
(real_tp_worker.ratio: <= 1 is torch.testing.assert_close passing at TOL), plus each rank's log of
asynchronous all-reduces and its measured activation bytes. The assertions live in the test files.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import tpcomm.model.strategies as strategies  # noqa: E402
from ladder_worker import log_async  # noqa: E402
from real_tp_worker import TOL, batch, held_by, local_grads, make_gpt, name, ratio, simulated  # noqa: E402
from real_tp_worker import with_dropout, worst  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.costmodel.activation_memory import measure_saved_bytes  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402

PATTERNS = [
    ["tp"] * 4,
    ["spd"] * 4,
    ["parallel", "tp", "parallel", "spd"],  # a desynced stream entering 'tp' and 'spd'
    ["tp", "spd", "spd", "parallel"],  # ends desynced: the final sync
]
OPTIONS = {"overlap2": dict(tp_overlap=2), "sp": dict(sequence_parallel=True)}
COUNT_KEYS = ("fwd_allreduces", "bwd_allreduces", "async_allreduces", "fwd_reduce_scatters",
              "fwd_all_gathers", "bwd_reduce_scatters", "bwd_all_gathers", "comm_bytes_per_token",
              "sp_bytes_per_token")


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


def compare(real_out, sim_out, tol, real_model):
    """forward_backward of real_model against the simulated one's (its gradients cut
    as real_model holds them)."""
    (real, real_counts), (sim, sim_counts) = real_out, sim_out
    sim = dict(sim, grads=held_by(real_model, sim["grads"]))
    out = {k: ratio(real[k], sim[k], tol) for k in ("logits", "loss", "grads")}
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["counts"] = dict(real=real_counts, sim=sim_counts)
    return out


def check_real_equals_sim(pd, gpt, results):
    """Logits, loss, every gradient and the counts, real vs simulated, fp64, without and with dropout.
    Returns the simulated runs by check name (the can-fail cases compare with some of them)."""
    idx, tgt = batch(0)
    # weights, dropout key
    sources = {"fwd_bwd": (gpt, None), "dropout": (with_dropout(gpt, 0.2), (1337, 3, 1))}
    cases = [(option, block_types, check) for option in OPTIONS for block_types in PATTERNS
             for check in sources]

    def run(option, block_types, check, *, real):
        source, key = sources[check]
        model = DistributedGPT.from_gpt(source, pd.tp, block_types, pd=pd if real else None,
                                        **OPTIONS[option])
        return model, forward_backward(model.double().train(), idx, tgt, dropout_key=key)

    sims = {}
    for case, sim_out in zip(cases, simulated([lambda case=case: run(*case, real=False)[1]
                                               for case in cases])):
        option, block_types, check = case
        sims[f"{option}/{check}/{name(block_types)}"] = sim_out
        real, real_out = run(*case, real=True)
        results[f"{option}/{check}/{name(block_types)}"] = compare(real_out, sim_out, TOL["float64"], real)
    return sims


def check_can_fail(pd, gpt, results, sims):
    """A perturbed weight on the last rank's shard; under SP, every rank drawing the first token shard's
    dropout masks (the row offset ignored). sims: check_real_equals_sim's."""
    idx, tgt = batch(0)
    block_types = PATTERNS[2]
    for option, kw in OPTIONS.items():
        real = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd, **kw).double()
        if pd.tp_rank == pd.tp - 1:
            with torch.no_grad():
                real.transformer.h[1].attn.c_attn.weight[0, 3] += 0.1
        results[f"can_fail/{option}/perturbed_shard"] = compare(forward_backward(real, idx, tgt),
                                                                sims[f"{option}/fwd_bwd/{name(block_types)}"],
                                                                TOL["float64"], real)
    dropped = with_dropout(gpt, 0.2)
    real = DistributedGPT.from_gpt(dropped, pd.tp, ["tp"] * 4, pd=pd, sequence_parallel=True).double().train()
    real.group.token_offset = lambda n_held: 0
    results["can_fail/sp/mask_offset"] = compare(forward_backward(real, idx, tgt, dropout_key=(1337, 3, 1)),
                                                 sims[f"sp/dropout/{name(['tp'] * 4)}"], TOL["float64"], real)


def check_async(pd, gpt, results):
    """tp_overlap=2, all 'tp': the order of issues and waits of one forward pass, each issue in flight."""
    issue = strategies.reduce_from_tp_region_async

    def patch(fn):
        strategies.reduce_from_tp_region_async = fn

    try:
        log = log_async(patch)
        idx, tgt = batch(0)
        DistributedGPT.from_gpt(gpt, pd.tp, ["tp"] * 4, pd=pd, tp_overlap=2)(idx, tgt)
        results[f"async/log/rank{pd.tp_rank}"] = dict(log=log)
    finally:
        patch(issue)


def check_activation_memory(pd, gpt, results):
    """Bytes autograd saves for backward on this rank, all 'tp', fp32, dropout 0.2
    (keyed), with and without SP."""
    idx, tgt = batch(0)
    dropped = with_dropout(gpt, 0.2)
    for option, kw in (("plain", {}), ("sp", dict(sequence_parallel=True))):
        model = DistributedGPT.from_gpt(dropped, pd.tp, ["tp"] * 4, pd=pd, **kw).train()
        model.seed_dropout(1337, 3, 1)
        results[f"memory/{option}/rank{pd.tp_rank}"] = dict(bytes=measure_saved_bytes(model, idx, tgt))


def main(argv):
    out_dir = argv[0]
    pd = init_parallel(dp=1, tp=int(os.environ["WORLD_SIZE"]), device_type="cpu", backend="gloo")
    try:
        gpt = make_gpt()
        results = {}
        sims = check_real_equals_sim(pd, gpt, results)
        check_can_fail(pd, gpt, results, sims)
        check_async(pd, gpt, results)
        check_activation_memory(pd, gpt, results)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, results)
        if pd.is_master:
            merged = worst(per_rank)
            for rank, res in enumerate(per_rank):  # per rank, not merged
                merged[f"async/log/rank{rank}"] = res[f"async/log/rank{rank}"]["log"]
                for option in ("plain", "sp"):
                    key = f"memory/{option}/rank{rank}"
                    merged[key] = res[key]["bytes"]
            with open(os.path.join(out_dir, "results.json"), "w") as f:
                json.dump(dict(tp=pd.tp, results=merged), f, indent=1)
    finally:
        shutdown(pd)


if __name__ == "__main__":
    main(sys.argv[1:])
