"""train.py's failure audit: each promise of the README's reliability table, shown
to hold (and able to fail)."""

import json
import os
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY, one_line_error, run_script

SPD_CONFIG = "config/train_shakespeare_char_spd.py"


def train(out_dir, data, *extra, expect=0):
    r = run_script("train.py", *TINY, f"--data_dir={data}", f"--out_dir={out_dir}", *extra)
    assert r.returncode == expect, r.stdout + r.stderr
    return r


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def ckpt(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=True)


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory, char_data):
    """A tiny GPT run with its checkpoint at iter 2 (copy it before resuming)."""
    out = tmp_path_factory.mktemp("rel") / "gpt"
    train(out, char_data, "--max_iters=2", "--eval_interval=2")
    return out


@pytest.fixture(scope="module")
def spd_run(tmp_path_factory, char_data):
    """The Shakespeare-char spd config at tiny sizes (tp_size=2, every block 'spd'), checkpoint at iter 2."""
    out = tmp_path_factory.mktemp("rel") / "spd"
    r = run_script("train.py", SPD_CONFIG, *TINY, f"--data_dir={char_data}", f"--out_dir={out}",
                   "--max_iters=2", "--eval_interval=2", "--always_save_checkpoint=True")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


# 1. a non-finite evaluation stops the run before it can overwrite the last good checkpoint

def test_nonfinite_eval_keeps_last_finite_checkpoint(gpt_run, char_data, tmp_path):
    out = copy_run(gpt_run, tmp_path / "run")
    # lr 1e30: step 2's loss is finite (computed before the update), the update makes the weights inf/nan, so
    # the evaluation at iter 3 is the first non-finite number; eval_interval=1 would save after every
    # evaluation
    r = train(out, char_data, "--init_from=resume", "--learning_rate=1e30", "--grad_clip=0.0",
              "--max_iters=10", "--eval_interval=1", "--warmup_iters=0", "--decay_lr=False", expect=1)
    line = one_line_error(r, status=1)
    assert "loss is nan" in line and "iter 3" in line, line
    c = ckpt(out)
    assert c["iter_num"] == 2  # the checkpoint of the last finite evaluation
    assert all(torch.isfinite(v).all() for v in c["model"].values())


# 3. fp16: the loss scaler's state goes through the checkpoint

def test_fp16_scaler_state_resumes(char_data, tmp_path):
    out = tmp_path / "fp16"
    fp16 = ["--dtype=float16", "--eval_interval=1"]
    train(out, char_data, *fp16, "--max_iters=3")
    c = ckpt(out)
    assert c["scaler"]["scale"] > 0 and "_growth_tracker" in c["scaler"]
    # a scale and tracker no fresh scaler would have: a resume that dropped the state could not reproduce them
    c["scaler"].update(scale=512.0, _growth_tracker=7)
    torch.save(c, out / "ckpt.pt")
    train(out, char_data, *fp16, "--init_from=resume", "--max_iters=5")
    c = ckpt(out)
    assert c["iter_num"] == 5
    assert c["scaler"]["scale"] == 512.0 and c["scaler"]["_growth_tracker"] == 9  # two finite steps: 7 + 2


# 4. resume takes the model from the checkpoint; an explicit contradiction is refused

@pytest.mark.parametrize("run, args, words", [
    ("gpt", ["--n_layer=6"], ["n_layer=6", "n_layer=2"]),
    ("gpt", ["--n_layer=12"], ["n_layer=12", "n_layer=2"]),  # the default value, but set explicitly
    ("gpt", ["--gelu_approximate=tanh"], ["gelu_approximate='tanh'", "'none'"]),
    ("gpt", ["--model_type=distributed_gpt"], ["model_type='distributed_gpt'", "'gpt'"]),
    ("spd", ["--model_type=gpt"], ["model_type='gpt'", "'distributed_gpt'"]),
    ("spd", [SPD_CONFIG, "--block_types=['spd','tp']"], ["block_types=['spd', 'tp']", "['spd', 'spd']"]),
])
def test_resume_refuses_a_contradicting_model(request, char_data, run, args, words):
    src = request.getfixturevalue(f"{run}_run")
    before = (src / "ckpt.pt").read_bytes()
    config = [a for a in args if not a.startswith("--")]
    r = run_script("train.py", *config, *TINY, f"--data_dir={char_data}", f"--out_dir={src}",
                   "--init_from=resume", "--max_iters=4", *[a for a in args if a.startswith("--")])
    line = one_line_error(r)
    assert "checkpoint" in line and all(w in line for w in words), line
    assert (src / "ckpt.pt").read_bytes() == before


def test_resume_spd_without_model_flags(spd_run, char_data, tmp_path):
    """No config file, no model flags: the run is the checkpoint's spd DistributedGPT
    (tp_size 2, block_size 32)."""
    out = copy_run(spd_run, tmp_path / "run")
    r = run_script("train.py", "--device=cpu", "--compile=False", "--dtype=float32", "--batch_size=4",
                   "--eval_iters=4", f"--data_dir={char_data}", f"--out_dir={out}", "--init_from=resume",
                   "--max_iters=4", "--eval_interval=4", "--gradient_accumulation_steps=1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "model: distributed_gpt" in r.stdout and "tp=2 simulated" in r.stdout
    c = ckpt(out)
    assert c["iter_num"] == 4 and c["model_type"] == "distributed_gpt"
    assert c["model_options"] == {"gelu_approximate": "none", "tp_size": 2, "block_types": ["spd", "spd"]}
    assert c["model_args"]["block_size"] == 32 and c["model_args"]["n_layer"] == 2
    steps = [rec for rec in records(out) if "loss" in rec and rec["iter"] >= 2]
    assert [rec["fwd_allreduces"] for rec in steps] == [2, 2, 2]  # two spd blocks: one all-reduce each


def test_resume_may_change_tp_size_and_dropout(spd_run, char_data, tmp_path):
    out = copy_run(spd_run, tmp_path / "run")
    r = run_script("train.py", SPD_CONFIG, *TINY, f"--data_dir={char_data}", f"--out_dir={out}",
                   "--init_from=resume", "--max_iters=3", "--eval_interval=3", "--tp_size=1", "--dropout=0.1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ckpt(out)["model_options"]["tp_size"] == 1


# 5. one run per out_dir

def test_second_run_in_the_same_out_dir_refuses(char_data, tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}",
            "--max_iters=100000", "--eval_interval=1000000"]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    try:
        for line in first.stdout:  # the first run holds the lock from before it prints anything
            if line.startswith("iter 1/"):
                break
        r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=2")
        line = one_line_error(r)
        assert str(out) in line and "in use by another train.py run" in line, line
        assert first.poll() is None  # the first run was not disturbed
    finally:
        first.kill()
        first.communicate()


# 6. dt_ms and tokens/s time the training step alone

def test_step_time_excludes_evaluation(char_data, tmp_path):
    out = tmp_path / "run"
    # an evaluation of 2 x 60 batches every 3rd iteration costs ~20 training steps (of TINY's 2 micro-steps);
    # the old timer, from one iteration to the next, put it into that iteration's dt_ms
    train(out, char_data, "--max_iters=11", "--eval_interval=3", "--eval_iters=60")
    steps = {rec["iter"]: rec for rec in records(out) if "loss" in rec}
    with_eval = statistics.median(steps[i]["dt_ms"] for i in (3, 6, 9))
    without = statistics.median(steps[i]["dt_ms"] for i in (4, 5, 7, 8, 10, 11))
    assert with_eval < 5 * without, (with_eval, without)
    for rec in steps.values():
        assert rec["tokens_per_s"] * rec["dt_ms"] / 1000 == pytest.approx(2 * 4 * 32)  # TINY's grad accum 2


# 7. bad input: one line, exit status 2, nothing written

@pytest.fixture(scope="module")
def bad_data(tmp_path_factory, char_data):
    """Copies of the tiny dataset: one whose train.bin has an odd byte count, one
    with a token id past the vocab."""
    base = tmp_path_factory.mktemp("baddata")
    out = {}
    for name in ("odd", "big_id"):
        d = base / name
        shutil.copytree(char_data, d)
        if name == "odd":
            with open(d / "train.bin", "ab") as f:
                f.write(b"\0")
        else:
            ids = np.fromfile(d / "train.bin", dtype=np.uint16)
            ids[len(ids) // 2] = 60000
            ids.tofile(d / "train.bin")
        out[name] = str(d)
    return out


@pytest.mark.parametrize("args, words", [
    (["--device=cuda"], ["device='cuda'", "not available"]),
    (["--device=cuda:7"], ["cuda:7"]),
    (["--device=tpu"], ["device", "'tpu'"]),
    (["--learning_rate=-1e-3"], ["learning_rate", "-0.001"]),
    (["--min_lr=-1e-5"], ["min_lr"]),
    (["--beta1=1.0"], ["beta1", "[0, 1)"]),
    (["--beta2=-0.1"], ["beta2", "-0.1"]),
    (["--seed=-1"], ["seed", "-1"]),
    (["--grad_clip=-1.0"], ["grad_clip", "-1.0"]),
    (["--weight_decay=-0.1"], ["weight_decay"]),
    (["--warmup_iters=-1"], ["warmup_iters", "-1"]),
    (["--gelu_approximate=erf"], ["gelu_approximate", "'erf'"]),
    (["DATA:odd"], ["train.bin", "odd number of bytes"]),
    (["DATA:big_id"], ["train.bin", "token id 60000", "vocab_size"]),
])
def test_bad_input_one_line_exit_2(char_data, bad_data, tmp_path, args, words):
    if args[0].startswith("DATA:"):
        args = [f"--data_dir={bad_data[args[0][5:]]}"]
    out = tmp_path / "out"
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=1", *args)
    line = one_line_error(r)
    assert all(w in line for w in words), line
    assert not out.exists()


def test_out_dir_that_is_a_file(char_data, tmp_path):
    out = tmp_path / "out"
    out.write_text("a file")
    line = one_line_error(run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}",
                                     "--max_iters=1"))
    assert "out_dir" in line and "not a directory" in line, line


def test_pretrained_without_network(char_data, tmp_path):
    out = tmp_path / "out"
    env = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    r = run_script("train.py", "--device=cpu", "--compile=False", "--dtype=float32", "--block_size=32",
                   "--batch_size=4", f"--data_dir={char_data}", f"--out_dir={out}", "--init_from=gpt2",
                   "--max_iters=1", env=env)
    line = one_line_error(r)
    assert "init_from='gpt2'" in line and "pretrained" in line, line
    assert not out.exists()


def test_pretrained_refuses_contradicting_sizes(char_data, tmp_path):
    """GPT-2's sizes and GELU come with its weights: an explicit other value is
    refused before the download."""
    env = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path / 'o'}",
                   "--init_from=gpt2", "--max_iters=1", env=env)
    line = one_line_error(r)
    assert "n_layer=2" in line and "n_layer=12" in line and "gpt2" in line, line


def test_a_resume_cuts_metrics_only_when_it_writes(tmp_path):
    """The records a resumed run will write again are dropped at its first write, never before: a resume that
    stops before logging anything leaves metrics.jsonl as it was (and the cut can be seen to happen)."""
    from tpcomm.train.metrics import MetricsLog

    path = tmp_path / "metrics.jsonl"
    lines = "".join(json.dumps(dict(iter=i, loss=1.0)) + "\n" for i in range(6))
    path.write_text(lines)
    log = MetricsLog(str(tmp_path), enabled=True)
    log.truncate(3)
    assert path.read_text() == lines  # nothing written yet: nothing lost
    log.write(iter=3, loss=0.5)
    assert [json.loads(line)["iter"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]
