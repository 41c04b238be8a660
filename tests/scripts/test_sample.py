"""sample.py reads checkpoints of either model type (DistributedGPT rebuilt with its own block pattern)."""

import pytest

from conftest import TINY, run_script


@pytest.mark.parametrize("model", [[], ["--model_type=distributed_gpt", "--tp_size=2",
                                        "--block_types=['spd','parallel']"]], ids=["gpt", "distributed_gpt"])
def test_sample_from_a_checkpoint(char_data, tmp_path, model):
    out = str(tmp_path / "run")
    r = run_script("train.py", *TINY, "--dataset=chars", f"--data_dir={char_data}", f"--out_dir={out}",
                   "--max_iters=10", "--eval_interval=10", *model)
    assert r.returncode == 0, r.stderr
    r = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=2", "--max_new_tokens=30",
                   "--start=def ")
    assert r.returncode == 0, r.stderr
    samples = r.stdout.split("loading ")[-1].split("\n", 1)[1].split("---------------")
    assert len(samples) == 3 and all(s.strip().startswith("def") for s in samples[:2]), r.stdout
    assert len(samples[0].strip()) >= 30


def test_sample_bad_input(tmp_path):
    r = run_script("sample.py", f"--out_dir={tmp_path}", "--device=cpu")
    assert r.returncode == 2 and "no checkpoint" in r.stderr and "Traceback" not in r.stderr
    r = run_script("sample.py", "--init_from=gpt3", "--device=cpu")
    assert r.returncode == 2 and "init_from" in r.stderr and len(r.stderr.strip().splitlines()) == 1


class Planted:
    """Unpickled, it would create the file at self.path: what a crafted meta.pkl can do to pickle.load."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_sample_never_unpickles_meta(tmp_path):
    import pickle

    import torch

    from model import GPT, GPTConfig, NANOGPT_ARGS

    data, out, planted = tmp_path / "data", tmp_path / "run", tmp_path / "planted"
    data.mkdir()
    out.mkdir()
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 65, "stoi": Planted(str(planted)), "itos": {}}, f)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=65, bias=False))
    torch.save({"model": model.state_dict(), "model_args": {k: getattr(model.config, k)
                                                            for k in NANOGPT_ARGS}, "iter_num": 1,
                "best_val_loss": 1.0, "config": {"dataset": "crafted", "data_dir": str(data)}},
               out / "ckpt.pt")
    r = run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=2")
    assert not planted.exists()  # the pickle's code never ran
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "meta.pkl" in lines[0] and "refusing" in lines[0], r.stderr


@pytest.mark.parametrize("args, words", [
    (["--temperature=0"], ["temperature", "> 0"]),
    (["--temperature=-1.0"], ["temperature", "-1.0"]),
    (["--top_k=0"], ["top_k", "0"]),
    (["--num_samples=0"], ["num_samples", "0"]),
    (["--max_new_tokens=-1"], ["max_new_tokens", "-1"]),
    (["--start="], ["prompt is empty"]),
    (["FILE:latin1"], ["not UTF-8"]),
    (["--device=cuda:7"], ["cuda:7"]),
    (["--start=a", "--prompt=b"], ["give the prompt once", "'a'", "'b'"]),
    (["--prompt="], ["prompt is empty"]),
    (["--tp_size=0"], ["tp_size", "0"]),
    # real TP samples a distributed_gpt checkpoint, and there is none
    (["--tp_mode=real"], ["no checkpoint"]),
    (["--tp_mode=real", "--init_from=gpt2"], ["tp_mode='real'", "init_from='gpt2'"]),
])
def test_sample_bad_settings(tmp_path, args, words):
    if args[0] == "FILE:latin1":
        (tmp_path / "prompt.txt").write_bytes("caf\xe9".encode("latin-1"))
        args = [f"--start=FILE:{tmp_path / 'prompt.txt'}"]
    r = run_script("sample.py", f"--out_dir={tmp_path}", "--device=cpu", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), r.stderr


def test_sample_bad_layouts(char_data, tmp_path):
    """A checkpoint whose heads tp_size does not divide; real TP outside torchrun;
    real TP of a GPT checkpoint."""
    out = tmp_path / "run"
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=2",
                   "--eval_interval=2", "--model_type=distributed_gpt", "--tp_size=2")
    assert r.returncode == 0, r.stderr
    for args, words in ((["--tp_size=3"], ["n_head (4)", "tp_size (3)"]),
                        (["--tp_mode=real"], ["tp_mode='real'", "torchrun"])):
        r = run_script("sample.py", f"--out_dir={out}", "--device=cpu", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and all(w in r.stderr for w in words), r.stderr
    gpt = tmp_path / "gpt"
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={gpt}", "--max_iters=2",
                   "--eval_interval=2")
    r = run_script("sample.py", f"--out_dir={gpt}", "--device=cpu", "--tp_mode=real")
    assert (r.returncode == 2 and "distributed_gpt checkpoint" in r.stderr
            and "Traceback" not in r.stderr), r.stderr
