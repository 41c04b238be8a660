"""The scaling behind docs/gpu.md's simulated-tp-8 memory table (tpcomm/costmodel/activation_memory.py main):
per token and layer a pass saves a * n_embd bytes of activations plus autocast's bf16 weight copies, and the
fit separates the two: the copies come out at 2 bytes a parameter (bf16) whatever the widths fitted, and the
activations' a predicts a third width's measurement."""

import pytest

from tpcomm.costmodel import activation_memory as am

PROBE = dict(am.PROBE, block_size=64)


def test_fit_finds_bf16_weight_copies_and_predicts_another_width():
    a, w = am.per_token_fit("gpt", widths=(128, 256), probe=PROBE)
    assert w == pytest.approx(2.0, rel=0.02)  # bf16: 2 bytes per block parameter, not per token
    n = PROBE["batch_size"] * PROBE["block_size"]
    c = 384
    one, two = (am.saved_bytes("gpt", n_layer=k, n_embd=c, **PROBE) for k in (1, 2))
    # exact up to what scales with neither (attention's per-head statistics): 1%
    assert (two - one) / n == pytest.approx(a * c + w * 12 * c * c / n, rel=0.01)


def test_training_bytes_by_hand():
    shape = ("x", 2, 100)  # 2 layers of width 100: 240,000 block parameters
    got = am.training_bytes(shape, 40.0, 2.0, (1000.0, 8.0), tokens=10, vocab=50)
    params = 240_000 + 50 * 100
    assert got == 16 * params + 2.0 * 240_000 + 10 * (2 * 40.0 * 100 + 1000.0 + 8.0 * 50)
