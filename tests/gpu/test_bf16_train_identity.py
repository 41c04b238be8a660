"""The zeroed-c_proj identity in training passes under bf16 autocast
(tpcomm/gpu/bf16_identity.py).

1. Every block's c_proj zeroed: each block must leave the stream as it came, so the loss is GPT's exactly (0,
   not a tolerance: nothing differs but the route) for 'tp', 'spd' and 'parallel' at tp 2, 4 and 8 simulated
   and at real tp 2 (2 gloo processes), with each option that leaves the math unchanged, alone and combined as
   the validator allows, in train mode with gradients on. Before the fix tp_async_grad's fused fan-out handed
   the shards a bf16 copy of the stream and every 'parallel' block added tp times its rounding: 7.3e-5 (tp 2)
   to 1.0e-4 (tp 8) here.
2. The fused path's LayerNorms get input and weight in one dtype: CUDA's kernel refuses a mix that CPU's
   accepts, so a CPU test double of torch.native_layer_norm (and its backward) refuses it the same way, in
   simulated and real TP and under FSDP2 with a bf16 param_dtype (its gathered LayerNorm weights bf16, the
   stream fp32)."""

import os

import pytest
import torch
from test_bf16_identity import SIZES, batch, gpt
from test_cuda_path import spawn_gloo

from tensor_parallel_model import DistributedGPT
from tpcomm.gpu import bf16_identity as bi

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


def strict_layer_norm(monkeypatch):
    """torch.native_layer_norm and its backward as CUDA's kernels take them: input, weight and bias in one
    dtype (the fused path calls them directly; F.layer_norm's autocast rule covers the unfused path)."""
    forward, backward = torch.native_layer_norm, torch.ops.aten.native_layer_norm_backward
    seen = []

    def one_dtype(*tensors):
        dtypes = {t.dtype for t in tensors if t is not None}
        assert len(dtypes) == 1, f"layer norm given mixed dtypes {sorted(map(str, dtypes))}"
        seen.append(dtypes.pop())

    def checked_forward(x, shape, w, b, eps):
        one_dtype(x, w, b)
        return forward(x, shape, w, b, eps)

    def checked_backward(grad, x, shape, mean, rstd, w, b, mask):
        one_dtype(grad, x, w, b)
        return backward(grad, x, shape, mean, rstd, w, b, mask)

    monkeypatch.setattr(torch, "native_layer_norm", checked_forward)
    monkeypatch.setattr(torch.ops.aten, "native_layer_norm_backward", checked_backward)
    return seen


def simulated_grid(tps, kinds=bi.KINDS, *, bias_nudge=0.0):
    base = gpt(zero_proj=True)
    idx, targets = batch()
    ctx = torch.autocast(**BF16)
    want = bi.train_loss(base, idx, targets, ctx)

    def make(tp, block_types, options):
        model = DistributedGPT.from_gpt(base, tp, block_types, **options)
        with torch.no_grad():
            # one channel: ln_f undoes a shift of all
            model.transformer.h[1].mlp.c_proj.bias[0].add_(bias_nudge)
        return model

    return bi.train_grid(make, want, idx, targets, ctx, n_layer=SIZES["n_layer"], tps=tps, kinds=kinds)


def test_option_sets_are_the_validators():
    assert bi.option_sets(["tp"] * 4, 2) == [{}, dict(tp_async_grad=True), dict(tp_overlap=2),
                                             dict(sequence_parallel=True), dict(tp_async_grad=True,
                                                                                tp_overlap=2)]
    # nothing to overlap in 'parallel' blocks
    assert bi.option_sets(["parallel"] * 4, 8) == [{}, dict(tp_async_grad=True), dict(sequence_parallel=True)]


@pytest.mark.parametrize("tp", bi.TPS)
def test_zeroed_c_proj_loss_is_gpts_exactly_in_training(tp, monkeypatch):
    seen = strict_layer_norm(monkeypatch)
    dev = simulated_grid((tp,))
    assert len(dev) == 13, sorted(dev)  # 5 option sets for 'tp' and 'spd', 3 for 'parallel'
    assert set(dev.values()) == {0.0}, {k: v for k, v in dev.items() if v}
    # the fused path ran its LayerNorms (through the double), in fp32 under autocast
    assert torch.float32 in seen


def test_train_identity_can_fail():
    """Anti-vacuity: one c_proj bias element nudged by 0.05 moves every option's
    loss, and the grid sees it."""
    dev = simulated_grid((2,), ("parallel",), bias_nudge=0.05)
    assert len(dev) == 3 and min(dev.values()) > 0, dev


def test_strict_layer_norm_refuses_a_mix(monkeypatch):
    """The double refuses what CUDA's kernel refuses: an fp32 input with bf16 weights."""
    strict_layer_norm(monkeypatch)
    x, w = torch.randn(3, 8), torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="mixed dtypes"):
        torch.native_layer_norm(x, (8,), w, None, 1e-5)


def _real_grid(rank, world):
    """Real tp 2 on gloo: the grid of the simulated test, and GPT's loss computed on every rank."""
    from tpcomm.parallel.parallel_dims import init_parallel

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    pd = init_parallel(dp=1, tp=world, device_type="cpu")
    mp = pytest.MonkeyPatch()
    seen = strict_layer_norm(mp)
    try:
        base = gpt(zero_proj=True)
        idx, targets = batch()
        ctx = torch.autocast(**BF16)
        want = bi.train_loss(base, idx, targets, ctx)
        dev = bi.train_grid(lambda tp, block_types, options: DistributedGPT.from_gpt(base, tp, block_types,
                                                                                     pd=pd, **options), want,
                            idx, targets, ctx, n_layer=SIZES["n_layer"], tps=(world,))
    finally:
        mp.undo()
    return dict(dev=dev, fused_ln=torch.float32 in seen)


def test_zeroed_c_proj_loss_is_gpts_exactly_in_real_tp2(tmp_path):
    for result in spawn_gloo(_real_grid, 2, tmp_path):
        assert len(result["dev"]) == 13 and result["fused_ln"], result
        assert set(result["dev"].values()) == {0.0}, result["dev"]


def _fsdp_bf16_async(rank, world):
    """FSDP2 with CUDA's bf16 policy (blocks gathered in bf16, the stream fp32) and tp_async_grad, under bf16
    autocast with the strict LayerNorm double: one training step, its loss against one process's."""
    from tpcomm.train.build import build_model
    from tpcomm.parallel.data_parallel import apply_data_parallel
    from tpcomm.parallel.parallel_dims import init_parallel

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    pd = init_parallel(dp=world, tp=1, device_type="cpu")
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65, bias=True, dropout=0.0,
                tp_size=2, block_types=["spd", "parallel"], tp_async_grad=True)
    idx, targets = batch()
    mp = pytest.MonkeyPatch()
    seen = strict_layer_norm(mp)
    layer_norm = torch.nn.functional.layer_norm

    # as in tests/parallel/test_fsdp_precision.py:
    def cuda_autocast_layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
        if torch.is_autocast_enabled("cpu"):  # CUDA autocast's fp32 list has layer_norm, CPU's has not
            x, weight, bias = (None if t is None else t.float() for t in (x, weight, bias))
        return layer_norm(x, shape, weight, bias, eps)

    # the unfused LayerNorms (ln_f, ...)
    mp.setattr(torch.nn.functional, "layer_norm", cuda_autocast_layer_norm)
    try:
        torch.manual_seed(0)
        model = build_model("distributed_gpt", args)
        # CUDA's policy
        run = apply_data_parallel(model, pd, kind="fsdp", device_type="cuda", dtype="bfloat16")
        gathered = []
        model.transformer.h[0].register_forward_pre_hook(
            lambda m, a: gathered.append(str(m.ln_1.weight.dtype)))
        rows = slice(rank * 2, rank * 2 + 2)
        with torch.autocast(**BF16):
            _, loss = run(idx[rows] % 65, targets[rows] % 65)
        loss.backward()
    finally:
        mp.undo()
    return dict(loss=loss.item(), gathered=gathered, dtypes=sorted({str(d) for d in seen}))


def test_fsdp2_bf16_params_with_async_grad_give_layer_norm_one_dtype(tmp_path):
    for result in spawn_gloo(_fsdp_bf16_async, 2, tmp_path):
        # the mix the double would refuse was on offer
        assert result["gathered"] == ["torch.bfloat16"], result
        assert result["dtypes"] == ["torch.float32"], result  # every fused LayerNorm ran, in one dtype
        assert 3.0 < result["loss"] < 6.0, result  # a real loss (log 65 ~ 4.2), not a NaN
