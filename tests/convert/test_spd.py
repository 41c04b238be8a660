"""spd.py: Sync-Point Drop of a trained GPT (sensitivity, head grouping,
distillation, the conversion written)."""

import json
import os

import pytest
import torch
from tqdm import tqdm

from conftest import TINY, run_script
from model import GPT, GPTConfig
from tpcomm.errors import ConfigError
from tpcomm.convert.head_grouping import group_heads, head_grouping, permute_heads_and_units
from tpcomm.convert.sync_point_drop import (Evaluator, distill_block, distill_kl, distributed, mean_loss,
                                            read_latencies, sensitivities, spd_pattern)

# fp32, tiny model: a reordered sum differs from GPT's by ~1e-7 relative; 1e-5 leaves room and is far below
# the effect of dropping a sync (checked > 1e-3 below)
TOL = 1e-5


def tiny_gpt(seed=0, n_layer=2, n_head=4, n_embd=32):
    """A GPT whose weights are large enough that its blocks matter (GPT-2 init is
    near-uniform at this size)."""
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=16, vocab_size=40))
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.25)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    return gpt.eval()


def batches(seed, n=3, B=4, T=16, V=40):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n, B, T), generator=g), torch.randint(0, V, (n, B, T), generator=g)


def test_all_tp_is_gpt_and_one_spd_block_is_not():
    gpt = tiny_gpt()
    X, Y = batches(1)
    state = gpt.state_dict()
    base = mean_loss(gpt, X, Y)
    assert mean_loss(distributed(gpt, state, 2, ["tp", "tp"]), X, Y) == pytest.approx(base, abs=TOL)
    assert mean_loss(distributed(gpt, state, 4, ["tp", "tp"]), X, Y) == pytest.approx(base, abs=TOL)
    # the sensitivity is not vacuous: one 'spd' block at tp >= 2 is another function
    assert abs(mean_loss(distributed(gpt, state, 2, ["spd", "tp"]), X, Y) - base) > 1e-3
    # at tp_size 1 'spd' is GPT's block
    assert mean_loss(distributed(gpt, state, 1, ["spd", "spd"]), X, Y) == pytest.approx(base, abs=TOL)


def test_sensitivities_single_and_paper_sweep():
    gpt = tiny_gpt(n_layer=3)
    X, Y = batches(2)
    state = gpt.state_dict()
    evaluate = Evaluator(gpt, 2, X, Y, tqdm(disable=True))
    base, single, paper = sensitivities(evaluate, state, 3)
    assert base == pytest.approx(mean_loss(gpt, X, Y), abs=TOL)
    # the last block sees the same context either way; the backward sweep telescopes to the all-'spd' increase
    assert single[2] == pytest.approx(paper[2], abs=TOL)
    all_spd = mean_loss(distributed(gpt, state, 2, ["spd"] * 3), X, Y)
    assert sum(paper) == pytest.approx(all_spd - base, abs=TOL)
    assert single[0] == pytest.approx(mean_loss(distributed(gpt, state, 2, spd_pattern(3, {0})), X, Y) - base,
                                      abs=TOL)
    assert any(abs(s) > 1e-3 for s in single)


def test_head_and_unit_permutation():
    gpt = tiny_gpt()
    X, Y = batches(3)
    state = gpt.state_dict()
    units = torch.randperm(128, generator=torch.Generator().manual_seed(0)).tolist()
    perms = {0: ([0, 2, 1, 3], units), 1: ([3, 1, 0, 2], None)}
    permuted = permute_heads_and_units(state, perms, n_head=4)
    assert not torch.equal(permuted["transformer.h.0.attn.c_attn.weight"],
                           state["transformer.h.0.attn.c_attn.weight"])
    # GPT and every all-'tp' model: the same function (sums reordered only)
    other = GPT(gpt.config)
    other.load_state_dict(permuted)
    base = mean_loss(gpt, X, Y)
    assert mean_loss(other.eval(), X, Y) == pytest.approx(base, abs=TOL)
    for tp in (2, 4):
        assert mean_loss(distributed(gpt, permuted, tp, ["tp", "tp"]), X, Y) == pytest.approx(base, abs=TOL)
    # an 'spd' block whose shards now hold other heads and units: another function
    spd = mean_loss(distributed(gpt, state, 2, ["spd", "tp"]), X, Y)
    assert abs(mean_loss(distributed(gpt, permuted, 2, ["spd", "tp"]), X, Y) - spd) > 1e-4
    # swapping the two shards whole (heads and units together) only relabels the devices: unchanged
    swap = permute_heads_and_units(state, {0: ([2, 3, 0, 1], list(range(64, 128)) + list(range(64)))},
                                   n_head=4)
    assert mean_loss(distributed(gpt, swap, 2, ["spd", "tp"]), X, Y) == pytest.approx(spd, abs=TOL)


def test_group_heads_separates_similar_heads():
    # heads 0, 1 attend alike, and 2, 3: each device should get one of each pair
    sim = torch.tensor([[1.0, 0.9, 0.1, 0.2], [0.9, 1.0, 0.2, 0.1], [0.1, 0.2, 1.0, 0.8],
                        [0.2, 0.1, 0.8, 1.0]])
    groups = group_heads(sim, 2)
    assert sorted(len(g) for g in groups) == [2, 2]
    assert all({0, 1} - set(g) and {2, 3} - set(g) for g in groups), groups
    # the grouping of a real block is a permutation of heads and of units
    gpt = tiny_gpt()
    head_perm, unit_perm = head_grouping(gpt, 0, 2, batches(4)[0][0])
    assert sorted(head_perm) == list(range(4)) and sorted(unit_perm) == list(range(128))


def test_distillation_lowers_its_loss_on_held_out_data():
    gpt = tiny_gpt()
    state = gpt.state_dict()
    train_X = batches(5, n=40)[0]
    heldout = batches(6, n=2)[0]
    new, before, after = distill_block(gpt, state, 0, 2, train_X, heldout, lr=3e-3)
    assert set(new) == {k for k in state if k.startswith("transformer.h.0.")}
    assert after < 0.8 * before, (before, after)
    _, kl_before, kl_after = distill_kl(gpt, state, 2, ("spd", "spd"), train_X, heldout, lr=3e-3)
    assert kl_before > 0 and kl_after < 0.8 * kl_before, (kl_before, kl_after)


def test_read_latencies(tmp_path):
    path = tmp_path / "lat.json"
    path.write_text(json.dumps({"TS": 1.5, "spd,spd": 1.25}))
    assert read_latencies(str(path), 2) == {("tp", "spd"): 1.5, ("spd", "spd"): 1.25}
    path.write_text(json.dumps({"TSX": 1.0}))
    with pytest.raises(ConfigError, match="TSX"):
        read_latencies(str(path), 2)


@pytest.fixture(scope="module")
def tiny_run(char_data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("spd") / "run")
    r = run_script("train.py", *TINY, "--dataset=chars", f"--data_dir={char_data}", f"--out_dir={out}",
                   "--max_iters=30", "--eval_interval=30")
    assert r.returncode == 0, r.stderr
    return out


def test_spd_end_to_end(tiny_run):
    # thresholds below every sensitivity: every block is 'extremely sensitive', so grouping and B2B both run
    r = run_script("spd.py", f"--out_dir={tiny_run}", "--tp_size=2", "--eval_iters=2", "--batch_size=4",
                   "--distill_steps=10", "--kl_steps=5", "--tau_isb=-1", "--tau_esb=-1", "--num_spd=2")
    assert r.returncode == 0, r.stderr
    spd_dir = os.path.join(tiny_run, "spd")
    for name in ("spd.md", "spd.json", "spd.png", "spd.data.json", "ckpt.pt"):
        assert os.path.getsize(os.path.join(spd_dir, name)) > 0, name
    from tpcomm.figures import command_figures, png

    # the figure's numbers, its digest inside
    data, _ = command_figures.load(os.path.join(spd_dir, "spd.png"))
    assert png.png_digest(os.path.join(spd_dir, "spd.png")) == png.data_digest(data)
    assert data["kl"] is not None and data["kl"][0] == 2  # the KL-recovered point is drawn
    result = json.load(open(os.path.join(spd_dir, "spd.json")))
    # measured: 2 a 'tp' block, 1 an 'spd'
    assert [row["fwd_allreduces"] for row in result["curve"]] == [4, 3, 2]
    assert [b["class"] for b in result["blocks"]] == ["ESB", "ESB"]
    # distilled weights are kept only where they lowered the held-out block MSE
    assert all(b["b2b_kept"] == (b["mse_after"] < b["mse_before"]) for b in result["blocks"])
    assert result["conversion"]["pattern"] == ["spd", "spd"]
    ckpt = torch.load(os.path.join(spd_dir, "ckpt.pt"), weights_only=True)
    assert ckpt["model_type"] == "distributed_gpt"
    assert ckpt["model_options"]["tp_size"] == 2 and ckpt["model_options"]["block_types"] == ["spd", "spd"]
    r = run_script("sample.py", f"--out_dir={spd_dir}", "--device=cpu", "--num_samples=1",
                   "--max_new_tokens=10")
    assert r.returncode == 0, r.stderr
    # a converted (not all-'tp') checkpoint is not an input
    r = run_script("spd.py", f"--out_dir={spd_dir}", "--tp_size=2")
    assert r.returncode == 2 and "all-'tp'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--tp_size=3"], "divisible"),
    (["--tp_size=1"], "tp_size must be"),
    (["--bogus=1"], "unknown config key"),
    (["--order=random"], "order must be"),
    (["--latency_json=/no/such.json"], "latency_json"),
    (["--tp_size=2", "--num_spd=3"], "num_spd (3) exceeds the checkpoint's number of blocks, n_layer (2)"),
])
def test_spd_bad_input(tiny_run, args, message):
    r = run_script("spd.py", f"--out_dir={tiny_run}", *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_spd_missing_checkpoint(tmp_path):
    r = run_script("spd.py", f"--out_dir={tmp_path}", "--tp_size=2")
    assert r.returncode == 2 and "no checkpoint" in r.stderr and len(r.stderr.strip().splitlines()) == 1
