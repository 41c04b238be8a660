import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def run_script(*args, env=None, timeout=600):
    """Run a repo script as a user would; returns the CompletedProcess."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=full_env,
                          timeout=timeout)


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """A tiny character-level dataset made from the repo's own text."""
    d = tmp_path_factory.mktemp("chardata")
    text = open(os.path.join(ROOT, "model.py")).read() * 4
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(0.9 * len(ids))
    ids[:n].tofile(d / "train.bin")
    ids[n:].tofile(d / "val.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return str(d)


TINY = ["--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=2", "--n_head=4", "--n_embd=32",
        "--block_size=32", "--batch_size=4", "--eval_iters=4", "--log_interval=1", "--warmup_iters=5",
        "--dropout=0.0"]


def one_line_error(r, status=2):
    """The one stderr line of a script that failed as a user error should (exit status `status`, no traceback)."""
    assert r.returncode == status, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]
