"""Partial-channel sync ('caat' blocks, CAAT-Net; tpcomm/model/block_types/caat.py, docs/model.md):
the simulated model against a per-shard reference written here from the equations, GPT at tp 1, all
'tp' at p = 1, real TP against the simulation (tests/workers/caat_worker.py), its measured bytes,
and its options refused in one line."""

import json

import pytest
import torch

from conftest import ROOT, run_script, shared_launch
from tpcomm.errors import ConfigError
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import model_config
from test_tensor_parallel import (N_LAYER, TOL, VOCAB, assert_same, attn_shard, batch, layer_norm, make_gpt,
                                  mlp_shard, run_keyed, with_dropout)
from test_tensor_parallel import run as run_model

SHARED_LAUNCHES = {"caat_results": {n: (n, ["tests/workers/caat_worker.py", "{dir}/results.json"])
                                    for n in (2, 4)}}


def reference_forward(gpt, idx, targets, tp, block_types, k):
    """docs/model.md's 'caat', 'tp', 'spd' and 'parallel' equations one shard at a time: xbar the synced value
    (on the first k channels after a 'caat' sync), r[i] shard i's stream, None when every r[i] is xbar. A
    'caat' shard adds sqrt(tp) (A_i + b) on the private channels; after a last 'caat' block shard i's ln_f and
    its vocabulary slice of lm_head read r[i] (no final sync)."""
    tr = gpt.transformer
    xbar, r = tr.wte(idx) + tr.wpe(torch.arange(idx.size(1))), None
    for block, kind in zip(tr.h, block_types):
        bA, bM = block.attn.c_proj.bias, block.mlp.c_proj.bias
        r = r or [xbar] * tp
        if kind == "caat":
            for f, ln, b in ((attn_shard, block.ln_1, bA), (mlp_shard, block.ln_2, bM)):
                z = [f(block, layer_norm(ln, r[i]), i, tp) for i in range(tp)]
                s = xbar[..., :k] + sum(r[i][..., :k] - xbar[..., :k] + z[i][..., :k]
                                        for i in range(tp)) + b[:k]
                xbar = torch.cat([s, xbar[..., k:]], -1)
                r = [torch.cat([s, r[i][..., k:] + tp ** 0.5 * (z[i][..., k:] + b[k:])], -1)
                     for i in range(tp)]
        elif kind == "parallel":
            r = [r[i] + attn_shard(block, layer_norm(block.ln_1, r[i]), i, tp) + bA / tp for i in range(tp)]
            r = [r[i] + mlp_shard(block, layer_norm(block.ln_2, r[i]), i, tp) + bM / tp for i in range(tp)]
        elif kind == "spd":
            A = [attn_shard(block, layer_norm(block.ln_1, r[i]), i, tp) for i in range(tp)]
            M = [mlp_shard(block, layer_norm(block.ln_2, r[i] + A[i] + bA), i, tp) for i in range(tp)]
            xbar, r = xbar + sum(r[i] - xbar + A[i] + M[i] for i in range(tp)) + bA + bM, None
        else:  # tp
            x1 = xbar + sum(r[i] - xbar + attn_shard(block, layer_norm(block.ln_1, r[i]), i, tp)
                            for i in range(tp)) + bA
            xbar, r = x1 + sum(mlp_shard(block, layer_norm(block.ln_2, x1), i, tp)
                               for i in range(tp)) + bM, None
    if block_types[-1] == "caat":  # vocabulary ids [i Vs, (i+1) Vs) from shard i's own stream
        Vs = -(-VOCAB // tp)
        logits = torch.cat([gpt.lm_head(layer_norm(tr.ln_f, r[i]))[..., i * Vs:(i + 1) * Vs]
                            for i in range(tp)], -1)
    else:
        if r is not None:
            xbar = xbar + sum(r[i] - xbar for i in range(tp))
        logits = gpt.lm_head(layer_norm(tr.ln_f, xbar))
    return logits, torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def run(model, idx, targets):
    """test_tensor_parallel.run, a private head's logits (each shard's vocabulary slice) as GPT's."""
    logits, loss, grads = run_model(model, idx, targets)
    return (model.gathered_logits(logits, idx.shape) if hasattr(model, "gathered_logits")
            else logits), loss, grads


def run_reference(gpt, idx, targets, tp, block_types, k):
    gpt.zero_grad(set_to_none=True)
    logits, loss = reference_forward(gpt, idx, targets, tp, block_types, k)
    loss.backward()
    return logits, loss, {n: p.grad.clone() for n, p in gpt.named_parameters()}


def caat(gpt, tp, block_types=("caat",) * N_LAYER, p=0.5):
    return DistributedGPT.from_gpt(gpt, tp, list(block_types), caat_sync_fraction=p)


PATTERNS = [["caat"] * 4, ["parallel", "caat", "tp", "caat"], ["caat", "spd", "caat", "parallel"]]


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("p", [0.5, 0.25, 1.0])
@pytest.mark.parametrize("block_types", PATTERNS, ids=["-".join(b) for b in PATTERNS])
def test_matches_per_shard_reference(tp, p, block_types):
    gpt = make_gpt()
    idx, tgt = batch()
    assert_same(run(caat(gpt, tp, block_types, p), idx, tgt),
                run_reference(gpt, idx, tgt, tp, block_types, round(p * 32)), **TOL)


def test_reference_comparison_can_fail():
    """The reference with another number of synced channels is not the model (p = 0.5: k = 16 of 32)."""
    gpt = make_gpt()
    idx, tgt = batch()
    model = run(caat(gpt, 2), idx, tgt)
    for k in (8, 32):
        assert not torch.allclose(model[0], run_reference(gpt, idx, tgt, 2, ["caat"] * 4, k)[0], **TOL)


def test_tp1_equals_gpt_with_dropout():
    """At tp 1 every channel's sum is the one shard's output: GPT's block, its dropout masks included; so
    another fraction than the default changes nothing there, and is refused (as tp_comm_dtype at tp 1 is)."""
    gpt = make_gpt()
    idx, tgt = batch()
    assert_same(run(caat(gpt, 1), idx, tgt), run(gpt, idx, tgt), **TOL)
    with pytest.raises(ConfigError, match="caat_sync_fraction=0.25 needs tp_size > 1"):
        caat(gpt, 1, p=0.25)
    dropped = with_dropout(gpt, 0.2)
    model = caat(dropped, 1)
    assert_same(run_keyed(model, idx, tgt), run_keyed(dropped, idx, tgt), **TOL)
    assert abs(run_keyed(model, idx, tgt, (1337, 8, 2))[1].item() - run_keyed(dropped, idx,
                                                                              tgt)[1].item()) > 1e-3


@pytest.mark.parametrize("tp", [2, 4])
def test_every_channel_synced_is_all_tp(tp):
    """p = 1: each sync all-reduces every channel, which is Megatron's block; p = 0.5 is another model."""
    gpt = make_gpt()
    idx, tgt = batch()
    ref = run(DistributedGPT.from_gpt(gpt, tp), idx, tgt)
    assert_same(run(caat(gpt, tp, p=1.0), idx, tgt), ref, **TOL)
    assert not torch.allclose(run(caat(gpt, tp), idx, tgt)[0], ref[0], **TOL)


@pytest.mark.parametrize("p", [0.5, 0.25, 1.0])
def test_bytes_are_p_of_a_full_sync(p):
    """Measured (tpcomm/tp/counting.py): each 'caat' sync moves p of a 'tp' sync's bytes, forward and
    backward; the fan-out of the synced embedding (f's backward) moves a full one; there is no final sync."""
    gpt = make_gpt()
    idx, tgt = batch()

    def report(model):
        run(model, idx, tgt)
        return model.comm_report(micro_steps=1, tokens=idx.numel())

    tp, model = report(DistributedGPT.from_gpt(gpt, 2)), report(caat(gpt, 2, p=p))
    per_sync = tp["comm_bytes_per_token"] / (tp["fwd_allreduces"] + tp["bwd_allreduces"])
    assert (model["fwd_allreduces"], model["bwd_allreduces"]) == (2 * N_LAYER, 2 * N_LAYER + 1)
    assert model["comm_bytes_per_token"] == pytest.approx(per_sync * (4 * N_LAYER * p + 1))


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def caat_results(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)["results"]


def test_real_matches_simulation(caat_results):
    """Real TP (2 and 4 gloo ranks; loss_parallel where the head reads each rank's stream) equals the
    simulation (whose head slices the whole weight), fp32 and fp64, with and without dropout (TOL in
    real_tp_worker.py), and the comparison can fail."""
    checks = {k: v for k, v in caat_results.items() if not k.startswith("can_fail/")}
    assert len(checks) == 2 * 2 * 3 * 2  # {fwd_bwd, dropout} x dtypes x patterns x fractions
    assert all(v["ratio"] <= 1.0 for v in checks.values()), json.dumps(checks)
    assert caat_results["can_fail/perturbed_shard"]["ratio"] > 1.0
    assert caat_results["can_fail/other_fraction"]["ratio"] > 1.0


@pytest.mark.parametrize("options, words", [
    (dict(caat_sync_fraction=0.0), "caat_sync_fraction must be a number in (0, 1], got 0.0"),
    (dict(caat_sync_fraction=1.5), "caat_sync_fraction must be a number in (0, 1], got 1.5"),
    (dict(caat_sync_fraction="half"), "caat_sync_fraction must be a number in (0, 1], got 'half'"),
    (dict(caat_sync_fraction=0.3), "caat_sync_fraction=0.3 times n_embd (32) must be a whole number of "
     "channels"),
    # once accepted: 0 channels synced
    (dict(caat_sync_fraction=1e-300, tp_size=2), "caat_sync_fraction=1e-300 times n_embd (32) must be a "
                                                 "whole number of channels, at least 1"),
    (dict(caat_sync_fraction=0.25, block_types=["tp"] * 4), "caat_sync_fraction=0.25 has no effect without "
     "'caat'"),
    (dict(sequence_parallel=True, tp_size=2), "sequence_parallel=True does not run with 'caat' blocks"),
    (dict(tp_comm_dtype="int8", tp_size=2), "tp_comm_dtype='int8' does not run with 'caat' blocks"),
    (dict(tp_async_grad=True, tp_size=2), "tp_async_grad=True has nothing to make asynchronous"),
])
def test_bad_options_refused_in_one_line(options, words):
    kw = {**dict(n_layer=4, n_head=8, n_embd=32, block_types=["caat"] * 4, tp_size=1), **options}
    with pytest.raises(ConfigError) as e:
        model_config("distributed_gpt", kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_cost_model_prices_p_of_the_bytes():
    """tpcomm/costmodel/cost_model.py: all 'caat' moves 2L forward and 2L backward all-reduces of p
    n bytes, plus the embedding's fan-out in the backward (no final sync); blocking (no wgrad to
    hide behind) that is exact."""
    from tpcomm.costmodel import cost_model as cm
    from tpcomm.costmodel.collective_matmul_cost import BF16
    shape, link, tokens = cm.TABLE_SHAPES[1], cm.LINKS[0], 8 * 1024
    n = tokens * shape.n_embd * BF16
    t = lambda nbytes: cm.allreduce_time(nbytes, 8, alpha=link.alpha, busbw=link.busbw)  # noqa: E731
    for p in (0.5, 0.25, 1.0):
        v = cm.train_variants(shape, tp=8, link=link, tokens=tokens, seq_len=1024, mfu=0.4,
                              opts=cm.Options(block_options={"caat_sync_fraction": p}))
        L = shape.n_layer
        assert v["partial sync"][1] == pytest.approx(4 * L * t(p * n) + t(n))
        assert v["tracks/4"][1] == pytest.approx(2 * (L // 4) * t(n))  # one sync every 4 blocks, each way
    # p = 1: all 'tp' plus the last fan-out
    assert v["partial sync"][1] == pytest.approx(v["all tp"][1] + t(n))
    assert cm.forward_syncs(["caat"] * 4) == 8 and cm.forward_syncs((["parallel"] * 3 + ["spd"]) * 3) == 3


def test_checkpoint_keeps_the_fraction():
    """A checkpoint of a 'caat' model rebuilds it with its own p (the function
    depends on it), not the default."""
    from tpcomm.train.checkpoint import build_model_from_checkpoint, model_spec
    model = caat(make_gpt(), 2, p=0.25)
    args, options = model_spec("distributed_gpt", model)
    back = build_model_from_checkpoint(dict(model=model.gpt_state_dict(), model_args=args,
                                            model_type="distributed_gpt", model_options=options))
    assert back.config.type_options["caat"].sync_fraction == 0.25
    idx, tgt = batch()
    assert_same(run(back, idx, tgt), run(model, idx, tgt), rtol=0, atol=0)


def test_generation_with_the_kv_cache_equals_recomputing():
    """'caat' blocks generate the same tokens with the KV cache as without (each
    shard's keys and values cached)."""
    model = caat(make_gpt(), 2, ["caat", "parallel", "caat", "tp"]).eval()
    prompt = batch()[0][:, :5]
    torch.manual_seed(3)
    a = model.generate(prompt, 10, temperature=0, use_cache=True)
    torch.manual_seed(3)
    assert torch.equal(a, model.generate(prompt, 10, temperature=0, use_cache=False))


def test_train_refuses_a_bad_fraction_before_any_work(tmp_path):
    """train.py: one line naming the key and value, exit status 2, no traceback, nothing written."""
    out = tmp_path / "out"
    r = run_script("train.py", "config/train_shakespeare_char_cpu.py", "--model_type=distributed_gpt",
                   "--tp_size=2", "--block_types=caat", "--caat_sync_fraction=0.3", f"--out_dir={out}")
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert ("caat_sync_fraction=0.3 times n_embd (128) must be a whole number of "
            "channels" in r.stderr + r.stdout)
    assert not out.exists()


def test_cpu_long_plans_caat_and_tracks_paired_and_the_answer_reads_them_pending(tmp_path):
    """cpu-long plans the published all 'caat' (p = 0.5, the default) and tracks syncing every 4 blocks with
    seeds 1337-1346, caat at p = 0.25, 0.75 and tracks at D = 3, 6 with 3, all of which all 'tp' has too
    (paired); without their result files (here: the committed all 'tp' and all 'spd' files alone) the answer's
    rows and figure read pending."""
    import shutil
    from pathlib import Path
    from tpcomm.experiments.report import answer, report
    runs_dir = tmp_path / "experiments" / "cpu-long" / "runs"
    runs_dir.mkdir(parents=True)
    for f in Path(ROOT, "experiments", "cpu-long", "runs").glob("all-[ts][p]*-seed*.json"):
        shutil.copy(f, runs_dir)
    assert {f.name.split("-seed")[0] for f in runs_dir.iterdir()} >= {"all-tp", "all-spd"}
    from tpcomm.experiments.sweep_plan import SWEEPS, SWEEP_SEEDS
    runs = {r.name: r for r in SWEEPS["cpu-long"]}
    assert runs["all-caat"].overrides == ("--block_types=['caat']*12",)
    assert runs["all-caat-p0.25"].overrides == ("--block_types=['caat']*12", "--caat_sync_fraction=0.25")
    assert runs["parallel3-spd"].overrides == ("--block_types=(['parallel']*3+['spd'])*3",)
    assert runs["parallel5-spd"].overrides == ("--block_types=(['parallel']*5+['spd'])*2",)
    for name in ("all-caat", "parallel3-spd"):
        assert runs[name].seeds == tuple(range(1337, 1347))
    for name in ("all-caat-p0.25", "all-caat-p0.75", "parallel2-spd", "parallel5-spd"):
        assert runs[name].seeds == (1337, 1338, 1339)
    assert runs["all-tp"].seeds is None and set(range(1337, 1347)) <= set(SWEEP_SEEDS["cpu-long"])
    ctx = report.Results(root=str(tmp_path), say=lambda *a: None)
    rows = [line for line in answer.answer_table(ctx).splitlines() if "caat" in line or "tracks" in line]
    assert len(rows) == 3 and all("| pending |" in line for line in rows), rows  # the others: docs/axes.md
    assert "| drop | all `spd` | pending" not in answer.answer_table(ctx)  # a row with files is measured
    data, _ = answer.tradeoff_plot(ctx)
    status = {p["key"]: p["status"] for p in data["points"]}
    assert {status[k] for k in ("parallel3-spd", "all-caat")} == {"pending"}
