"""
Hybrid sharded data parallelism (HSDP: FSDP2 over the 2-D mesh (dp_replicate, dp_shard), dp_shard < dp)
against one process, under torchrun on CPU with gloo, all checks in one launch (run by
tests/parallel/test_fsdp.py):
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=4 \
        tests/workers/hsdp_worker.py out.json
Layouts of the 4 processes: dp 4 = 2 replicas x 2 shards (GPT and simulated-TP DistributedGPT), and
dp 2 = 2 replicas x 1 shard x real tp 2 (the gradient norm summed over the shard dim of a 2-D mesh,
not over the replicas). Training as in fsdp_worker.py (3 AdamW steps, clipping active) with 2
micro-batches per rank (gradient accumulation); results as in real_tp_worker.py: `ratio` <= 1 means
assert_close passes at the tolerance.
"""

import os
import sys

import torch
from torch.distributed.tensor import Replicate, Shard

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsdp_worker import build, compare, meta_init_under_fsdp, one_process, train  # noqa: E402
from real_tp_worker import make_gpt, write_results  # noqa: E402
from tpcomm.parallel.data_parallel import apply_data_parallel  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402

MICRO = 8  # global micro-batches per step: 2 per rank at dp 4


def shard_only(model, pd):
    """FSDP over each replica's dp_shard group alone: no all-reduce across replicas (the can-fail case)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block, mesh=pd.mesh["dp_shard"])
    fully_shard(model, mesh=pd.mesh["dp_shard"])
    return model


def replicas_by_shards(gpt, results):
    """dp 4 = 2 replicas x 2 shards, tp 1. Returns the layout and one process's runs
    (replicas_by_real_tp's too)."""
    pd = init_parallel(dp=4, tp=1, dp_shard=2, device_type="cpu", backend="gloo")
    refs = one_process(gpt, ["gpt", "distributed_gpt"], micro=MICRO)
    for kind in ("gpt", "distributed_gpt"):
        ref = refs[kind]
        model = build(kind, gpt, pd)
        run = apply_data_parallel(model, pd, kind="fsdp", device_type="cpu")
        results[f"hsdp/{kind}"] = compare(train(model, run, pd, dp=pd.dp, micro=MICRO), ref)
        if kind == "gpt":
            # what the rank holds: half of each parameter (its dp_shard group's shard), the same as its
            # replica's
            w = model.transformer.h[0].mlp.c_fc.weight
            results["hsdp/holds_half"] = dict(ok=w.to_local().shape[0] == w.shape[0] // 2
                                              and w.placements == (Replicate(), Shard(0)))
            # the comparisons can fail: a weight changed on the last dp rank's shard before training ...
            model = build(kind, gpt, pd)
            if pd.dp_rank == pd.dp - 1:
                with torch.no_grad():
                    model.transformer.h[1].mlp.c_fc.weight[-1, 0] += 0.1  # a row of this rank's shard
            run = apply_data_parallel(model, pd, kind="fsdp", device_type="cpu")
            results["can_fail/hsdp/changed_shard"] = compare(train(model, run, pd, dp=pd.dp, micro=MICRO),
                                                             ref)
            # ... and sharding without the replicas' all-reduce: each replica steps on its own half of the
            # batch
            model = shard_only(build(kind, gpt, pd), pd)
            results["can_fail/hsdp/no_replica_reduce"] = compare(train(model, model, pd, dp=pd.dp,
                                                                       micro=MICRO), ref)
    # meta-device init under HSDP: each rank materialises its shard of GPT's init, bitwise
    results["hsdp/meta_init_exact"] = dict(ok=meta_init_under_fsdp(gpt, pd)[2])
    return pd, refs


def replicas_by_real_tp(gpt, results, ref):
    """dp 2 = 2 replicas x 1 shard, real tp 2: DistributedGPT's own clipping
    (grad_sq_sums) on a 2-D FSDP mesh."""
    pd = init_parallel(dp=2, tp=2, dp_shard=1, device_type="cpu", backend="gloo")
    model = build("distributed_gpt", gpt, pd)
    run = apply_data_parallel(model, pd, kind="fsdp", device_type="cpu")
    results["hsdp_x_tp/distributed_gpt"] = compare(train(model, run, pd, dp=pd.dp, micro=MICRO), ref)
    return pd


def main(argv):
    out_path = argv[0]
    assert int(os.environ["WORLD_SIZE"]) == 4
    pd, finished = None, False
    try:
        gpt, results = make_gpt(), {}
        pd, refs = replicas_by_shards(gpt, results)
        pd = replicas_by_real_tp(gpt, results, refs["distributed_gpt"])
        write_results(pd, results, out_path)
        finished = True
    finally:
        if pd is not None:
            shutdown(pd, finished=finished)


if __name__ == "__main__":
    main(sys.argv[1:])
