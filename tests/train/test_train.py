"""train.py end to end on tiny data: resume reproduces, DDP matches one process, bad input is one line."""

import json
import os

import pytest

from conftest import TINY, run_script
from model import GPTConfig
from tpcomm.train.train_config import cpu_eval_iters


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["iter"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def train(out_dir, data, *extra, launcher=None):
    args = ["train.py", *TINY, f"--data_dir={data}", f"--out_dir={out_dir}", *extra]
    if launcher:
        args = ["-m", "torch.distributed.run", *launcher, *args]
    r = run_script(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_resume_reproduces_uninterrupted_run(tmp_path, char_data):
    common = ["--max_iters=12", "--lr_decay_iters=12", "--eval_interval=6", "--gradient_accumulation_steps=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    train(full, char_data, *common)
    # stop at iteration 6 (its checkpoint is written before step 6 runs), then resume to 12
    train(part, char_data, *common[1:], "--max_iters=6")
    train(part, char_data, *common, "--init_from=resume")
    a, b = losses(full), losses(part)
    assert sorted(a) == list(range(13))
    # the resumed run replaced the records of 6.. the first run wrote (steps and evals)
    for it in range(6, 13):
        assert b[it] == pytest.approx(a[it], rel=1e-6, abs=1e-6), it  # same ops in the same order: ~exact
    assert a[12] < a[0]
    with open(os.path.join(part, "metrics.jsonl")) as f:
        keys = [(r["iter"], "loss" in r) for r in map(json.loads, f)]
    assert len(keys) == len(set(keys)) == 13 + 3  # one record per step, one per evaluation (0, 6, 12)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_ddp_matches_single_process(tmp_path, char_data, dropout):
    """With dropout too: masks are keyed by (seed, iteration, global micro-batch), not
    drawn from each rank's RNG."""
    common = ["--max_iters=5", "--lr_decay_iters=5", "--eval_interval=100", "--gradient_accumulation_steps=2",
              f"--dropout={dropout}"]
    train(tmp_path / "one", char_data, *common)
    train(tmp_path / "ddp", char_data, *common, launcher=["--standalone", "--nproc_per_node=2"])
    a, b = losses(tmp_path / "one"), losses(tmp_path / "ddp")
    # same global batch; DDP averages gradients in another order: fp32 ~1e-6
    for it in a:
        assert b[it] == pytest.approx(a[it], rel=1e-4), it
    assert a[5] != pytest.approx(a[0], rel=1e-4)  # the runs did train, so the comparison can fail


@pytest.mark.parametrize("args, words", [
    (["--batch_sise=3"], ["batch_sise"]),
    (["--n_layer=two"], ["n_layer", "int", "str"]),
    (["--n_embd=30", "--n_head=4"], ["n_embd (30)", "n_head (4)"]),
    (["--init_from=resume", "--out_dir=/nonexistent/x"], ["resume", "/nonexistent/x"]),
    (["--dataset=nosuchdata", "--data_dir=None"], ["nosuchdata", "prepare.py"]),
    (["--init_from=gpt3"], ["init_from", "gpt3"]),
    (["--tp_size=2"], ["tp_size", "distributed_gpt"]),
])
def test_bad_input_one_line_exit_2(tmp_path, char_data, args, words):
    out = tmp_path / "out"
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0]
    if "--out_dir=/nonexistent/x" not in args:
        assert not out.exists()  # nothing written before the input was checked


def test_bad_input_keeps_checkpoint(tmp_path, char_data):
    out = tmp_path / "out"
    train(out, char_data, "--max_iters=2", "--eval_interval=2")
    before = (out / "ckpt.pt").read_bytes()
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--init_from=resume",
                   "--block_size=64")
    assert r.returncode == 2 and "block_size" in r.stderr and "Traceback" not in r.stderr
    assert (out / "ckpt.pt").read_bytes() == before


def test_nan_loss_stops_and_keeps_checkpoint(tmp_path, char_data):
    out = tmp_path / "out"
    train(out, char_data, "--max_iters=2", "--eval_interval=2")
    before = (out / "ckpt.pt").read_bytes()
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--init_from=resume",
                   "--learning_rate=1e30", "--grad_clip=0.0", "--max_iters=40", "--eval_interval=1000",
                   "--warmup_iters=0", "--decay_lr=False")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "loss is" in r.stderr and "Traceback" not in r.stderr
    assert (out / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("argv, kept", [([], False), (["--eval_iters=200"], True)])
def test_gpu_recipe_evaluates_briefly_on_cpu(argv, kept, capsys):
    """nanoGPT's GPU recipe on a CPU: its 200 evaluation batches of 64 x 256 (about 20 minutes here) are cut
    with one line unless the command line sets eval_iters; a small model's are never cut."""
    cfg = dict(batch_size=64, block_size=256, eval_iters=200)
    cpu_eval_iters(cfg, GPTConfig(n_layer=6, n_embd=384, vocab_size=84), argv)
    assert cfg["eval_iters"] == (200 if kept else 2)
    assert ("eval_iters=200 -> 2 on CPU" in capsys.readouterr().out) != kept
    small = dict(batch_size=12, block_size=64, eval_iters=200)
    cpu_eval_iters(small, GPTConfig(n_layer=4, n_embd=128, vocab_size=84), [])
    assert small["eval_iters"] == 200
