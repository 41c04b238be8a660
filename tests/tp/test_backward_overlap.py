"""tp_async_grad: f's backward all-reduce issued asynchronously, in Megatron's order (input-gradient GEMM,
issue, weight-gradient GEMM, wait), and with tp_overlap=K or 'ladder' blocks each chunk's (module's) backward
all-reduce waited for only after the other chunks' (the attention's) backward has run (docs/overlap.md).
Simulated here, against the blocking path and the per-shard reference; real TP under torchrun
(tests/workers/backward_overlap_worker.py): bitwise equal to the blocking path, equal to the simulation, and a
profiler trace per rank from which the order of issues and waits, and the compute between them, is read."""

import json

import pytest
import torch
from conftest import TINY, TORCHRUN, one_line_error, run_script
from test_tensor_parallel import assert_same, batch, make_gpt, run_reference, with_dropout

import tpcomm.tp.async_grad
from backward_overlap_worker import PATTERNS
from tpcomm.errors import ConfigError
from real_tp_worker import name
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig

KEY = (1337, 7, 2)  # keyed dropout: both paths draw the same masks


def ks(block_types):
    return (1, 3) if {"tp", "spd"} & set(block_types) else (1,)  # batch() has 3 sequences


def step(model, idx, tgt, key=KEY):
    model.zero_grad(set_to_none=True)
    model.seed_dropout(*key)
    logits, loss = model(idx, tgt)
    loss.backward()
    return [logits, loss, *(p.grad for p in model.parameters())]


def assert_bitwise(a, b):
    assert len(a) == len(b) > 2
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max().item()


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_async_equals_blocking_bitwise(tp, block_types):
    """float32, dropout 0.2 (keyed), K = 1 and 3: the fused f + projection runs the unfused path's ops in its
    order, so logits, loss and every gradient are bit for bit the blocking path's."""
    gpt = with_dropout(make_gpt(), 0.2)
    idx, tgt = batch()
    for K in ks(block_types):
        fused = DistributedGPT.from_gpt(gpt, tp, block_types, tp_overlap=K, tp_async_grad=True).train()
        plain = DistributedGPT.from_gpt(gpt, tp, block_types, tp_overlap=K).train()
        assert_bitwise(step(fused, idx, tgt), step(plain, idx, tgt))


def test_bitwise_comparison_can_fail(monkeypatch):
    """The fused path runs (its own LayerNorm call: another epsilon there moves the results), and the
    comparison sees one gradient element one float32 step (ulp) away."""
    gpt = with_dropout(make_gpt(), 0.2)
    idx, tgt = batch()
    blocks = ["tp", "ladder", "ladder", "spd"]
    plain = step(DistributedGPT.from_gpt(gpt, 2, blocks).train(), idx, tgt)
    fused = step(DistributedGPT.from_gpt(gpt, 2, blocks, tp_async_grad=True).train(), idx, tgt)
    assert_bitwise(fused, plain)
    fused[5].view(-1)[0] = torch.nextafter(fused[5].view(-1)[0], torch.tensor(float("inf")))
    with pytest.raises(AssertionError):
        assert_bitwise(fused, plain)
    monkeypatch.setattr(tpcomm.tp.async_grad, "LN_EPS", 1e-3)
    with pytest.raises(AssertionError):
        assert_bitwise(step(DistributedGPT.from_gpt(gpt, 2, blocks, tp_async_grad=True).train(), idx, tgt),
                       plain)


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_equals_the_per_shard_reference(block_types):
    """float64 against docs/model.md's equations shard by shard (test_tensor_parallel.run_reference), 1e-10 as
    in tests/tp/test_overlap.py."""
    gpt = make_gpt().double()
    idx, tgt = batch()
    for K in ks(block_types):
        model = DistributedGPT.from_gpt(gpt, 2, block_types, tp_overlap=K, tp_async_grad=True).double()
        logits, loss = model(idx, tgt)
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        assert_same((logits, loss, grads), run_reference(gpt, idx, tgt, 2, block_types), rtol=1e-10,
                    atol=1e-10)


def test_counts_are_the_blocking_ones():
    """The same backward all-reduces (one per f), the same bytes; eval passes and
    generation run the plain path."""
    gpt = make_gpt()
    idx, tgt = batch()
    for block_types in PATTERNS:
        one = DistributedGPT.from_gpt(gpt, 2, block_types).comm_per_forward(idx)
        fused = DistributedGPT.from_gpt(gpt, 2, block_types, tp_async_grad=True).comm_per_forward(idx)
        assert fused == one and fused["bwd_allreduces"] > 0
    fused = DistributedGPT.from_gpt(gpt, 2, PATTERNS[4], tp_async_grad=True).eval()
    plain = DistributedGPT.from_gpt(gpt, 2, PATTERNS[4]).eval()
    assert torch.equal(fused.generate(idx[:, :4], 6, temperature=0),
                       plain.generate(idx[:, :4], 6, temperature=0))


@pytest.mark.parametrize("bad", [1, "True", None])
def test_config_refuses_a_non_bool(bad):
    with pytest.raises(ConfigError, match="tp_async_grad must be True or False"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, tp_async_grad=bad)


def test_config_refuses_sequence_parallel():
    with pytest.raises(ConfigError, match=r"tp_async_grad=True does not run with sequence_parallel=True"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, tp_async_grad=True, sequence_parallel=True)
    for kw in (dict(tp_overlap=2), dict(tp_comm_dtype="int8"), dict(loss_parallel=True)):  # these combine
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, tp_async_grad=True, **kw)


def test_train_refuses_sequence_parallel_in_one_line(tmp_path, char_data):
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path}",
                   "--model_type=distributed_gpt", "--tp_size=2", "--tp_async_grad=True",
                   "--sequence_parallel=True")
    assert "tp_async_grad=True does not run with sequence_parallel=True" in one_line_error(r)


# Compiled (simulated and real TP) with tp_async_grad, tp_overlap=2, the ladder and int8:
# tests/model/test_compile.py's VARIANTS.


# ---------- real tensor parallelism (torchrun, gloo) ----------

@pytest.fixture(scope="module")
def real2(tmp_path_factory):
    out = tmp_path_factory.mktemp("backward_overlap2")
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "tests/workers/backward_overlap_worker.py", str(out),
                   timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return json.loads((out / "results.json").read_text())["results"]


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_real_async_equals_blocking_and_the_simulation(real2, block_types):
    """Real TP at tp 2: bitwise equal to the blocking path (float32, dropout, K = 1 and 2; the ladder's also
    without dropout); equal to the simulated asynchronous path in float64 (real_tp_worker.TOL: 1e-9)."""
    for K in (1, 2) if {"tp", "spd"} & set(block_types) else (1,):
        assert real2[f"tp2/equal/{name(block_types)}/K{K}"]["ok"]
        sim = real2[f"tp2/sim/{name(block_types)}/K{K}"]
        assert sim["ratio"] <= 1.0, sim
    if "ladder" in block_types:  # and without dropout (the ladder's pending biases unmasked)
        assert real2[f"tp2/equal/{name(block_types)}/p0"]["ok"]
    assert not real2["can_fail/tp2/perturbed_shard"]["ok"]


def test_real_training_is_bitwise_the_blocking_one(real2):
    """3 AdamW steps with clipping and dropout: losses, gradient norms and weights bit for bit."""
    assert real2["tp2/train/tp-ladder-ladder-spd/K1"]["ok"] and real2["tp2/train/tp-tp-tp-tp/K2"]["ok"]


def test_real_backward_all_reduces_are_in_flight_beside_compute(real2):
    """From each rank's profiler trace of one training step (f_async spans: the issue, then 'wait ...'): all
    'tp': every backward all-reduce's wait comes after its module's weight-gradient GEMM (1 matmul between);
    tp_overlap=2: per module both chunks' all-reduces are issued before the first wait, and the first one
    issued (chunk 1's) has chunk 0's backward matmuls between its issue and its wait; all 'ladder': each MLP's
    all-reduce is waited for after all of the attention's backward matmuls of its layer, and each attention's
    (but the first layer's) after all of the previous layer's MLP's."""
    for rank in (0, 1):
        plain, chunked, ladder = (real2[f"order/{label}/rank{rank}"] for label in ("tp", "tp-overlap2",
                                                                                   "ladder"))
        module = [("issue", "mlp"), ("wait", "mlp"), ("issue", "attn"), ("wait", "attn")]
        assert [(e[0], e[2]) for e in plain["log"]] == module * 4
        assert [e[1] for e in plain["log"]] == [3] * 4 + [2] * 4 + [1] * 4 + [0] * 4
        assert all(n == 1 for *_, n in plain["between"])  # its own weight-gradient GEMM
        pair = [("issue", "mlp"), ("issue", "mlp"), ("wait", "mlp"), ("wait", "mlp"),
                ("issue", "attn"), ("issue", "attn"), ("wait", "attn"), ("wait", "attn")]
        assert [(e[0], e[2]) for e in chunked["log"]] == pair * 4
        first, second = chunked["between"][0::2], chunked["between"][1::2]
        assert all(n > 1 for *_, n in first) and all(n >= 1 for *_, n in second)
        # layer l: MLP l's all-reduce waited for after attention l's whole backward (its projection's GEMMs
        # included), attention l's after MLP l-1's; layer 0's attention waits inline (no block before it)
        ladder_log = [("issue", 3, "mlp"), ("issue", 3, "attn"), ("wait", 3, "mlp")]
        for layer in (2, 1):
            ladder_log += [("issue", layer, "mlp"), ("wait", layer + 1, "attn"), ("issue", layer, "attn"),
                           ("wait", layer, "mlp")]
        ladder_log += [("issue", 0, "mlp"), ("wait", 1, "attn"), ("issue", 0, "attn"), ("wait", 0, "attn"),
                       ("wait", 0, "mlp")]
        assert [tuple(e) for e in ladder["log"]] == ladder_log
        between = {(layer, site): n for layer, site, n in ladder["between"]}
        # attention l's 4 (c_proj 2, c_attn 2), own 1
        assert all(between[layer, "mlp"] == 5 for layer in range(4))
        # MLP l-1's 4 (c_proj 2, c_fc 2), own 1
        assert all(between[layer, "attn"] == 5 for layer in (1, 2, 3))
        assert between[0, "attn"] == 1  # its own weight-gradient GEMM: no module before it


@pytest.fixture(scope="module")
def real4(tmp_path_factory):
    out = tmp_path_factory.mktemp("backward_overlap4")
    r = run_script(*TORCHRUN, "--nproc_per_node=4", "tests/workers/backward_overlap_worker.py", str(out),
                   timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return json.loads((out / "results.json").read_text())["results"]


@pytest.mark.slow
def test_real_tp4_fsdp2_and_pipeline_equal_blocking(real4):
    """4 processes: tp 4 (bitwise, and == the simulation in float64), FSDP2 and DDP over dp 2 x tp 2 (3
    training steps, bitwise) and pp 2 x tp 2 (GPipe, one step's loss and gradients, bitwise)."""
    for pattern in ("tp-tp-tp-tp", "tp-ladder-ladder-spd"):
        for K in (1, 2):
            assert real4[f"tp4/equal/{pattern}/K{K}"]["ok"]
            assert real4[f"tp4/sim/{pattern}/K{K}"]["ratio"] <= 1.0
    assert real4["fsdp/dp2tp2/train"]["ok"] and real4["ddp/dp2tp2/train"]["ok"]
    assert real4["pp/pp2tp2/step"]["ok"]
