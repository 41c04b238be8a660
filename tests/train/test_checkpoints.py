"""Checkpoints: the format, nanoGPT interop both ways, safe loading and saving, and export to Hugging Face."""

import dataclasses
import os
import shutil

import pytest
import torch

from conftest import TINY, one_line_error, run_script
from tpcomm.errors import ConfigError
from tpcomm.train.checkpoint import load_checkpoint

SPD = ["--model_type=distributed_gpt", "--tp_size=2", "--block_types=['spd','parallel']"]
TP = ["--model_type=distributed_gpt", "--tp_size=2", "--block_types=tp", "--bias=True",
      "--gelu_approximate=tanh"]


def train(out_dir, data, *extra):
    r = run_script("train.py", *TINY, "--dataset=chars", f"--data_dir={data}", f"--out_dir={out_dir}", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def load(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, char_data):
    """Tiny trained runs (4 steps, checkpoint at iter 4): a GPT without biases (exact GELU), an spd/parallel
    DistributedGPT, and an all-'tp' DistributedGPT with biases and the tanh GELU."""
    base, made = tmp_path_factory.mktemp("ckpt_runs"), {}

    def run(name):  # trained on first use
        if name not in made:
            made[name] = str(base / name)
            train(made[name], char_data, "--max_iters=4", "--eval_interval=4",
                  *{"gpt": [], "spd": SPD, "tp": TP}[name])
        return made[name]
    return run


# ---------- the format ----------

def test_checkpoint_format(runs):
    from model import NANOGPT_ARGS

    for name, model_type in (("gpt", "gpt"), ("spd", "distributed_gpt")):
        ckpt = load(runs(name))
        assert set(ckpt) == {"model", "optimizer", "model_args", "model_type", "model_options", "iter_num",
                             # + cuda_rng_state on CUDA
                             "best_val_loss", "config", "rng_state", "scaler", "vocab_chars"}
        assert list(ckpt["model_args"]) == list(NANOGPT_ARGS)
        assert ckpt["model_type"] == model_type and ckpt["iter_num"] == 4
        assert ckpt["scaler"] == {}  # fp32: the scaler is disabled and has no state
    assert load(runs("gpt"))["model_options"] == {"gelu_approximate": "none"}
    assert load(runs("spd"))["model_options"] == {"gelu_approximate": "none", "tp_size": 2,
                                                  "block_types": ["spd", "parallel"]}
    assert load(runs("tp"))["model_options"]["gelu_approximate"] == "tanh"


@dataclasses.dataclass
class NanoGPTConfig:
    """nanoGPT's GPTConfig (model.py), field for field."""
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


def nanogpt_state_shapes(c):
    """The state dict nanoGPT's GPT(c) has (with flash attention, so no attn.bias mask buffer)."""
    C = c.n_embd
    shapes = {"transformer.wte.weight": (c.vocab_size, C), "transformer.wpe.weight": (c.block_size, C),
              "transformer.ln_f.weight": (C,), "lm_head.weight": (c.vocab_size, C)}
    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": (C,), p + "ln_2.weight": (C,), p + "attn.c_attn.weight": (3 * C, C),
                       p + "attn.c_proj.weight": (C, C), p + "mlp.c_fc.weight": (4 * C, C),
                       p + "mlp.c_proj.weight": (C, 4 * C)})
        if c.bias:
            shapes.update({p + "ln_1.bias": (C,), p + "ln_2.bias": (C,), p + "attn.c_attn.bias": (3 * C,),
                           p + "attn.c_proj.bias": (C,), p + "mlp.c_fc.bias": (4 * C,),
                           p + "mlp.c_proj.bias": (C,)})
    if c.bias:
        shapes["transformer.ln_f.bias"] = (C,)
    return shapes


@pytest.mark.parametrize("name", ["gpt", "tp"])
def test_nanogpt_reads_our_checkpoint(runs, name):
    """What nanoGPT's sample.py does: GPTConfig(**checkpoint['model_args']), then load_state_dict of the model
    after stripping '_orig_mod.'. A distributed_gpt checkpoint is GPT-layout too."""
    ckpt = load(runs(name))
    conf = NanoGPTConfig(**ckpt["model_args"])
    sd = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    assert {k: tuple(v.shape) for k, v in sd.items()} == nanogpt_state_shapes(conf)


def nanogpt_checkpoint(ckpt, data_dir):
    """Our checkpoint rewritten as nanoGPT's train.py writes one: a compiled model's
    keys, best_val_loss a tensor,
    config = nanoGPT's globals, no model_type/model_options/rng_state/scaler."""
    config = dict(out_dir="out", eval_interval=4, dataset=data_dir,  # os.path.join('data', abs) == abs
                  n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=False, learning_rate=6e-4, device="cpu",
                  dtype="float32", compile=True, backend="nccl", init_from="scratch", block_size=32)
    return {"model": {"_orig_mod." + k: v for k, v in ckpt["model"].items()}, "optimizer": ckpt["optimizer"],
            "model_args": dict(ckpt["model_args"]), "iter_num": ckpt["iter_num"],
            "best_val_loss": torch.tensor(ckpt["best_val_loss"]), "config": config}


def test_resume_and_sample_a_nanogpt_checkpoint(runs, char_data, tmp_path):
    out = tmp_path / "nano"
    out.mkdir()
    torch.save(nanogpt_checkpoint(load(runs("gpt")), char_data), out / "ckpt.pt")
    r = train(out, char_data, "--init_from=resume", "--max_iters=6", "--eval_interval=6")
    assert "iter 4/6: loss" in r.stdout and "iter 6/6: loss" in r.stdout
    ckpt = load(out)
    assert ckpt["iter_num"] == 6 and ckpt["model_type"] == "gpt"
    torch.save(nanogpt_checkpoint(load(runs("gpt")), char_data), out / "ckpt.pt")
    r = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=10",
                   "--start=def ")
    assert r.returncode == 0, r.stderr
    assert "def " in r.stdout


def test_old_format_still_loads(runs, tmp_path):
    """This repo's checkpoints before model_options: tp_size and block_types inside model_args, no scaler."""
    from tpcomm.train.checkpoint import build_model_from_checkpoint, load_checkpoint

    ckpt = load(runs("spd"))
    old = {k: v for k, v in ckpt.items() if k not in ("model_options", "scaler")}
    old["model_args"] = dict(ckpt["model_args"], tp_size=2, block_types=["spd", "parallel"])
    torch.save(old, tmp_path / "ckpt.pt")
    model = build_model_from_checkpoint(load_checkpoint(str(tmp_path)))
    assert model.config.block_types == ["spd", "parallel"] and model.config.tp_size == 2
    assert torch.equal(model.gpt_state_dict()["lm_head.weight"], ckpt["model"]["lm_head.weight"])


# ---------- loading and saving safely ----------

class Plant:
    def __reduce__(self):
        return (print, ("unpickled",))


def write_bad_checkpoint(path, kind, good):
    if kind == "empty":
        open(path, "wb").close()
    elif kind == "truncated":
        data = open(good, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    elif kind == "junk":
        open(path, "wb").write(b"not a checkpoint\n" * 10)
    elif kind == "object":  # weights_only refuses it; torch's message would advise weights_only=False
        torch.save({"model": Plant()}, path)
    elif kind == "not_training":
        torch.save({"weights": torch.zeros(2)}, path)


@pytest.mark.parametrize("kind", ["empty", "truncated", "junk", "object", "not_training"])
def test_unreadable_checkpoint_is_one_line(runs, char_data, tmp_path, kind):
    path = tmp_path / "ckpt.pt"
    write_bad_checkpoint(path, kind, os.path.join(runs("gpt"), "ckpt.pt"))
    before = path.read_bytes()
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path}",
                   "--init_from=resume")
    line = one_line_error(r)
    assert str(path) in line and "weights_only" not in line, line
    r = run_script("sample.py", f"--out_dir={tmp_path}", "--device=cpu")
    line = one_line_error(r)
    assert str(path) in line and "weights_only" not in line, line
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"] and path.read_bytes() == before


def test_temp_file_is_per_process(tmp_path, monkeypatch):
    """Two writers of one out_dir (say a rogue second run) must never write the same temp file."""
    from tpcomm.train import checkpoint
    written = []
    monkeypatch.setattr(torch, "save", lambda obj, f: (written.append(f), open(f, "wb").write(b"x")))
    checkpoint.save_checkpoint({}, str(tmp_path))
    checkpoint.save_checkpoint({}, str(tmp_path))
    assert len(set(written)) == 2 and all(str(os.getpid()) in os.path.basename(p) for p in written), written
    assert os.path.join(str(tmp_path), "ckpt.pt.tmp") not in written
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


# train.py with torch.save failing as a full disk fails, run as a script of its own (so it forks from the fork
# server like train.py itself; the working directory is the repository's)
FULL_DISK = """
import errno, os, runpy, sys, torch
def full(obj, f, *a, **k):
    open(f, "wb").write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")
torch.save = full
sys.argv, sys.path[0] = ["train.py", *sys.argv[1:]], os.getcwd()
runpy.run_path("train.py", run_name="__main__")
"""


def test_disk_full_while_saving_keeps_checkpoint(runs, char_data, tmp_path):
    out = tmp_path / "run"
    os.makedirs(out)
    good = open(os.path.join(runs("gpt"), "ckpt.pt"), "rb").read()
    (out / "ckpt.pt").write_bytes(good)
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    r = run_script(str(script), *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--init_from=resume",
                   "--max_iters=6", "--eval_interval=5")
    line = one_line_error(r, status=1)
    assert "could not write checkpoint" in line and "No space left" in line, line
    assert (out / "ckpt.pt").read_bytes() == good
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


# ---------- export to Hugging Face ----------

@pytest.mark.parametrize("name", ["gpt", "tp"])
def test_export_hf_matches_our_logits(runs, tmp_path, name):
    from transformers import GPT2LMHeadModel

    from tpcomm.train.checkpoint import build_model_from_checkpoint, load_checkpoint

    hf_dir = tmp_path / "hf"
    r = run_script("export_hf.py", f"--out_dir={runs(name)}", f"--hf_dir={hf_dir}")
    assert r.returncode == 0, r.stdout + r.stderr
    hf = GPT2LMHeadModel.from_pretrained(str(hf_dir)).eval()
    ours = build_model_from_checkpoint(load_checkpoint(runs(name))).eval()
    assert hf.config.activation_function == {"gpt": "gelu", "tp": "gelu_new"}[name]
    idx = torch.randint(ours.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, _ = ours(idx, idx)
        got = hf(idx).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)  # fp32, the same sums in another order: ~1e-6
        # anti-vacuity: a changed weight shows up in the comparison
        hf.transformer.h[1].mlp.c_fc.weight[0, 0] += 0.1
        assert not torch.allclose(hf(idx).logits, want, atol=1e-5, rtol=1e-5)


def test_export_refuses_spd(runs, tmp_path):
    r = run_script("export_hf.py", f"--out_dir={runs('spd')}", f"--hf_dir={tmp_path / 'hf'}")
    line = one_line_error(r)
    assert "spd" in line and "parallel" in line and "not GPT-2" in line, line
    assert not (tmp_path / "hf").exists()


def test_export_hf_dir_that_cannot_be_created_is_one_line(runs, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for hf_dir in (afile / "hf", afile):  # under a file; a file itself
        line = one_line_error(run_script("export_hf.py", f"--out_dir={runs('gpt')}", f"--hf_dir={hf_dir}"))
        assert str(hf_dir) in line, line
    assert afile.read_text() == "x"


def test_export_refuses_a_non_empty_hf_dir_unless_overwrite(runs, tmp_path):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    (hf_dir / "notes.txt").write_text("mine")
    line = one_line_error(run_script("export_hf.py", f"--out_dir={runs('gpt')}", f"--hf_dir={hf_dir}"))
    assert str(hf_dir) in line and "not empty" in line and "--overwrite=True" in line, line
    assert sorted(p.name for p in hf_dir.iterdir()) == ["config.json", "notes.txt"]
    assert (hf_dir / "config.json").read_text() == "{}"  # nothing was written over
    r = run_script("export_hf.py", f"--out_dir={runs('gpt')}", f"--hf_dir={hf_dir}", "--overwrite=True")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (hf_dir / "config.json").read_text() != "{}" and (hf_dir / "model.safetensors").exists()
    assert (hf_dir / "notes.txt").read_text() == "mine"  # written over, not cleared


def test_export_special_tokens_follow_the_tokenizer(runs, tmp_path):
    """A character-level model (vocab 65-ish) has no GPT-2 <|endoftext|>: bos/eos None, and transformers loads
    and generates without a word about them; GPT-2 BPE vocabularies keep 50256."""
    import json

    from tpcomm.convert.hf_export import hf_config

    hf_dir = tmp_path / "hf"
    r = run_script("export_hf.py", f"--out_dir={runs('gpt')}", f"--hf_dir={hf_dir}")
    assert r.returncode == 0, r.stdout + r.stderr
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["vocab_size"] < 50257 and config["bos_token_id"] is None and config["eos_token_id"] is None

    # anti-vacuity: the old export (GPT-2's 50256 in a 65-token vocabulary) is warned about. Both folders load
    # in one interpreter (transformers' import is most of its time), their warnings apart by a line between
    # them.
    old = tmp_path / "old"
    shutil.copytree(hf_dir, old)
    (old / "config.json").write_text(json.dumps(dict(config, bos_token_id=50256, eos_token_id=50256)))
    code = ("import sys, torch; from transformers import GPT2LMHeadModel\n"
            f"for folder in ({str(hf_dir)!r}, {str(old)!r}):\n"
            "    m = GPT2LMHeadModel.from_pretrained(folder)\n"
            "    m.generate(torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, do_sample=False)\n"
            "    print('ok'); print('-- next folder --', file=sys.stderr, flush=True)")
    r = run_script("-W", "always", "-c", code)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "ok"], r.stdout + r.stderr
    new_stderr, old_stderr, _ = r.stderr.split("-- next folder --")
    assert "token_id" not in new_stderr, new_stderr
    assert "bos_token_id" in old_stderr, old_stderr
    spec = dict(vocab_size=50304, block_size=32, n_embd=32, n_layer=1, n_head=4, gelu_approximate="none")
    for vocab_size, eot in ((50257, 50256), (50304, 50256), (65, None), (50256, None)):
        c = hf_config(dict(spec, vocab_size=vocab_size))
        assert c.bos_token_id == c.eos_token_id == eot, vocab_size


class _Planted:
    """A pickle whose loading runs a command (what an attacker would put in DCP's .metadata)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_planted_dcp_metadata_pickle_runs_nothing(char_data, tmp_path):
    """A sharded checkpoint's .metadata replaced by a pickle whose __reduce__ calls os.system: resuming it and
    converting it are one line each, exit status 2, and the command never runs (torch's own reader would run
    it). The real .metadata passes the same reader (the refusal is not of everything)."""
    import pickle

    out = tmp_path / "out"
    train(str(out), char_data, "--max_iters=2", "--eval_interval=2", "--checkpoint_format=sharded")
    meta = out / "ckpt_sharded" / ".metadata"
    from tpcomm.train.sharded_checkpoint import read_dcp_metadata
    assert read_dcp_metadata(str(out / "ckpt_sharded")).state_dict_metadata
    marker = tmp_path / "ran"
    meta.write_bytes(pickle.dumps(_Planted(marker)))
    resume = run_script("train.py", *TINY, "--dataset=chars", f"--data_dir={char_data}", f"--out_dir={out}",
                        "--init_from=resume", "--checkpoint_format=sharded", "--max_iters=4")
    assert "nothing of it run: posix.system is not something DCP metadata holds" in one_line_error(resume)
    convert = run_script("-m", "tpcomm.train.sharded_checkpoint", str(out))
    assert "nothing of it run" in one_line_error(convert)
    assert not marker.exists()


@pytest.mark.parametrize("value, words", [(1e-300, "whole number of channels"),
                                          ("half", "caat_sync_fraction")])
def test_a_checkpoints_bad_option_is_refused_naming_the_checkpoint(runs, tmp_path, value, words):
    """A hand-changed block type option in a checkpoint: refused in the option's own words and the
    checkpoint's path, before anything is built (the same option from the command line:
    tests/tp/test_partial_sync.py)."""
    ckpt = load(runs("tp"))
    n_layer = ckpt["model_args"]["n_layer"]
    ckpt["model_options"].update(block_types=["caat"] * n_layer, caat_sync_fraction=value)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(ConfigError) as e:
        load_checkpoint(str(tmp_path))
    assert str(tmp_path / "ckpt.pt") in str(e.value) and words in str(e.value), e.value
    ckpt["model_options"]["caat_sync_fraction"] = 0.5
    torch.save(ckpt, tmp_path / "ckpt.pt")
    load_checkpoint(str(tmp_path))  # the comparison can fail: a good fraction loads
