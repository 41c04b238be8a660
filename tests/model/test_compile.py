"""torch.compile traces the models once: no recompile after warm-up (the dropout key is a
tensor updated in place, never a Python value or a new torch.Generator dynamo would guard on),
and compiled losses equal eager ones.

Backends: 'aot_eager' traces exactly what inductor receives (dynamo's guards and recompiles are the backend's
inputs, not its outputs) in seconds; one case compiles a masked branch with inductor to check the generated
code's masks (the int64 hash) equal eager's."""

import json

import pytest
import torch
import torch._dynamo
from torch.nn import functional as F

from compile_check import STEPS, WARMUP, run_steps
from conftest import shared_launch
from tpcomm.tp.dropout import ATTN_OUT, DropoutKey, keep_mask

# aot_eager runs the same aten ops as eager: measured bitwise equal; 1e-6 leaves room for op reordering.
# inductor fuses and reorders float reductions: ~1e-7 relative per op in fp32, measured < 2e-6 on these
# losses.
TOL = {"aot_eager": 1e-6, "inductor": 1e-5}
# Hide, delay, shrink: every option in three models, compiled simulated (here) and real (the shared launch):
# the chunked forward and asynchronous backward all-reduces with the ladder's delayed ones and int8 partial
# sums; sequence parallelism's reduce-scatter / all-gather with the vocabulary-parallel loss; the two-shot
# int8 exchange.
VARIANTS = [dict(tp_overlap=2, tp_comm_dtype="int8", tp_async_grad=True, block_types=["ladder", "tp"]),
            dict(sequence_parallel=True, loss_parallel=True),
            dict(tp_comm_dtype="int8", tp_comm_exchange="two_shot", block_types=["ladder", "tp"])]
VARIANT_IDS = ["overlap2-int8-async-ladder", "sp-loss_parallel", "int8-2shot-ladder"]
# tests/workers/compile_worker.py in the shared launch of 2 processes (conftest.shared_launch)
SHARED_LAUNCHES = {"real_plain": {None: (2, ["tests/workers/compile_worker.py", "{dir}/compile.json"])},
                   "real_variants": {None: (2, ["tests/workers/compile_worker.py", "{dir}/compile.json",
                                                json.dumps(VARIANTS)])},}


@pytest.fixture(scope="module")
def real_plain(request):
    return json.loads((shared_launch(request, SHARED_LAUNCHES) / "compile.json").read_text())


@pytest.fixture(scope="module")
def real_variants(request):
    return json.loads((shared_launch(request, SHARED_LAUNCHES) / "compile.json").read_text())


@pytest.mark.parametrize("model_type", ["gpt", "distributed_gpt"])
def test_compiled_traces_once_and_equals_eager(model_type):
    r = run_steps(model_type, 0.1)
    assert not r["recompiled"]
    assert r["graph_breaks"] == 0  # one graph per mode: simulated f/g and the counters trace into it
    assert len(r["compiled"]) == WARMUP + STEPS
    assert r["compiled"] == pytest.approx(r["eager"], rel=TOL["aot_eager"])
    assert r["compiled_counts"] == r["eager_counts"]  # a compiled step counts the collectives it runs
    if model_type == "distributed_gpt":
        assert r["eager_counts"][0][:2] == [3, 3]  # ['tp', 'spd']: forward g 2 + 1, backward f 2 + 1
    # the keys matter: successive steps draw other masks, so the equality is not vacuous
    assert len({round(x, 6) for x in r["eager"]}) == len(r["eager"])


@pytest.mark.parametrize("extra", VARIANTS, ids=VARIANT_IDS)
def test_hide_delay_shrink_compile_once_and_equal_eager(extra):
    """Chunked overlap, the asynchronous backward, sequence parallelism, the vocabulary-parallel loss,
    compressed reductions and the ladder block trace into one graph too (simulated)."""
    r = run_steps("distributed_gpt", 0.1, extra=extra)
    assert not r["recompiled"] and r["graph_breaks"] == 0 and r["unique_graphs"] == 2
    assert len(r["compiled"]) == WARMUP + STEPS
    assert r["compiled"] == pytest.approx(r["eager"], rel=TOL["aot_eager"])
    assert r["compiled_counts"] == r["eager_counts"]


def test_recompile_detection_can_fail():
    """A forward that reads a Python value changing every step (as a per-step generator seed did) recompiles,
    and the check above would see it."""
    class Stepped(torch.nn.Module):
        step = 0

        def forward(self, x):
            return x * self.step

    m = Stepped()
    run = torch.compile(m, backend="aot_eager")
    torch._dynamo.reset()
    run(torch.ones(2))
    m.step = 1
    # the first change specializes the int dynamically or recompiles once; allowed in warm-up
    run(torch.ones(2))
    torch._dynamo.config.error_on_recompile = True
    try:
        with pytest.raises(torch._dynamo.exc.RecompileError):
            m.step = 2.5  # a float where an int was: a guard fails, so dynamo would trace again
            run(torch.ones(2))
    finally:
        torch._dynamo.config.error_on_recompile = False


def masked_branch(key):
    """A residual branch as the blocks draw it: a keyed mask (tp shards' streams 1 and 2, a chunk's offset) on
    a GELU of a matmul, returned beside the branch's output."""
    def branch(x, w):
        h = F.gelu(x @ w)
        mask = keep_mask(h.shape, 0.1, key.tensor, layer=3, site=ATTN_OUT, streams=(1, 2), device=x.device,
                         offset=64)
        return x + h * mask, mask
    return branch


@pytest.mark.slow
def test_inductor_masks_equal_eager():
    """inductor writes its own C++ for the int64 hash (aot_eager runs eager's ops): the masks it
    computes equal eager's bit for bit, fused into a branch forward and backward, step after step
    with the key changed in place. Only the hash: the model's other ops are inductor's own to lower,
    and on a cold cache each C++ kernel takes 4-6 s to build (a whole 2-layer GPT's 29 kernels: 122
    s; this branch's 4: 26 s; docs/tests.md)."""
    key = DropoutKey()
    eager, compiled = masked_branch(key), torch.compile(masked_branch(key), backend="inductor")
    g = torch.Generator().manual_seed(0)
    x0, w0 = torch.randn(8, 16, 32, generator=g), torch.randn(32, 32, generator=g) / 32 ** 0.5
    masks = []
    for step in range(3):
        key.set((1337, step, 0), "cpu")
        outs = []
        for run in (eager, compiled):
            x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
            y, mask = run(x, w)
            (y * y).sum().backward()
            outs.append((y.detach(), mask, x.grad, w.grad))
        (y_e, m_e, gx_e, gw_e), (y_c, m_c, gx_c, gw_c) = outs
        assert torch.equal(m_c, m_e)  # the hash: bit for bit
        # fp32 sums over 128 rows in another order: 1e-5 of each tensor's largest value
        for a, b in ((y_c, y_e), (gx_c, gx_e), (gw_c, gw_e)):
            torch.testing.assert_close(a, b, rtol=TOL["inductor"], atol=TOL["inductor"]
                                       * b.abs().max().item())
        masks.append(m_e)
    # the masks are not vacuous: a tenth dropped, and each step's key draws other ones
    assert 0.08 < (masks[0] == 0).float().mean() < 0.12
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])


def test_real_tp_compiled_traces_once_and_equals_eager(real_plain):
    [result] = real_plain
    # the collectives are functional, in the graph
    assert not result["recompiled"] and result["graph_breaks"] == 0
    assert result["compiled"] == pytest.approx(result["eager"], rel=TOL["aot_eager"])
    assert result["compiled_counts"] == result["eager_counts"]


def test_real_tp_hide_delay_shrink_compiled_equal_eager(real_variants):
    """Real mode's asynchronous all-reduces (chunks, ladder, the asynchronous backward), compressed exchanges,
    sequence parallelism's reduce-scatter / all-gather and the vocabulary-parallel loss: one graph, compiled
    == eager, no recompile, the same counts."""
    results = real_variants
    assert len(results) == len(VARIANTS)
    for result in results:
        assert not result["recompiled"] and result["graph_breaks"] == 0
        assert result["unique_graphs"] == 2  # training (forward + backward) and evaluation (no_grad)
        assert result["compiled"] == pytest.approx(result["eager"], rel=TOL["aot_eager"])
        assert result["compiled_counts"] == result["eager_counts"]
    fwd, bwd, nbytes = results[0]["eager_counts"][0][:3]
    assert (fwd, bwd) == (6, 6)  # ladder 2 + tp 2 modules x 2 chunks: the variant ran
    assert nbytes < 1024  # int8 forward partial sums: fewer bytes than the 1,024 B/token uncompressed
    assert results[1]["eager_counts"][0][:2] == [0, 0]  # sequence parallel: reduce-scatters, not all-reduces
    # reduce-scatters; the vocabulary-parallel loss's all-reduces
    assert results[1]["eager_counts"][0][3:] == [3, 5]
