"""tp_overlap = K (Domino-style, arXiv 2409.15241): a 'tp' or 'spd' block runs its batch in K chunks of whole
sequences, each chunk's all-reduce issued asynchronously so the next chunk computes meanwhile. Against K = 1
and the per-shard reference of docs/model.md (fp64), dropout masks (keyed) equal K = 1's, the measured counts
(K times the all-reduces, each 1/K of the bytes, all asynchronous), the validation, and under torchrun
(tests/workers/overlap_sp_worker.py, 2 gloo processes) real == simulated with each chunk's all-reduce in
flight while the next chunk is issued."""

import json

import pytest
import torch
from conftest import TINY, one_line_error, run_script, shared_launch
from test_tensor_parallel import (N_LAYER, assert_same, batch, make_gpt, run, run_keyed, run_reference,
                                  with_dropout)

from tpcomm.errors import ConfigError
from real_tp_worker import name
from overlap_sp_worker import PATTERNS
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig
from tpcomm.tp import dropout as keyed_dropout

# float64: a chunk's matmuls sum the same products as the whole batch's (rows are independent), the chunks'
# results are concatenated; measured differences <1e-16, so 1e-10 is tight while a wrong chunk offset or a
# missing chunk moves results by >1e-3 (the *_can_fail tests).
TOL = dict(rtol=1e-10, atol=1e-10)
K = 3  # batch() has 3 sequences: chunks of one sequence each


def model(gpt, tp, block_types, **kw):
    return DistributedGPT.from_gpt(gpt, tp, block_types, **kw).double()


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_chunked_equals_unchunked_and_the_per_shard_reference(tp, block_types):
    gpt = make_gpt().double()
    idx, tgt = batch()
    out = run(model(gpt, tp, block_types, tp_overlap=K), idx, tgt)
    assert_same(out, run(model(gpt, tp, block_types), idx, tgt), **TOL)
    assert_same(out, run_reference(gpt, idx, tgt, tp, block_types), **TOL)


@pytest.mark.parametrize("block_types", [["tp"] * 4, ["parallel", "tp", "parallel", "spd"]],
                         ids=["tp", "mixed"])
def test_dropout_masks_are_the_unchunked_ones(block_types):
    """Keyed dropout 0.2: each chunk draws the whole batch's masks for its rows (a row offset in tokens, in
    sequences for the attention probabilities), so K = 3 equals K = 1; without the offset (every chunk drawing
    rows from 0) it does not, nor with another key."""
    gpt = with_dropout(make_gpt(), 0.2).double()
    idx, tgt = batch()
    ref = run_keyed(model(gpt, 2, block_types), idx, tgt)
    chunked = model(gpt, 2, block_types, tp_overlap=K)
    assert_same(run_keyed(chunked, idx, tgt), ref, **TOL)
    with pytest.raises(AssertionError):
        assert_same(run_keyed(chunked, idx, tgt, (1337, 8, 2)), ref, **TOL)


def test_dropout_comparison_can_fail(monkeypatch):
    gpt = with_dropout(make_gpt(), 0.2).double()
    idx, tgt = batch()
    ref = run_keyed(model(gpt, 2, ["tp"] * 4), idx, tgt)
    keep_mask = keyed_dropout.keep_mask
    monkeypatch.setattr(keyed_dropout, "keep_mask", lambda *a, offset=0, **kw: keep_mask(*a, **kw))
    with pytest.raises(AssertionError):
        assert_same(run_keyed(model(gpt, 2, ["tp"] * 4, tp_overlap=K), idx, tgt), ref, **TOL)


def test_keep_mask_rows_are_the_whole_masks_rows():
    key = keyed_dropout.DropoutKey()
    key.set((1, 2, 3), "cpu")
    whole = keyed_dropout.keep_mask((2, 12, 8), 0.3, key.tensor, layer=1, site=1, streams=(1, 2),
                                    device="cpu")
    part = keyed_dropout.keep_mask((2, 4, 8), 0.3, key.tensor, layer=1, site=1, streams=(1, 2), device="cpu",
                                   offset=4 * 8)  # from row 4 of each stream's (12, 8) part
    assert torch.equal(part, whole[:, 4:8]) and not torch.equal(part, whole[:, :4])


def test_comparisons_can_fail():
    gpt = make_gpt().double()
    idx, tgt = batch()
    chunked = model(gpt, 2, ["tp", "spd", "spd", "parallel"], tp_overlap=K)
    with torch.no_grad():
        chunked.transformer.h[1].attn.c_attn.weight[2 * 32 + 16, 3] += 0.1  # a v row of shard 1
    with pytest.raises(AssertionError):
        assert_same(run(chunked, idx, tgt), run_reference(gpt, idx, tgt, 2, chunked.config.block_types),
                    **TOL)


@pytest.mark.parametrize("block_types,fwd", [(["tp"] * 4, 8), (["spd"] * 4, 4),
                                             (["tp", "spd", "spd", "parallel"], 5)])
def test_counts_k_times_the_all_reduces_each_1_over_k_of_the_bytes(block_types, fwd):
    """Each chunked all-reduce is counted (K per site, asynchronous); bytes per token are K = 1's; the final
    sync after a last 'parallel' block is not chunked (nothing follows it to overlap)."""
    gpt = make_gpt()
    idx, _ = batch()
    one = DistributedGPT.from_gpt(gpt, 2, block_types).comm_per_forward(idx)
    comm = DistributedGPT.from_gpt(gpt, 2, block_types, tp_overlap=K).comm_per_forward(idx)
    chunked = fwd - (block_types[-1] == "parallel")
    assert one["fwd_allreduces"] == fwd and one["async_allreduces"] == 0
    assert comm["fwd_allreduces"] == K * chunked + (fwd - chunked)
    assert comm["async_allreduces"] == K * chunked and comm["bwd_allreduces"] == comm["fwd_allreduces"]
    assert comm["comm_bytes_per_token"] == one["comm_bytes_per_token"]


def test_generation_and_small_batches_run_unchunked():
    """With a KV cache, or outside training on a batch K does not divide, a block runs one chunk (same
    function); in training such a batch is an error naming the values."""
    gpt = make_gpt()
    idx, tgt = batch()
    m = DistributedGPT.from_gpt(gpt, 2, ["tp", "spd"] * 2, tp_overlap=2).eval()
    ref = DistributedGPT.from_gpt(gpt, 2, ["tp", "spd"] * 2).eval()
    assert torch.equal(m.generate(idx[:, :4], 6, temperature=0), ref.generate(idx[:, :4], 6, temperature=0))
    m.train()
    with pytest.raises(ConfigError, match=r"tp_overlap=2 .* got batch 3"):
        m(idx, tgt)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_config_refuses_bad_tp_overlap(bad):
    with pytest.raises(ConfigError, match="tp_overlap"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, tp_overlap=bad)


@pytest.mark.parametrize("blocks", [["ladder"] * 2, ["parallel"] * 2, ["ladder", "parallel"]])
def test_config_refuses_tp_overlap_with_nothing_to_chunk(blocks):
    with pytest.raises(ConfigError, match=r"tp_overlap=2 has nothing to overlap.*block_types=\['"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, tp_overlap=2, block_types=blocks)
    # one block: runs
    TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, tp_overlap=2, block_types=["ladder", "spd"])


def test_train_refuses_a_batch_k_does_not_divide(tmp_path, char_data):
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path}",
                   "--model_type=distributed_gpt", "--tp_size=2", "--tp_overlap=3")
    line = one_line_error(r)
    assert "tp_overlap (3)" in line and "batch_size (4)" in line, line


# ---------- real tensor parallelism (torchrun, 2 gloo processes), shared with test_sequence_parallel.py
# ----------

# tests/workers/overlap_sp_worker.py in the shared launch of 2 processes (conftest.shared_launch)
SHARED_LAUNCHES = {"overlap_sp_real": {None: (2, ["tests/workers/overlap_sp_worker.py", "{dir}"])}}


@pytest.fixture(scope="session")
def overlap_sp_real(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)["results"]


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_real_equals_simulated(overlap_sp_real, block_types):
    """fp64, tolerance 1e-9 (real_tp_worker.TOL), without and with keyed dropout; the same counts."""
    for check in ("fwd_bwd", "dropout"):
        result = overlap_sp_real[f"overlap2/{check}/{name(block_types)}"]
        assert result["ratio"] <= 1.0, json.dumps(result)
        assert result["counts"]["real"] == result["counts"]["sim"]
        assert result["counts"]["real"]["async_allreduces"] > 0


def test_real_chunks_overlap(overlap_sp_real):
    """Each rank, all 'tp', K = 2: both chunks' attention all-reduces are issued (in flight: a work
    handle) before the first is waited for; each chunk's MLP all-reduce is issued before the next
    chunk's attention is waited for."""
    layer = [("issue", "attn"), ("issue", "attn"), ("wait", "attn"), ("issue", "mlp"), ("wait", "attn"),
             ("issue", "mlp"), ("wait", "mlp"), ("wait", "mlp")]
    for rank in (0, 1):
        log = overlap_sp_real[f"async/log/rank{rank}"]
        assert [(e[0], e[2]) for e in log] == layer * N_LAYER and [e[1] for e in log] == sorted(e[1]
                                                                                                for e in log)
        assert all(e[3] for e in log if e[0] == "issue")


def test_real_comparison_can_fail(overlap_sp_real):
    assert overlap_sp_real["can_fail/overlap2/perturbed_shard"]["ratio"] > 10
