"""sequence_parallel=True (Megatron-LM, arXiv 2205.05198): between blocks the synced stream is sharded
along the tokens; f is an all-gather (backward reduce-scatter), g a reduce-scatter (backward all-gather).
Simulated (fp64) against GPT and the per-shard reference of docs/model.md, dropout equal to the run
without SP, the measured counts (reduce-scatters and all-gathers apart from all-reduces, with bytes), the
validation, the activation-memory prediction, and under torchrun (tests/workers/overlap_sp_worker.py)
real == simulated and the measured saving."""

import json

import pytest
import torch
from conftest import TINY, one_line_error, run_script
from test_overlap import overlap_sp_real  # noqa: F401  (the shared torchrun launch)
from test_tensor_parallel import (N_EMBD, assert_same, batch, make_gpt, run, run_keyed, run_reference,
                                  with_dropout)

from tpcomm.errors import ConfigError
from overlap_sp_worker import PATTERNS
from real_tp_worker import name
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig
from tpcomm.costmodel.activation_memory import predicted_activation_bytes

# float64: the same products as without SP; a desynced stream is synced as sum_i r_i - (tp-1) xbar instead of
# xbar + sum_i d_i (another rounding of the same sum): measured <1e-15, so 1e-10 is tight while a wrong token
# shard, bias or mask moves results by >1e-3 (the *_can_fail tests).
TOL = dict(rtol=1e-10, atol=1e-10)
ALL = PATTERNS + [["parallel"] * 4]


def model(gpt, tp, block_types, **kw):
    return DistributedGPT.from_gpt(gpt, tp, block_types, sequence_parallel=True, **kw).double()


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("block_types", ALL, ids=[name(p) for p in ALL])
def test_equals_the_per_shard_reference(tp, block_types):
    gpt = make_gpt().double()
    idx, tgt = batch()
    out = run(model(gpt, tp, block_types), idx, tgt)
    assert_same(out, run_reference(gpt, idx, tgt, tp, block_types), **TOL)
    if block_types == ["tp"] * 4:
        assert_same(out, run(gpt, idx, tgt), **TOL)  # all 'tp' is GPT


@pytest.mark.parametrize("block_types", [["tp"] * 4, ["parallel", "tp", "parallel", "spd"]],
                         ids=["tp", "mixed"])
def test_dropout_equals_without_sp(block_types):
    """Keyed dropout 0.2: a token shard's replica masks are the whole batch's rows (a row offset), so SP draws
    the masks the run without SP draws; another key does not match."""
    gpt = with_dropout(make_gpt(), 0.2).double()
    idx, tgt = batch()
    ref = run_keyed(DistributedGPT.from_gpt(gpt, 2, block_types).double(), idx, tgt)
    sp = model(gpt, 2, block_types)
    assert_same(run_keyed(sp, idx, tgt), ref, **TOL)
    with pytest.raises(AssertionError):
        assert_same(run_keyed(sp, idx, tgt, (1337, 8, 2)), ref, **TOL)


def test_comparisons_can_fail():
    gpt = make_gpt().double()
    idx, tgt = batch()
    for block_types in (["tp"] * 4, ["parallel", "tp", "parallel", "spd"]):
        sp = model(gpt, 2, block_types)
        with torch.no_grad():
            sp.transformer.h[1].mlp.c_proj.bias[3] += 0.01  # a bias added on the token shard
        with pytest.raises(AssertionError):
            assert_same(run(sp, idx, tgt), run_reference(gpt, idx, tgt, 2, block_types), **TOL)


@pytest.mark.parametrize("tp", [2, 4])
def test_counts_reduce_scatters_and_all_gathers_apart(tp):
    """Per forward: 2 reduce-scatters and 2 all-gathers per 'tp' block, 1 + 1 per 'spd', 1 all-gather per
    'parallel' entered synced, the final gather (and a reduce-scatter when the stream ends desynced);
    backward mirrors them (each all-gather's backward a reduce-scatter and vice versa; the embedding
    scatter's backward is an all-gather, the final gather's backward moves nothing). No all-reduce.
    Bytes: each the whole (N, C) buffer."""
    gpt = make_gpt()
    idx, _ = batch()
    expect = {("tp",) * 4: (8, 9), ("spd",) * 4: (4, 5), ("parallel", "tp", "parallel", "spd"): (3, 4),
              ("tp", "spd", "spd", "parallel"): (4, 6)}
    for block_types, (rs, ag) in expect.items():
        comm = DistributedGPT.from_gpt(gpt, tp, list(block_types),
                                       sequence_parallel=True).comm_per_forward(idx)
        rs += block_types[-1] == "parallel"
        assert (comm["fwd_reduce_scatters"], comm["fwd_all_gathers"]) == (rs, ag), (block_types, comm)
        assert (comm["bwd_all_gathers"], comm["bwd_reduce_scatters"]) == (rs + 1, ag - 1), (block_types, comm)
        assert comm["fwd_allreduces"] == comm["bwd_allreduces"] == 0 and comm["comm_bytes_per_token"] == 0
        assert comm["sp_bytes_per_token"] == (2 * rs + 2 * ag) * N_EMBD * 4
    plain = DistributedGPT.from_gpt(gpt, tp).comm_per_forward(idx)
    # without SP: the keys are absent
    assert "fwd_reduce_scatters" not in plain and plain["fwd_allreduces"] == 8


def test_generation_with_sp_equals_without():
    """A KV cache's one-token steps do not split into token shards: those passes run
    without SP (same function)."""
    gpt = make_gpt()
    idx, tgt = batch()
    for block_types in (["tp"] * 4, ["parallel", "tp", "parallel", "spd"]):
        sp = DistributedGPT.from_gpt(gpt, 2, block_types, sequence_parallel=True).eval()
        ref = DistributedGPT.from_gpt(gpt, 2, block_types).eval()
        assert torch.equal(sp.generate(idx[:2, :4], 6, temperature=0),
                           ref.generate(idx[:2, :4], 6, temperature=0))
    sp.train()
    with pytest.raises(ConfigError, match=r"sequence_parallel=True needs .* 69\) divisible by tp_size \(2\)"):
        sp(idx[:, :23], tgt[:, :23])


def test_config_refuses_ladder_and_overlap():
    with pytest.raises(ConfigError, match="sequence_parallel=True does not run with 'ladder'"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, block_types=["tp", "ladder"],
                 sequence_parallel=True)
    with pytest.raises(ConfigError, match="tp_overlap=2"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, tp_overlap=2, sequence_parallel=True)
    with pytest.raises(ConfigError, match="sequence_parallel must be True or False"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, sequence_parallel="yes")


def test_train_refuses_tokens_tp_does_not_divide(tmp_path, char_data):
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path}",
                   "--model_type=distributed_gpt", "--n_head=3", "--n_embd=48", "--tp_size=3",
                   "--batch_size=1", "--block_size=32", "--sequence_parallel=True")
    line = one_line_error(r)
    assert "sequence_parallel=True" in line and "tp_size (3)" in line, line


def test_activation_prediction_is_megatrons_formula():
    s, b, h, a, t = 2048, 4, 4096, 32, 8
    kw = dict(batch_size=b, seq_len=s, n_embd=h, n_head=a, tp=t)
    assert predicted_activation_bytes(**kw, sequence_parallel=False) == s * b * h * (10 + 24 / t + 5 * a * s
                                                                                     / (h * t))
    assert predicted_activation_bytes(**kw, sequence_parallel=True) == s * b * h / t * (34 + 5 * a * s / h)
    assert predicted_activation_bytes(**dict(kw, tp=1), sequence_parallel=False) == s * b * h * (34 + 5 * a
                                                                                                 * s / h)


# ---------- real tensor parallelism (the shared torchrun launch, 2 gloo processes) ----------

@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_real_equals_simulated(overlap_sp_real, block_types):
    """fp64, tolerance 1e-9 (real_tp_worker.TOL): rank j holds tokens [j N/tp, (j+1) N/tp) of the stream, the
    simulation all of them; the same counts, without and with keyed dropout."""
    for check in ("fwd_bwd", "dropout"):
        result = overlap_sp_real[f"sp/{check}/{name(block_types)}"]
        assert result["ratio"] <= 1.0, json.dumps(result)
        assert (result["counts"]["real"] == result["counts"]["sim"]
                and result["counts"]["real"]["fwd_reduce_scatters"])


def test_real_comparisons_can_fail(overlap_sp_real):
    assert overlap_sp_real["can_fail/sp/perturbed_shard"]["ratio"] > 10
    # every rank drawing token shard 0's masks
    assert overlap_sp_real["can_fail/sp/mask_offset"]["ratio"] > 10


def test_real_sp_saves_activation_memory(overlap_sp_real):
    """Measured bytes autograd saves for backward per rank: less with SP (the token-sharded LN inputs, biases
    and replica masks), the same on both ranks."""
    for rank in (0, 1):
        plain, sp = overlap_sp_real[f"memory/plain/rank{rank}"], overlap_sp_real[f"memory/sp/rank{rank}"]
        assert sp < plain, (plain, sp)
