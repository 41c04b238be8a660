"""
Partial-channel sync ('caat' blocks, tpcomm/model/block_types/caat.py) under real tensor parallelism (one
shard per process, gloo) against the simulation, run by tests/tp/test_partial_sync.py in a shared launch
(conftest.shared_launch):
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/caat_worker.py out.json
Logits, loss and every gradient, fp32 and fp64, without and with dropout; comparisons reported
as real_tp_worker's `ratio` (<= 1: torch.testing.assert_close passes at its TOL). The
assertions live in the test file.
"""

import os
import sys

import torch

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from real_tp_worker import TOL, batch, compare_step, forward_backward, make_gpt, name, simulated  # noqa: E402
from real_tp_worker import with_dropout, write_results  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402

PATTERNS = [
    ["caat"] * 4,  # no final sync: each rank's ln_f and vocabulary slice read its own stream
    ["parallel", "caat", "tp", "caat"],  # a fully desynced stream entering 'caat'; 'caat' entering 'tp'
    ["caat", "spd", "caat", "parallel"],  # 'caat' entering 'spd' and 'parallel'; ends with the final sync
]
FRACTIONS = (0.5, 0.25)  # the paper's main setting, and another whole number of channels (N_EMBD = 32)
KEY = (1337, 3, 1)  # a dropout key: (seed, iteration, micro-step)


def build(gpt, pd, block_types, p, dtype, *, real):
    """DistributedGPT of gpt at pd's tp size, caat_sync_fraction p, in dtype: real TP over pd (a head
    reading each rank's stream splits wte/lm_head by vocabulary there by itself), or simulated (its head
    slicing the whole weight)."""
    model = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd if real else None, caat_sync_fraction=p)
    assert model.vocab_parallel == (real and block_types[-1] == "caat")
    return model.to(dtype)


def step(model, idx, tgt, **kw):
    """forward_backward, a private head's logits gathered as GPT's (B, T, V)."""
    logits, *rest = forward_backward(model, idx, tgt, **kw)
    return (model.gathered_logits(logits, idx.shape), *rest)


def check(pd, gpt, results):
    idx, tgt = batch(0)
    sources = {"fwd_bwd": (gpt, None), "dropout": (with_dropout(gpt, 0.2), KEY)}  # weights, dropout key
    cases = [(kind, dtype, block_types, p) for dtype in ("float32", "float64") for block_types in PATTERNS
             for p in FRACTIONS for kind in sources]

    def run(kind, dtype, block_types, p, *, real):
        source, key = sources[kind]
        model = build(source, pd, block_types, p, getattr(torch, dtype), real=real)
        return model, step(model if key is None else model.train(), idx, tgt, dropout_key=key)

    sims = simulated([lambda case=case: run(*case, real=False)[1] for case in cases])
    for case, sim_out in zip(cases, sims):
        kind, dtype, block_types, p = case
        real, real_out = run(*case, real=True)
        results[f"{kind}/{dtype}/{name(block_types)}/p={p}"] = compare_step(real_out, sim_out, TOL[dtype],
                                                                            real)
    # the comparisons can fail: one weight of the last rank's shard perturbed; the other fraction
    block_types = PATTERNS[0]
    sim_out = sims[cases.index(("fwd_bwd", "float64", block_types, 0.5))]
    real = build(gpt, pd, block_types, 0.5, torch.float64, real=True)
    if pd.tp_rank == pd.tp - 1:
        with torch.no_grad():
            real.transformer.h[1].mlp.c_fc.weight[0, 3] += 0.1
    results["can_fail/perturbed_shard"] = compare_step(step(real, idx, tgt), sim_out, TOL["float64"], real)
    real = build(gpt, pd, block_types, 0.25, torch.float64, real=True)
    results["can_fail/other_fraction"] = compare_step(step(real, idx, tgt), sim_out, TOL["float64"], real)


def main(argv):
    pd = init_parallel(dp=1, tp=int(os.environ["WORLD_SIZE"]), device_type="cpu", backend="gloo")
    try:
        results = {}
        check(pd, make_gpt(), results)
        write_results(pd, results, argv[0])
    finally:
        shutdown(pd)


if __name__ == "__main__":
    main(sys.argv[1:])
