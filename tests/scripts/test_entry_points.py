"""The entry points' user errors: one line naming the key/path and values, exit status 2, no traceback."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import TINY, losses, one_line_error, run_script, train, val_losses


# ---------- items 2-3: bench.py pp_size outside mode='pipeline'; trace summary of malformed events ----------

BENCH_TINY = ["--device=cpu", "--dtype=float32", "--n_layer=2", "--n_head=4", "--n_embd=32",
              "--block_size=16", "--batch_size=2", "--vocab_size=65", "--iters=1", "--warmup=0"]


@pytest.mark.parametrize("mode", ["decode", "train", "memory"])
def test_bench_pp_size_outside_pipeline_mode_is_one_line(mode):
    line = one_line_error(run_script("bench.py", *BENCH_TINY, f"--mode={mode}", "--pp_size=2"))
    assert "pp_size" in line and "2" in line and f"mode={mode!r}" in line and "pipeline" in line, line


@pytest.mark.parametrize("trace, words", [({"traceEvents": [{"foo": 1}]}, "traceEvents[0] is not a trace "
                                           "event"), ({"traceEvents": [{"ph": "X", "name": "aten::mm",
                                                                        "ts": 0, "dur": 1}, 5]},
                                                      "traceEvents[1] is not a trace event"),
                                          ({"traceEvents": {"foo": 1}}, "no 'traceEvents' list"),
                                          ({"traceEvents": [{"ph": "X", "name": "allreduce g fwd L0 tp attn "
                                                             "24576B sim"}]}, "lacks"),
                                          ({"traceEvents": [{"ph": "X", "name": "allreduce g fwd L0 tp attn "
                                                             "24576B sim", "ts": 3}]}, "lacks"),
                                          ({"traceEvents": [{"ph": "X", "name": "ProfilerStep#0", "ts": "0",
                                                             "dur": 5}]}, "lacks"),
                                          ({"traceEvents": [{"ph": "X", "ts": 0, "dur": 5}]}, "lacks"),])
def test_trace_summary_of_malformed_events_is_one_line(tmp_path, trace, words):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    line = one_line_error(run_script("-m", "tpcomm.bench.trace", "summary", str(path)))
    assert words in line and str(path) in line, line


def test_trace_summary_of_a_well_formed_trace_without_collectives_still_says_0(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        {"ph": "X", "name": "ProfilerStep#0", "ts": 0, "dur": 100},
        {"ph": "X", "name": "aten::mm", "ts": 10, "dur": 5}]}))
    r = run_script("-m", "tpcomm.bench.trace", "summary", str(path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "0 fwd + 0 bwd all-reduces" in r.stdout, r.stdout



# ---------- a checkpoint whose config contradicts its weights: every reader refuses it in one line ----------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, char_data):
    """A tiny GPT run (n_layer 2, n_embd 32), checkpoint at iter 2: copy it before changing anything."""
    out = tmp_path_factory.mktemp("entry") / "run"
    train(out, char_data, "--max_iters=2", "--eval_interval=2")
    return out


def copy_run(src, dst, **model_args):
    """A copy of a run's folder; model_args: changed in its checkpoint's config, not in its weights."""
    shutil.copytree(src, dst, symlinks=True)
    if model_args:
        ckpt = torch.load(dst / "ckpt.pt", weights_only=True)
        ckpt["model_args"].update(model_args)
        torch.save(ckpt, dst / "ckpt.pt")
    return dst


def snapshot(folder):
    """Every file under folder with its bytes (to show nothing was written or removed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


READERS = {  # each entry point that loads a checkpoint, on out_dir `out`
    "train": lambda out, data: ["train.py", *TINY, f"--data_dir={data}", f"--out_dir={out}",
                                "--init_from=resume",
                                "--max_iters=4"],
    "sample": lambda out, data: ["sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1",
                                 "--max_new_tokens=2"],
    "spd": lambda out, data: ["spd.py", f"--out_dir={out}", "--tp_size=2", "--eval_iters=1",
                              "--distill_steps=0"],
    "export": lambda out, data: ["export_hf.py", f"--out_dir={out}", f"--hf_dir={out / 'hf'}"],
}
CONTRADICTIONS = [  # (model_args changed, words of the error besides the path)
    (dict(n_embd=64), ["n_embd=64", "transformer.wte.weight", ", 64)", ", 32)"]),
    (dict(n_layer=3), ["n_layer=3", "2 blocks"]),
    (dict(n_layer=1), ["n_layer=1", "2 blocks"]),  # fewer: the extra blocks were once ignored silently
]


@pytest.mark.parametrize("change, words", CONTRADICTIONS, ids=["n_embd", "more_layers", "fewer_layers"])
@pytest.mark.parametrize("reader", list(READERS))
def test_contradicting_checkpoint_is_one_line(tiny_run, char_data, tmp_path, reader, change, words):
    out = copy_run(tiny_run, tmp_path / "run", **change)
    before = snapshot(out)
    line = one_line_error(run_script(*READERS[reader](out, char_data)))
    assert str(out / "ckpt.pt") in line and "contradicts" in line, line
    for w in words:
        assert w in line, (w, line)
    assert snapshot(out) == before  # nothing written (no hf/, no spd/, no config.json rewritten)


@pytest.mark.parametrize("change, words", CONTRADICTIONS + [
    (dict(vocab_size=100), ["vocab_size=100", "transformer.wte.weight", "(100, 32)"]),
    (dict(bias=True), ["bias=True", "ln_1.bias", "lack"]),
    (dict(n_head=5), ["n_head=5", "describe no GPT"]),
], ids=["n_embd", "more_layers", "fewer_layers", "vocab", "bias", "n_head"])
def test_check_weights(tiny_run, tmp_path, change, words):
    """The shared check (tpcomm.train.checkpoint.check_weights, run by load_checkpoint), in process; the
    unchanged checkpoint passes, so the check is not refusing everything."""
    from tpcomm.errors import ConfigError
    from tpcomm.train.checkpoint import load_checkpoint

    load_checkpoint(str(tiny_run))
    out = copy_run(tiny_run, tmp_path / "run", **change)
    with pytest.raises(ConfigError) as e:
        load_checkpoint(str(out))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


# ---------- stale temporary checkpoint files of killed writes ----------

def dead_pid():
    """The pid of a process that has ended (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temp_checkpoints_are_removed_live_ones_kept(tiny_run, char_data, tmp_path):
    out = copy_run(tiny_run, tmp_path / "run")
    stale, live = out / f"ckpt.pt.{dead_pid()}.k1ll3d.tmp", out / f"ckpt.pt.{os.getpid()}.wr1t1ng.tmp"
    other = out / "ckpt.pt.notapid.tmp"  # not save_checkpoint's name: not ours to remove
    for p in (stale, live, other):
        p.write_bytes(b"partial")
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--init_from=resume",
                   "--max_iters=3")
    assert r.returncode == 0, r.stdout + r.stderr
    warning = [line for line in r.stderr.splitlines() if "stale" in line]
    assert len(warning) == 1 and str(stale) in warning[0] and str(live) not in warning[0], r.stderr
    assert not stale.exists() and live.exists() and other.exists()


# ---------- a fresh run into an out_dir holding another run's checkpoint ----------

@pytest.mark.parametrize("init_from", ["scratch", "gpt2"])
def test_fresh_run_into_a_used_out_dir_refuses(tiny_run, char_data, tmp_path, init_from):
    out = copy_run(tiny_run, tmp_path / "run")
    before = snapshot(out)
    line = one_line_error(run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}",
                                     f"--init_from={init_from}", "--max_iters=1"))
    for w in (str(out), str(out / "ckpt.pt"), f"init_from={init_from!r}", "--init_from=resume",
              "--overwrite=True"):
        assert w in line, (w, line)
    assert snapshot(out) == before


def test_fresh_run_refuses_a_sharded_checkpoint_too(char_data, tmp_path):
    out = tmp_path / "run"
    (out / "ckpt_sharded.4").mkdir(parents=True)
    os.symlink("ckpt_sharded.4", out / "ckpt_sharded")
    line = one_line_error(run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}",
                                     "--max_iters=1"))
    assert str(out / "ckpt_sharded") in line and "--overwrite=True" in line, line


def test_overwrite_replaces_the_previous_run(tiny_run, char_data, tmp_path):
    out = copy_run(tiny_run, tmp_path / "run")
    old = torch.load(out / "ckpt.pt", weights_only=True)
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=3",
                   "--eval_interval=3", "--learning_rate=1e-3", "--overwrite=True")
    assert r.returncode == 0, r.stdout + r.stderr
    new = torch.load(out / "ckpt.pt", weights_only=True)
    assert new["iter_num"] == 3 != old["iter_num"] and new["config"]["learning_rate"] == 1e-3
    assert json.loads((out / "config.json").read_text())["learning_rate"] == 1e-3
    assert sorted(losses(out)) == [0, 1, 2, 3]  # the metrics are this run's alone


def test_overwrite_removes_the_previous_checkpoint_at_the_start(tiny_run, char_data, tmp_path):
    """A replacing run that saves nothing (max_iters=0: iteration 0 is never saved) leaves no checkpoint of
    the run it replaced beside its own config."""
    out = copy_run(tiny_run, tmp_path / "run")
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=0",
                   "--overwrite=True")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (out / "ckpt.pt").exists() and "removed the previous run's checkpoint" in r.stdout, r.stdout


# ---------- a run shorter than eval_interval ends evaluated, saved, with a closing line ----------

def test_short_run_ends_evaluated_and_saved(char_data, tmp_path):
    out = tmp_path / "short"
    r = train(out, char_data, "--max_iters=3", "--eval_interval=100")
    val = val_losses(out)
    assert sorted(val) == [0, 3]  # iteration 0 and the last one
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 3
    assert r.stdout.strip().splitlines()[-1] == (f"done: 4 steps (iters 0..3), val loss {val[3]:.4f} at iter "
                                                 "3, " f"checkpoint {out / 'ckpt.pt'} (iter 3)")


def test_resume_from_the_last_iteration_checkpoint_continues_the_same_run(char_data, tmp_path):
    common = ["--eval_interval=100", "--lr_decay_iters=6", "--gradient_accumulation_steps=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    train(full, char_data, *common, "--max_iters=6")
    train(part, char_data, *common, "--max_iters=4")  # saved at iter 4 (its last), before step 4
    r = train(part, char_data, *common, "--max_iters=6", "--init_from=resume")
    assert r.stdout.strip().splitlines()[-1].startswith("done: 3 steps (iters 4..6)"), r.stdout
    a, b = losses(full), losses(part)
    assert sorted(a) == sorted(b) == list(range(7))
    for it in a:  # same ops in the same order: ~exact
        assert b[it] == pytest.approx(a[it], rel=1e-6, abs=1e-6), it
    assert val_losses(full) == pytest.approx(val_losses(part), rel=1e-6)  # evaluated at 0 and 6 both
    assert sorted(val_losses(part)) == [0, 6]


# ---------- a corrupt sharded checkpoint is reported as corrupt, not absent ----------

@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory, char_data):
    """A one-process run with a sharded checkpoint at iter 2 (ckpt_sharded -> ckpt_sharded.2)."""
    out = tmp_path_factory.mktemp("entry") / "sharded"
    train(out, char_data, "--max_iters=2", "--eval_interval=2", "--checkpoint_format=sharded")
    assert (out / "ckpt_sharded").is_symlink()
    return out


def truncate(path, size):
    path.write_bytes(path.read_bytes()[:size])


CORRUPTIONS = {
    "no_meta": lambda d: (d / "meta.pt").unlink(),
    "junk_meta": lambda d: (d / "meta.pt").write_bytes(b"not a checkpoint" * 8),
    "truncated_metadata": lambda d: truncate(d / ".metadata", 100),
    "junk_metadata": lambda d: (d / ".metadata").write_bytes(b"junk" * 64),
    "truncated_distcp": lambda d: [truncate(p, p.stat().st_size // 2) for p in d.glob("*.distcp")],
    # right length
    "junk_distcp": lambda d: [p.write_bytes(bytes(p.stat().st_size)) for p in d.glob("*.distcp")],
    "link_to_nothing": lambda d: shutil.rmtree(d),
}


@pytest.mark.parametrize("how", list(CORRUPTIONS))
@pytest.mark.parametrize("reader", ["convert", "resume"])
def test_corrupt_sharded_checkpoint_is_one_line(sharded_run, char_data, tmp_path, reader, how):
    out = copy_run(sharded_run, tmp_path / "run")
    CORRUPTIONS[how](out / "ckpt_sharded.2")
    cmd = (["-m", "tpcomm.train.sharded_checkpoint", str(out)] if reader == "convert" else
           ["train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--init_from=resume",
            "--checkpoint_format=sharded", "--max_iters=4"])
    line = one_line_error(run_script(*cmd))
    assert str(out / "ckpt_sharded") in line and "corrupt or incomplete" in line, line
    assert not (out / "ckpt.pt").exists()


def test_intact_sharded_checkpoint_converts(sharded_run, tmp_path):
    """The fixture is whole: the corruptions above, not the copy, make the errors."""
    out = copy_run(sharded_run, tmp_path / "run")
    r = run_script("-m", "tpcomm.train.sharded_checkpoint", str(out))
    assert r.returncode == 0 and (out / "ckpt.pt").exists(), r.stdout + r.stderr


@pytest.mark.parametrize("script", ["train.py", "sample.py", "bench.py", "experiment.py", "spd.py",
                                    "export_hf.py", "comm_model.py"])
def test_help_prints_usage_and_exits_0(script):
    """--help: the script's docstring (its example commands) and, for configurator scripts, every key."""
    r = run_script(script, "--help", timeout=120)
    assert r.returncode == 0 and not r.stderr and f"{script.removesuffix('.py')}" in r.stdout, (r.stdout,
                                                                                                r.stderr)
