"""spd.py --block=ladder: Ladder Residual conversion of a trained GPT (tpcomm/convert/ladder_conversion.py):
the pattern, the zero-shot model, the retraining, the conversion written, bad input."""

import json
import os

import pytest
import torch

from conftest import TINY, one_line_error, run_script
from tpcomm.convert.ladder_conversion import convert, ladder_pattern, retrain
from tpcomm.convert.sync_point_drop import distributed, mean_loss
from test_spd import batches, tiny_gpt

# fp32, tiny model: a reordered sum differs from GPT's by ~1e-7 relative; 1e-5 leaves room and is far below
# the effect of the ladder's shifted reads (checked > 1e-3 below)
TOL = 1e-5


def test_ladder_pattern_is_the_upper_half_or_the_top_k():
    assert ladder_pattern(6, -1) == ("tp",) * 3 + ("ladder",) * 3
    assert ladder_pattern(5, -1) == ("tp",) * 3 + ("ladder",) * 2  # the upper half, rounded down
    assert ladder_pattern(4, 1) == ("tp", "tp", "tp", "ladder")
    assert ladder_pattern(4, 0) == ("tp",) * 4 and ladder_pattern(2, 2) == ("ladder", "ladder")


def test_zero_shot_rows_are_gpt_and_the_ladder_model():
    """The original row is GPT's loss, the zero-shot row the ladder model's on GPT's weights,
    which is another function (not vacuous); counts measured: the ladder keeps the all-reduces
    but issues its own asynchronously."""
    gpt = tiny_gpt(n_layer=4)
    X, Y = batches(1)
    cfg = dict(tp_size=2, ladder_layers=-1, retrain_lr=1e-3, control=True)
    rows, final = convert(cfg, gpt, X, Y, None, X[0][:1, :8])
    assert final is None and [r["model"] for r in rows] == ["original", "ladder, zero-shot"]
    assert rows[0]["loss"] == pytest.approx(mean_loss(gpt, X, Y), abs=TOL)
    assert rows[1]["pattern"] == ["tp", "tp", "ladder", "ladder"]
    ladder = distributed(gpt, gpt.state_dict(), 2, rows[1]["pattern"])
    assert rows[1]["loss"] == pytest.approx(mean_loss(ladder, X, Y), abs=TOL)
    assert abs(rows[1]["loss"] - rows[0]["loss"]) > 1e-3
    assert (rows[0]["fwd_allreduces"], rows[0]["async_allreduces"]) == (8, 0)
    assert (rows[1]["fwd_allreduces"], rows[1]["async_allreduces"]) == (8, 4)


def test_retraining_lowers_the_loss_it_trains_on_and_the_control_keeps_gpt():
    """A few steps on one repeated batch lower that batch's loss (the retraining trains the converted model's
    weights); with control the original is retrained on the same batches."""
    gpt = tiny_gpt(n_layer=2)
    X, Y = batches(2, n=1)
    train = (X.repeat(15, 1, 1), Y.repeat(15, 1, 1))
    pattern = ladder_pattern(2, -1)
    before = mean_loss(distributed(gpt, gpt.state_dict(), 2, pattern), X, Y)
    after = mean_loss(distributed(gpt, retrain(gpt, gpt.state_dict(), 2, pattern, train, lr=3e-3), 2,
                                  pattern), X, Y)
    assert after < before - 0.05, (before, after)
    rows, final = convert(dict(tp_size=2, ladder_layers=-1, retrain_lr=3e-3, control=True), gpt, X, Y, train,
                          X[0][:1, :8])
    assert [r["model"] for r in rows] == ["original", "ladder, zero-shot", "ladder, retrained",
                                          "original, retrained (control)"]
    assert rows[2]["loss"] == pytest.approx(after, abs=TOL) and rows[2]["retrain_steps"] == 15
    assert rows[3]["pattern"] == ["tp", "tp"] and rows[3]["loss"] < rows[0]["loss"] - 0.05
    assert mean_loss(distributed(gpt, final, 2, pattern), X, Y) == pytest.approx(after, abs=TOL)


@pytest.fixture(scope="module")
def tiny_run(char_data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ladder") / "run")
    r = run_script("train.py", *TINY, "--dataset=chars", f"--data_dir={char_data}", f"--out_dir={out}",
                   "--max_iters=30", "--eval_interval=30")
    assert r.returncode == 0, r.stderr
    return out


def test_ladder_conversion_end_to_end(tiny_run):
    r = run_script("spd.py", "--block=ladder", f"--out_dir={tiny_run}", "--tp_size=2", "--eval_iters=2",
                   "--batch_size=4", "--retrain_steps=10", "--retrain_batch_size=4")
    assert r.returncode == 0, r.stderr
    out = os.path.join(tiny_run, "ladder")
    for name in ("ladder.md", "ladder.json", "ckpt.pt"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    result = json.load(open(os.path.join(out, "ladder.json")))
    rows = {row["model"]: row for row in result["rows"]}
    assert list(rows) == ["original", "ladder, zero-shot", "ladder, retrained", "original, retrained "
                          "(control)"]
    assert rows["ladder, zero-shot"]["pattern"] == ["tp", "ladder"]  # n_layer 2: the upper half is block 1
    assert [(r["fwd_allreduces"], r["async_allreduces"]) for r in result["rows"]] == [(4, 0), (4, 2), (4, 2),
                                                                                      (4, 0)]
    assert "| ladder, retrained | TL | 4 (2) | 10 |" in r.stdout, r.stdout
    ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    assert ckpt["model_type"] == "distributed_gpt"
    assert ckpt["model_options"]["tp_size"] == 2 and ckpt["model_options"]["block_types"] == ["tp", "ladder"]
    assert ckpt["best_val_loss"] == pytest.approx(rows["ladder, retrained"]["loss"])
    r = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=10")
    assert r.returncode == 0, r.stderr
    # a converted (not all-'tp') checkpoint is not an input
    line = one_line_error(run_script("spd.py", "--block=ladder", f"--out_dir={out}", "--tp_size=2"))
    assert "all-'tp'" in line and "spd.py --block=ladder" in line, line


@pytest.mark.parametrize("args,message", [
    (["--block=bogus"], "block must be one of ['spd', 'ladder'], got 'bogus'"),
    (["--block=ladder", "--ladder_layers=3", "--tp_size=2"],
     "ladder_layers (3) exceeds the checkpoint's number of blocks, n_layer (2)"),
    (["--block=ladder", "--ladder_layers=-2"], "ladder_layers must be -1"),
    (["--block=ladder", "--tp_size=3"], "divisible"),
    (["--block=ladder", "--num_spd=1"], "unknown config key 'num_spd'"),  # spd's keys are not ladder's
])
def test_ladder_conversion_bad_input(tiny_run, args, message):
    line = one_line_error(run_script("spd.py", f"--out_dir={tiny_run}", *args))
    assert message in line, line
