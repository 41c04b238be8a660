"""Block-quantized tensor-parallel reductions (tp_comm_dtype, docs/compression.md): the quantizer's
error bounds, the simulated model against the per-shard reference of test_tensor_parallel.py with
its sums made the quantized sum written here from the equations, compression off = the plain
all-reduces bit for bit, counted bytes = the compressed payloads, real tp=2 = simulated
(tests/workers/compression_worker.py under torchrun), bad input."""

import json

import pytest
import torch

import test_tensor_parallel
from conftest import TINY, metrics, one_line_error, run_script, shared_launch, train
from tpcomm.errors import ConfigError
from test_generate import stepwise_logits
from test_tensor_parallel import (N_EMBD, assert_same, batch, make_gpt, run, run_keyed, run_reference,
                                  with_dropout)
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig
from tpcomm.tp.compress.compression import QMAX, Codec
from tpcomm.bench.compression_errors import error_table, main, reduction_errors

DTYPES = ("bf16", "fp8", "int8")


def activations(seed=0, shape=(4, 6, 64)):
    """Heavy-tailed values with one all-zero block (values 0..7 of row 0) and one
    tiny block (8..15 of row 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) ** 3
    x[0, 0, :8] = 0
    x[0, 1, 8:16] *= 1e-30
    return x


# ---------- the quantizer ----------

@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_error_bounds(dtype):
    """Per value: int8 rounds to a step of scale = absmax/127, |err| <= scale/2; fp8
    e4m3 keeps 3 mantissa bits,
    |err| <= |x|/16 for normal values and <= scale * 2^-10 (half its subnormal step) below; bf16 keeps 8
    significant bits, |err| <= |x| 2^-8. The slack 1e-6 relative is fp32's rounding
    of x / scale and q * scale."""
    block = 8
    codec, x = Codec(dtype, block), activations()
    err = (codec.roundtrip(x) - x).abs()
    xb = x.unflatten(-1, (-1, block))
    scale = (xb.abs().amax(-1, keepdim=True) / QMAX.get(dtype, 1.0)).expand_as(xb).flatten(-2)
    bound = dict(int8=scale / 2, fp8=torch.maximum(x.abs() / 16, scale * 2 ** -10),
                 bf16=x.abs() * 2 ** -8)[dtype]
    assert (err <= bound * (1 + 1e-6) + 1e-45).all(), (err - bound).max()
    assert (err / bound)[bound > 0].max() > 0.5  # some value comes near the bound: it is the quantizer's own
    assert (codec.roundtrip(x)[0, 0, :8] == 0).all()  # an all-zero block stays zero (scale 1, not 0/0)
    assert (codec.roundtrip(x)[0, 1, 8:16] != 0).any()  # a tiny block keeps its own scale


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_bytes_are_the_payload_and_unpack_to_the_roundtrip(dtype):
    codec, x = Codec(dtype, 16), activations(1).double()
    payloads = torch.stack([codec.pack(s) for s in x])  # what each of 4 ranks sends
    assert payloads.dtype == torch.uint8 and payloads.shape[1] == codec.payload_bytes(x[0].numel())
    assert torch.equal(codec.unpack(payloads, x.shape[1:], x.dtype), codec.roundtrip(x))  # real = simulated
    per_value = dict(bf16=2, fp8=1 + 4 / 16, int8=1 + 4 / 16)[dtype]
    assert codec.payload_bytes(x[0].numel()) == per_value * x[0].numel()


def test_a_non_finite_value_spoils_its_block_only():
    x = activations(2)
    x[1, 2, 3], x[2, 3, 20] = float("inf"), float("nan")
    for dtype in ("fp8", "int8"):
        y = Codec(dtype, 8).roundtrip(x)
        assert not y[1, 2, :8].isfinite().any() and not y[2, 3, 16:24].isfinite().any()
        bad = torch.zeros_like(x, dtype=torch.bool)
        bad[1, 2, :8] = bad[2, 3, 16:24] = True
        assert y[~bad].isfinite().all()


# ---------- the model against the per-shard reference ----------

def quantized_sum(dtype, block, exchange="one_shot"):
    """sum_i deq(s_i) over a list of shard partial sums, written from docs/compression.md: fp32 arithmetic,
    shard order, the gradient reaching every s_i unchanged (straight-through, g's backward); two_shot: that
    sum's deq(q(.)) again, as it is all-gathered."""
    def deq(s):
        v = s.detach().float()
        if dtype == "bf16":
            d = v.to(torch.bfloat16).float()
        else:
            b = v.reshape(*v.shape[:-1], v.shape[-1] // block, block)
            scale = b.abs().amax(-1, keepdim=True) / QMAX[dtype]
            scale = torch.where(scale == 0, torch.ones_like(scale), scale)
            y = (b / scale).clamp(-QMAX[dtype], QMAX[dtype])
            y = torch.round(y) if dtype == "int8" else y.to(torch.float8_e4m3fn).float()
            d = (y * scale).reshape(v.shape)
        return s + (d.to(s.dtype) - s).detach()

    def total(parts):
        out = 0
        for s in parts:
            out = out + deq(s)
        return deq(out) if exchange == "two_shot" else out
    return total


REF_PATTERNS = [["tp", "parallel", "ladder", "ladder"], ["parallel", "spd", "tp", "parallel"]]


def reference_gpt(block_types):
    """fp64 GPT; for 'spd' blocks attention's c_proj bias is zeroed: the model sums b_A/tp inside each shard's
    partial sum where the reference adds b_A after the sum, the same without compression, not with it."""
    gpt = make_gpt().double()
    if "spd" in block_types:
        with torch.no_grad():
            for block in gpt.transformer.h:
                block.attn.c_proj.bias.zero_()
    return gpt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_types", REF_PATTERNS, ids=["-".join(p) for p in REF_PATTERNS])
def test_simulated_equals_per_shard_reference(dtype, block_types, monkeypatch):
    """Logits, loss and every gradient, fp64, tp=4, block 8. Tolerance 1e-9: the model and the reference
    add the same terms in another order (~1e-16 relative); both quantize in fp32 the same fp64 sums,
    which agree to ~1e-16 and so round to the same fp32 values but for odds of ~1e-9 per value, while one
    value quantized differently (or a reduction compressed that should not be, or not one that should)
    moves the results by >1e-4."""
    tol = dict(rtol=1e-9, atol=1e-9)
    gpt, (idx, tgt) = reference_gpt(block_types), batch()
    model = DistributedGPT.from_gpt(gpt, 4, block_types, tp_comm_dtype=dtype, tp_comm_block=8).double()
    got = run(model, idx, tgt)
    plain = run_reference(gpt, idx, tgt, 4, block_types)
    # its every sum is a g
    monkeypatch.setattr(test_tensor_parallel, "sum", quantized_sum(dtype, 8), raising=False)
    assert_same(got, run_reference(gpt, idx, tgt, 4, block_types), **tol)
    with pytest.raises(AssertionError):  # compression changes the results: the match above is not vacuous
        assert_same(got, plain, **tol)
    if dtype == "bf16":  # a plain cast: no blocks
        return
    with pytest.raises(AssertionError):  # the block size matters
        assert_same(run(DistributedGPT.from_gpt(gpt, 4, block_types, tp_comm_dtype=dtype,
                                                tp_comm_block=16).double(), idx, tgt), got, **tol)


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_two_shot_simulated_equals_per_shard_reference(dtype, monkeypatch):
    """tp_comm_exchange='two_shot': the sum of the dequantized partials quantized and dequantized once more,
    as in the reference written above (fp64, tp=4, block 8, tolerance as above); told apart from one_shot."""
    tol, block_types = dict(rtol=1e-9, atol=1e-9), REF_PATTERNS[1]
    gpt, (idx, tgt) = reference_gpt(block_types), batch()
    model = DistributedGPT.from_gpt(gpt, 4, block_types, tp_comm_dtype=dtype, tp_comm_block=8,
                                    tp_comm_exchange="two_shot").double()
    got = run(model, idx, tgt)
    one_shot = run(DistributedGPT.from_gpt(gpt, 4, block_types, tp_comm_dtype=dtype,
                                           tp_comm_block=8).double(), idx, tgt)
    monkeypatch.setattr(test_tensor_parallel, "sum", quantized_sum(dtype, 8, "two_shot"), raising=False)
    assert_same(got, run_reference(gpt, idx, tgt, 4, block_types), **tol)
    with pytest.raises(AssertionError):  # the second quantization changes the results
        assert_same(got, one_shot, **tol)
    # the same payload per rank counted as one_shot's (bench: wire bytes)
    counts = model.comm_per_forward(idx)
    assert counts["compressed_allreduces"] == counts["fwd_allreduces"] > 0


def test_compressed_model_stays_close_to_uncompressed():
    """int8 with 32-value blocks moves an fp32 model's loss by far less than
    training noise (measured ~1e-5)."""
    gpt, (idx, tgt) = make_gpt(), batch()
    kinds = ["tp", "spd", "ladder", "parallel"]
    off = DistributedGPT.from_gpt(gpt, 4, kinds)(idx, tgt)[1]
    on = DistributedGPT.from_gpt(gpt, 4, kinds, tp_comm_dtype="int8")(idx, tgt)[1]
    assert on.item() == pytest.approx(off.item(), rel=1e-3) and on.item() != off.item()


# ---------- off: what it was, bit for bit ----------

def plain_collectives(model):
    """model with g bound to the plain all-reduce, as before compression existed
    (sum_shards, sum_shards_async)."""
    model.group.sum_partials, model.group.sum_partials_async = (model.group.sum_shards,
                                                                model.group.sum_shards_async)
    return model


@pytest.mark.parametrize("block_types", [["tp", "spd", "ladder", "parallel"], ["ladder", "tp", "spd", "tp"]])
def test_off_is_the_plain_all_reduce_bit_for_bit(block_types):
    gpt, (idx, tgt) = make_gpt(), batch()
    models = [DistributedGPT.from_gpt(gpt, 4, block_types, tp_comm_dtype=None) for _ in range(2)]
    plain_collectives(models[1])
    a, b = run(models[0], idx, tgt), run(models[1], idx, tgt)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and all(torch.equal(a[2][k], b[2][k])
                                                                       for k in a[2])
    dropped = [DistributedGPT.from_gpt(with_dropout(gpt, 0.2), 4, block_types, tp_overlap=3)
               for _ in range(2)]
    plain_collectives(dropped[1])
    a, b = run_keyed(dropped[0], idx, tgt), run_keyed(dropped[1], idx, tgt)
    assert torch.equal(a[0], b[0]) and all(torch.equal(a[2][k], b[2][k]) for k in a[2])
    tokens = models[0].eval().generate(idx[:, :4], 12, temperature=0)
    assert torch.equal(stepwise_logits(models[0], tokens, 4, cached=True),
                       stepwise_logits(models[1].eval(), tokens, 4, cached=True))
    report = models[0].comm_per_forward(idx)
    assert report == models[1].comm_per_forward(idx) and "compressed_allreduces" not in report


# ---------- counts ----------

@pytest.mark.parametrize("dtype", DTYPES)
def test_counted_bytes_are_the_compressed_payload(dtype):
    """Every forward g moves compressed (scales included); f's backward all-reduces and the vocab-parallel
    collectives stay fp32 (4 bytes a value)."""
    gpt, (idx, _) = make_gpt(), batch()
    block_types = ["tp", "spd", "ladder", "parallel"]
    on = DistributedGPT.from_gpt(gpt, 4, block_types, tp_comm_dtype=dtype, tp_comm_block=8,
                                 loss_parallel=True).comm_per_forward(idx)
    off = DistributedGPT.from_gpt(gpt, 4, block_types, loss_parallel=True).comm_per_forward(idx)
    fwd = on["fwd_allreduces"]
    assert fwd == off["fwd_allreduces"] == 2 + 1 + 2 + 1 and on["compressed_allreduces"] == fwd
    per_token = Codec(dtype, 8).payload_bytes(N_EMBD)  # one token's C values
    assert on["compressed_bytes_per_token"] == fwd * per_token
    assert on["comm_bytes_per_token"] == fwd * per_token + on["bwd_allreduces"] * N_EMBD * 4
    assert off["comm_bytes_per_token"] == (fwd
                                           + off["bwd_allreduces"]) * N_EMBD * 4 > on["comm_bytes_per_token"]
    # the vocab-parallel ones: not compressed
    assert on["vocab_bytes_per_token"] == off["vocab_bytes_per_token"]


def test_error_table():
    """The command's table (heavy-tailed data, quick): one row per dtype and block, smaller
    blocks more accurate, bf16 (2 bytes a value) the most, every error below 5%; bytes ratio vs
    fp32: 1.25/4 at block 16."""
    rows = reduction_errors(source="heavy", tps=(2, 4), blocks=(16, 128))
    two = {(r["dtype"], r["block"]): r for r in rows if r["exchange"] == "two_shot"}
    by = {(r["dtype"], r["block"]): r for r in rows if r["exchange"] == "one_shot"}
    assert set(by) == {("bf16", None), ("fp8", 16), ("fp8", 128), ("int8", 16), ("int8", 128)}
    assert set(two) == {("bf16", None), ("fp8", 32), ("int8", 32)}  # the second quantization adds its error
    assert all(two[k]["err_tp4"] > by[k]["err_tp4"] for k in [("bf16", None)])
    for tp in (2, 4):
        e = {k: r[f"err_tp{tp}"] for k, r in by.items()}
        for dtype in ("fp8", "int8"):
            assert e[(dtype, 16)] < e[(dtype, 128)] < 0.05
        assert min(e, key=e.get) == ("bf16", None) and e[("bf16", None)] > 0
    assert by[("int8", 16)]["bytes_ratio"] == (1 + 4 / 16) / 4
    assert error_table(rows).count("\n") == len(rows) + 1
    assert main(["nonsense"]) == 2


# ---------- bad input ----------

@pytest.mark.parametrize("options, words", [
    (dict(tp_comm_dtype="int4"), ["tp_comm_dtype", "'int4'", "'fp8'"]),
    (dict(tp_comm_dtype="int8", tp_comm_block=0), ["tp_comm_block", "0"]),
    (dict(tp_comm_dtype="int8", tp_comm_block=2.0), ["tp_comm_block", "2.0"]),
    (dict(tp_comm_dtype="int8", tp_comm_block=True), ["tp_comm_block", "True"]),
    (dict(tp_comm_dtype="int8", tp_comm_block=12), ["tp_comm_block (12)", "n_embd (32)"]),
    (dict(tp_comm_dtype="fp8", tp_size=1), ["tp_comm_dtype='fp8'", "tp_size=1"]),
    (dict(tp_comm_dtype="int8", sequence_parallel=True), ["tp_comm_dtype='int8'", "sequence_parallel=True"]),
    (dict(tp_comm_dtype="int8", tp_comm_exchange="ring"), ["tp_comm_exchange", "'ring'", "'two_shot'"]),
    (dict(tp_comm_exchange="two_shot"), ["tp_comm_exchange='two_shot'", "tp_comm_dtype"]),
])
def test_config_refuses_bad_compression(options, words):
    with pytest.raises(ConfigError) as e:
        TPConfig(**{**dict(n_layer=2, n_head=4, n_embd=32, tp_size=2), **options})
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("args, words", [(["--tp_comm_dtype=int4"], ["tp_comm_dtype", "'int4'"]),
                                         (["--tp_comm_dtype=int8", "--tp_comm_block=5"],
                                          ["tp_comm_block (5)", "n_embd (32)"]), (["--tp_comm_dtype=int8",
                                                                                   "--tp_comm_block=-1"],
                                                                                  ["tp_comm_block", "-1"]),
                                         (["--tp_comm_dtype=fp8", "--tp_size=1"], ["tp_comm_dtype='fp8'",
                                                                                   "tp_size=1"]),
                                         (["--tp_comm_dtype=int8", "--sequence_parallel=True"],
                                          ["tp_comm_dtype='int8'", "sequence_parallel=True"]),
                                         (["--tp_comm_exchange=two_shot"], ["tp_comm_exchange='two_shot'",
                                                                            "tp_comm_dtype"]),])
def test_train_refuses_bad_compression(tmp_path, char_data, args, words):
    r = run_script("train.py", "config/train_shakespeare_char_spd.py", *TINY, f"--data_dir={char_data}",
                   f"--out_dir={tmp_path / 'out'}", *args, timeout=120)
    line = one_line_error(r)
    assert all(w in line for w in words), line
    assert not (tmp_path / "out").exists()


# ---------- train.py and real tensor parallelism ----------

def test_train_logs_compressed_bytes(tmp_path, char_data):
    """train.py with tp_comm_dtype='int8' (2 spd blocks, tp=2): each logged step counts 2 compressed forward
    all-reduces of 32 + 4 bytes a token (n_embd 32, one fp32 scale)."""
    out = tmp_path / "run"
    train(out, char_data, "config/train_shakespeare_char_spd.py", "--max_iters=4", "--lr_decay_iters=4",
          "--tp_comm_dtype=int8")
    records = [r for r in metrics(out) if "loss" in r]
    assert records and all(r["compressed_allreduces"] == 2 == r["fwd_allreduces"] for r in records)
    assert all(r["compressed_bytes_per_token"] == 2 * (32 + 4) for r in records)


# tests/workers/compression_worker.py in the shared launch of 2 processes (conftest.shared_launch)
SHARED_LAUNCHES = {"real_results": {None: (2, ["tests/workers/compression_worker.py", "{dir}/results.json"])}}


@pytest.fixture(scope="module")
def real_results(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)["results"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_real_tp2_equals_simulated(real_results, dtype):
    """Real tp=2 (compressed partial sums all-gathered as bytes, gloo) against simulated, fp64 (worker's TOL):
    logits, loss, gradients with dropout 0 and 0.2, tp_overlap=2, and the counts; KV-cache decoding's logits
    and tokens on every rank."""
    checks = {k: v for k, v in real_results.items() if k.split("/")[1] == dtype
              and not k.startswith("can_fail")}
    assert len(checks) == 2 * 2 + 1 + 2 * 2, sorted(checks)
    for key, result in checks.items():
        if "ok" in result:
            assert result["ok"], key
            continue
        assert result["ratio"] <= 1.0, (key, json.dumps(result))
        if "counts" in result:
            real, sim = result["counts"]
            assert real == sim and real["compressed_allreduces"] == real["fwd_allreduces"] > 0, key


def test_real_tp2_two_shot_equals_simulated(real_results):
    """Real tp=2 two_shot (all-to-all, then all-gather, both of packed bytes) against its
    simulation, fp64 (the worker's TOL): training with dropout, the ladder's asynchronous
    reductions, decoding with padded chunks."""
    checks = {k: v for k, v in real_results.items() if k.startswith("two_shot/")}
    assert len(checks) == 3 * 2 * 2, sorted(checks)
    for key, result in checks.items():
        assert result["ok"] if "ok" in result else result["ratio"] <= 1.0, (key, json.dumps(result))
        if "counts" in result:
            real, sim = result["counts"]
            assert real == sim and real["compressed_allreduces"] == real["fwd_allreduces"] > 0, key
    assert real_results["can_fail/two_shot_vs_one_shot"]["ratio"] > 10


def test_real_tp2_comparisons_can_fail(real_results):
    """Compressed real runs against the uncompressed simulation: told apart (training and decoding)."""
    for dtype in DTYPES:
        assert real_results[f"can_fail/{dtype}_vs_off"]["ratio"] > 10
    assert real_results["can_fail/decode_int8_vs_off"]["ratio"] > 10
