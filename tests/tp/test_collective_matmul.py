"""tp_collective_matmul (tpcomm/tp/collective_matmul.py): sequence parallelism's all-gather + column GEMM and
row GEMM + reduce-scatter as tp ring steps of peer-to-peer transfers beside partial GEMMs, forward and
backward. Simulated (fp64) against plain sequence parallelism and GPT, dropout included; the ring functions
against plain matmuls (tp 1, 3) and by gradcheck; the ring's counted bytes; the validation; and under torchrun
(tests/workers/collective_matmul_worker.py, gloo, tp 2 and 4) real == plain SP in fp32 with dropout, the same
counts as simulated, every transfer beside a GEMM."""

import json

import pytest
import torch
from conftest import TINY, one_line_error, run_script, shared_launch
from test_tensor_parallel import N_EMBD, N_LAYER, assert_same, batch, make_gpt, run, run_keyed, with_dropout

from tpcomm.errors import ConfigError
from real_tp_worker import TOL as REAL_TOL
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig
from tpcomm.tp.collective_matmul import all_gather_matmul, matmul_reduce_scatter
from tpcomm.tp.collectives import SimulatedTP
from tpcomm.tp.sequence_parallel import gather_to_tp_region, reduce_scatter_from_tp_region

# float64: the ring forms the same products as plain SP; only the order of the tp partial sums of a
# reduce-scatter differs (the ring's order, not sum(0)'s): measured <1e-15, so 1e-10 is tight while a wrong
# chunk, shard or missing step moves results by >1e-3 (test_comparisons_can_fail).
TOL = dict(rtol=1e-10, atol=1e-10)


def model(gpt, tp, *, ring=True):
    return DistributedGPT.from_gpt(gpt, tp, ["tp"] * N_LAYER, sequence_parallel=True,
                                   tp_collective_matmul=ring).double()


@pytest.mark.parametrize("tp", [2, 4])
def test_equals_plain_sequence_parallelism_and_gpt(tp):
    gpt = make_gpt().double()
    idx, tgt = batch()
    out = run(model(gpt, tp), idx, tgt)
    assert_same(out, run(model(gpt, tp, ring=False), idx, tgt), **TOL)
    assert_same(out, run(gpt, idx, tgt), **TOL)  # all 'tp' is GPT


def test_dropout_equals_plain_sequence_parallelism():
    """Keyed dropout 0.2: the attention probabilities' masks per shard, the replica masks on the token shard
    (after the reduce-scatter ring, as after plain SP's reduce-scatter); another key does not match."""
    gpt = with_dropout(make_gpt(), 0.2).double()
    idx, tgt = batch()
    ref = run_keyed(model(gpt, 2, ring=False), idx, tgt)
    assert_same(run_keyed(model(gpt, 2), idx, tgt), ref, **TOL)
    with pytest.raises(AssertionError):
        assert_same(run_keyed(model(gpt, 2), idx, tgt, (1337, 8, 2)), ref, **TOL)


def test_comparisons_can_fail():
    gpt = make_gpt().double()
    idx, tgt = batch()
    ring = model(gpt, 2)
    with torch.no_grad():
        ring.transformer.h[1].mlp.c_fc.weight[40, 3] += 0.01  # shard 1's hidden unit 8
    with pytest.raises(AssertionError):
        assert_same(run(ring, idx, tgt), run(model(gpt, 2, ring=False), idx, tgt), **TOL)


@pytest.mark.parametrize("tp", [1, 3])
def test_ring_functions_equal_the_plain_collectives(tp):
    """all_gather_matmul == gather_to_tp_region then bmm (+ bias); matmul_reduce_scatter == bmm then
    reduce_scatter_from_tp_region; forward and both gradients (tp 1: one step, no transfer: a plain matmul;
    tp 3: an odd ring)."""
    g = torch.Generator().manual_seed(0)
    N, C, K = 6 * tp, 5, 7
    x = torch.randn(N, C, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(tp, C, K, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(tp, 1, K, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(tp, N, K, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(tp, K, C, generator=g, dtype=torch.float64, requires_grad=True)
    group = SimulatedTP(tp)
    ring = (all_gather_matmul(x, w, b, group), matmul_reduce_scatter(y, v, group))
    plain = (torch.baddbmm(b, gather_to_tp_region(x, group), w),
             reduce_scatter_from_tp_region(torch.bmm(y, v), group))
    for a, p in zip(ring, plain):
        torch.testing.assert_close(a, p, **TOL)
        seed = torch.randn(a.shape, generator=g, dtype=torch.float64)
        ga = torch.autograd.grad(a, (x, w, b, y, v), seed, allow_unused=True)
        gp = torch.autograd.grad(p, (x, w, b, y, v), seed, allow_unused=True)
        for u, q in zip(ga, gp):
            assert (u is None) == (q is None)
            if u is not None:
                torch.testing.assert_close(u, q, **TOL)
    assert torch.autograd.gradcheck(lambda x, w, b: all_gather_matmul(x, w, b, group), (x, w, b))
    assert torch.autograd.gradcheck(lambda y, v: matmul_reduce_scatter(y, v, group), (y, v))


@pytest.mark.parametrize("tp", [2, 4])
def test_counts_the_rings_bytes(tp):
    """Per forward: 4 rings per 'tp' block (2 all-gathers, 2 reduce-scatters), tp - 1 transfers each, of n =
    N/tp tokens: (tp - 1)/tp of the whole-buffer bytes plain SP counts for the collectives the rings replace;
    the embedding scatter and the final gather stay plain all-gathers. Backward the same rings."""
    gpt = make_gpt()
    idx, _ = batch()
    ring = model(gpt, tp).float().comm_per_forward(idx)
    plain = model(gpt, tp, ring=False).float().comm_per_forward(idx)
    assert ring["fwd_ring_transfers"] == ring["bwd_ring_transfers"] == 4 * N_LAYER * (tp - 1)
    assert (ring["fwd_all_gathers"], ring["fwd_reduce_scatters"], ring["bwd_all_gathers"]) == (1, 0, 1)
    # the final gather and the embedding scatter's backward
    assert ring["sp_bytes_per_token"] == 2 * N_EMBD * 4
    replaced = plain["sp_bytes_per_token"] - ring["sp_bytes_per_token"]
    assert replaced == 2 * 4 * N_LAYER * N_EMBD * 4
    assert ring["ring_bytes_per_token"] == pytest.approx(replaced * (tp - 1) / tp, rel=1e-12)
    assert "fwd_ring_transfers" not in plain


def test_config_refusals():
    kw = dict(n_layer=2, n_head=4, n_embd=32, tp_size=2)
    with pytest.raises(ConfigError, match="tp_collective_matmul=True needs sequence_parallel=True"):
        TPConfig(**kw, tp_collective_matmul=True)
    with pytest.raises(ConfigError, match=r"'tp' blocks only, got block_types=\['tp', 'spd'\]"):
        TPConfig(**kw, block_types=["tp", "spd"], sequence_parallel=True, tp_collective_matmul=True)
    with pytest.raises(ConfigError, match="tp_collective_matmul must be True or False, got 'yes'"):
        TPConfig(**kw, sequence_parallel=True, tp_collective_matmul="yes")


def test_train_refuses_it_without_sequence_parallel(tmp_path, char_data):
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path}",
                   "--model_type=distributed_gpt", "--tp_size=2", "--tp_collective_matmul=True")
    line = one_line_error(r)
    assert "tp_collective_matmul=True needs sequence_parallel=True" in line, line
    assert not any(tmp_path.iterdir())


# ---------- real tensor parallelism (the shared torchrun launches, 2 and 4 gloo processes) ----------

SHARED_LAUNCHES = {"collective_matmul_real": {2: (2, ["tests/workers/collective_matmul_worker.py", "{dir}"]),
                                              4: (4, ["tests/workers/collective_matmul_worker.py", "{dir}"])}}


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def collective_matmul_real(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)["results"]


def test_real_equals_plain_sequence_parallelism(collective_matmul_real):
    """fp32 (real_tp_worker.TOL: 2e-5), without and with keyed dropout 0.2: real collective matmul against
    simulated plain SP and simulated collective matmul, with the same counts as the simulation."""
    for check in ("fwd_bwd", "dropout"):
        for against in ("real_vs_sp", "real_vs_sim_ring"):
            result = collective_matmul_real[f"{against}/{check}"]
            assert result["ratio"] <= 1.0, json.dumps(result)
        counts = collective_matmul_real[f"real_vs_sim_ring/{check}"]["counts"]
        assert counts["real"] == counts["sim"] and counts["real"]["fwd_ring_transfers"] > 0
    assert REAL_TOL["float32"] == dict(rtol=2e-5, atol=2e-5)


def test_real_comparison_can_fail(collective_matmul_real):
    assert collective_matmul_real["can_fail/perturbed_shard"]["ratio"] > 10


def test_real_trace_shows_each_transfer_beside_a_gemm(collective_matmul_real):
    """Every ring transfer of one traced step, forward and backward, on every rank: issued, then at least one
    matmul on the issuing thread, then its wait."""
    ranks = [v for k, v in collective_matmul_real.items() if k.startswith("trace/rank")]
    assert ranks
    for trace in ranks:
        assert trace["unwaited"] == 0
        directions = {d for d, _, _ in trace["between"]}
        assert directions == {"fwd", "bwd"}, trace
        assert all(n >= 1 for _, _, n in trace["between"]), trace
