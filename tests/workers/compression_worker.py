"""
Compressed tensor-parallel reductions (tp_comm_dtype) under real TP (one shard per process: the compressed
partial sums are all-gathered as bytes, then dequantized and summed) against the simulation (every shard in
one process: each shard's partial sum quantized and dequantized, then summed), run under torchrun on CPU with
gloo by tests/tp/compress/test_compression.py, all checks in one launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/compression_worker.py OUT
Rank 0 writes OUT (json), per check the worst result over the ranks (tests/workers/real_tp_worker.py's
`ratio`: <= 1 is torch.testing.assert_close passing at TOL). The assertions live in the test file.

Tolerance: float64 models, real_tp_worker's TOL['float64'] (1e-9). Real and simulated runs add the same
terms in another order (~1e-16 relative), and the quantizer works in fp32 on the fp64 partial sums: the
two see the same fp32 values unless a partial sum sits within ~1e-16 of an fp32 rounding boundary (odds
~1e-9 per value), so both quantize alike and the results agree to ~1e-15; a value quantized differently
would move them by >1e-4.
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

from real_tp_worker import (TOL, VOCAB, batch, held_by, local_grads, make_gpt, name, ratio,  # noqa: E402
                            simulated)
from real_tp_worker import with_dropout, worst  # noqa: E402
from test_generate import stepwise_logits  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402

DTYPES = ("bf16", "fp8", "int8")
BLOCK = 8  # values per scale: 4 blocks of n_embd = 32
PATTERNS = [
    # both g kinds, the ladder's asynchronous ones, a final sync (desynced end)
    ["tp", "spd", "ladder", "parallel"],
    ["ladder", "ladder", "tp", "spd"],
]
COUNT_KEYS = ("fwd_allreduces", "compressed_allreduces", "compressed_bytes_per_token", "comm_bytes_per_token")


def build(gpt, pd, block_types, dtype, *, real, **options):
    model = DistributedGPT.from_gpt(gpt, pd.tp, block_types, pd=pd if real else None, tp_comm_dtype=dtype,
                                    tp_comm_block=BLOCK, **options)
    return model.double()


def forward_backward(model, idx, tgt, dropout_key=None):
    """Logits, loss, this rank's gradients and the pass's comm report."""
    model.zero_grad(set_to_none=True)
    model.reset_comm_counts()
    if dropout_key is not None:
        model.seed_dropout(*dropout_key)
    logits, loss = model(idx, tgt)
    loss.backward()
    model.sync_replicated_grads()
    report = model.comm_report(micro_steps=1, tokens=idx.numel())
    return dict(logits=logits, loss=loss, grads=local_grads(model)), {k: report.get(k) for k in COUNT_KEYS}


def compare(real_out, sim_out, real):
    """forward_backward of the real model `real` against the simulated one's (its
    gradients cut as real holds them)."""
    (a, counts_real), (b, counts_sim) = real_out, sim_out
    b = dict(b, grads=held_by(real, b["grads"]))
    out = {k: ratio(a[k], b[k], TOL["float64"]) for k in a}
    out["ratio"] = max(v["ratio"] for v in out.values())
    out["counts"] = [counts_real, counts_sim]
    return out


def check_forward_backward(pd, gpt, results):
    """Logits, loss and every gradient, real vs simulated, per dtype and pattern; dropout 0 and 0.2 (keyed
    masks); tp_overlap=2 (each chunk's g asynchronous)."""
    idx, tgt = batch(0)
    dropped = with_dropout(gpt, 0.2)
    cases = {}  # result key -> (weights, block types, dtype, options, dropout key)
    for dtype in DTYPES:
        for block_types in PATTERNS:
            key = f"{dtype}/{name(block_types)}"
            cases[f"fwd_bwd/{key}"] = (gpt, block_types, dtype, {}, None)
            cases[f"dropout/{key}"] = (dropped, block_types, dtype, {}, (1337, 3, 1))
        cases[f"overlap/{dtype}"] = (gpt, ["tp", "spd"] * 2, dtype, dict(tp_overlap=2), None)

    def run(source, block_types, dtype, options, dropout_key, *, real):
        model = build(source, pd, block_types, dtype, real=real, **options)
        return model, forward_backward(model if dropout_key is None else model.train(), idx, tgt, dropout_key)

    # compression on (real) against off (simulated): told apart, so the matches above are not vacuous
    *sims, off = simulated([lambda case=case: run(*case, real=False)[1] for case in cases.values()]
                           + [lambda: forward_backward(build(gpt, pd, PATTERNS[0], None, real=False), idx,
                                                       tgt)])
    for (label, case), sim in zip(cases.items(), sims):
        real, real_out = run(*case, real=True)
        results[label] = compare(real_out, sim, real)
    for dtype in DTYPES:
        real = build(gpt, pd, PATTERNS[0], dtype, real=True)
        results[f"can_fail/{dtype}_vs_off"] = compare(forward_backward(real, idx, tgt), off, real)


def decoded(model, prompt):
    """Greedy KV-cache decoding (20 new tokens) and the cached steps' logits over its tokens."""
    tokens = model.generate(prompt, 20, temperature=0, use_cache=True)
    return tokens, stepwise_logits(model, tokens, 5, cached=True)


def sampled(model, prompt):
    """Seeded sampling (top 20), 20 new tokens with the KV cache."""
    torch.manual_seed(11)
    return model.generate(prompt, 20, temperature=1.0, top_k=20, use_cache=True)


def check_decode(pd, gpt, results):
    """KV-cache decoding: the cached steps' logits and the generated tokens (greedy; seeded sampling) of real
    vs simulated, every rank holding the same tokens."""
    prompt = torch.randint(VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))

    def sim_run(block_types, dtype):
        model = build(gpt, pd, block_types, dtype, real=False).eval()
        return (*decoded(model, prompt), sampled(model, prompt))

    cases = [(dtype, block_types) for dtype in DTYPES for block_types in PATTERNS]
    *sims, off = simulated([lambda dtype=dtype, block_types=block_types: sim_run(block_types, dtype)
                            for dtype, block_types in cases]
                           + [lambda: decoded(build(gpt, pd, PATTERNS[0], None, real=False).eval(), prompt)])
    for (dtype, block_types), (tokens, sim_logits, sim_sampled) in zip(cases, sims):
        real = build(gpt, pd, block_types, dtype, real=True).eval()
        logits = stepwise_logits(real, tokens, 5, cached=True)
        real_sampled = sampled(real, prompt)
        every = [torch.empty_like(real_sampled) for _ in range(pd.tp)]
        dist.all_gather(every, real_sampled, group=pd.tp_group)
        same = torch.equal(real_sampled, sim_sampled) and all(torch.equal(e, real_sampled) for e in every)
        results[f"decode_logits/{dtype}/{name(block_types)}"] = ratio(logits, sim_logits, TOL["float64"])
        results[f"decode_tokens/{dtype}/{name(block_types)}"] = dict(ok=same)
    tokens, off_logits = off  # compression off: told apart from compressed real decoding
    real = build(gpt, pd, PATTERNS[0], "int8", real=True).eval()
    results["can_fail/decode_int8_vs_off"] = ratio(stepwise_logits(real, tokens, 5, cached=True), off_logits,
                                                   TOL["float64"])


def check_two_shot(pd, gpt, results):
    """tp_comm_exchange='two_shot' (an all-to-all of packed row chunks, then an all-gather of each
    rank's summed chunk packed again) against its simulation: training (the ladder's asynchronous
    g's included, dropout 0.2) and KV-cache decoding of one sequence, whose odd token counts pad the
    last chunk; told apart from one_shot."""
    idx, tgt = batch(0)
    prompt = torch.randint(VOCAB, (1, 5), generator=torch.Generator().manual_seed(9))
    two = dict(tp_comm_exchange="two_shot")
    dropped = with_dropout(gpt, 0.2)

    def run(block_types, dtype, *, real):
        """Two-shot, real or simulated: a model trained one pass (dropout 0.2) and that pass; greedy KV-cache
        tokens of an eval model, and that model."""
        trained = build(dropped, pd, block_types, dtype, real=real, **two).train()
        step = forward_backward(trained, idx, tgt, (1337, 3, 1))
        model = build(gpt, pd, block_types, dtype, real=real, **two).eval()
        return (trained, step), model.generate(prompt, 12, temperature=0, use_cache=True), model

    def sim_run(block_types, dtype):
        (_, step), tokens, model = run(block_types, dtype, real=False)
        return step, tokens, stepwise_logits(model, tokens, 5, cached=True)

    cases = [(dtype, block_types) for dtype in ("bf16", "int8") for block_types in PATTERNS]
    *sims, one_shot = simulated([lambda dtype=dtype, block_types=block_types: sim_run(block_types, dtype)
                                 for dtype, block_types in cases]
                                + [lambda: forward_backward(build(gpt, pd, PATTERNS[0], "int8", real=False),
                                                            idx, tgt)])
    for (dtype, block_types), (sim_step, tokens, sim_logits) in zip(cases, sims):
        key = f"{dtype}/{name(block_types)}"
        (trained, step), real_tokens, model = run(block_types, dtype, real=True)
        results[f"two_shot/fwd_bwd/{key}"] = compare(step, sim_step, trained)
        results[f"two_shot/decode_logits/{key}"] = ratio(stepwise_logits(model, tokens, 5, cached=True),
                                                         sim_logits, TOL["float64"])
        results[f"two_shot/decode_tokens/{key}"] = dict(ok=torch.equal(real_tokens, tokens))
    real = build(gpt, pd, PATTERNS[0], "int8", real=True, **two)
    results["can_fail/two_shot_vs_one_shot"] = compare(forward_backward(real, idx, tgt), one_shot, real)


def main(argv):
    out_path = argv[0]
    pd = init_parallel(dp=1, tp=int(os.environ["WORLD_SIZE"]), device_type="cpu", backend="gloo")
    try:
        gpt, results = make_gpt(), {}
        check_forward_backward(pd, gpt, results)
        check_decode(pd, gpt, results)
        check_two_shot(pd, gpt, results)
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, results)
        if pd.is_master:
            with open(out_path, "w") as f:
                json.dump(dict(tp=pd.tp, results=worst(per_rank)), f, indent=1)
    finally:
        shutdown(pd)


if __name__ == "__main__":
    main(sys.argv[1:])
