import json
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


# ---------- train.py runs compared through their metrics.jsonl ----------

TORCHRUN = ["-m", "torch.distributed.run", "--standalone"]


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return list(map(json.loads, f))


def losses(out_dir):
    return {r["iter"]: r["loss"] for r in metrics(out_dir) if "loss" in r}


def val_losses(out_dir):
    return {r["iter"]: r["val_loss"] for r in metrics(out_dir) if "val_loss" in r}


def train(out_dir, data, *extra, nproc=None):
    """train.py [a config file: extra's first] TINY data_dir out_dir [the rest of extra]."""
    config = [extra[0]] if extra and extra[0].endswith(".py") else []
    args = ["train.py", *config, *TINY, f"--data_dir={data}", f"--out_dir={out_dir}", *extra[len(config):]]
    if nproc:
        args = [*TORCHRUN, f"--nproc_per_node={nproc}", *args]
    r = run_script(*args, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return r


def assert_same(a, b, rel, what):
    assert sorted(a) == sorted(b) and a, (what, sorted(a), sorted(b))
    for it in a:
        assert b[it] == pytest.approx(a[it], rel=rel), (what, it, a[it], b[it])


def differs(a, b, rel):
    """a and b are told apart at tolerance rel (the comparison above would fail)."""
    return any(b[it] != pytest.approx(a[it], rel=rel) for it in a)


def pytest_configure(config):
    config.addinivalue_line("markers", "fast: in `make test-fast`, the few-minute tier (README, Tests)")
    config.addinivalue_line("markers", "slow: minutes on 2 cores; in the full suite only")


# `make test-fast` (pytest -m fast): each block type against the reference, sim == real at tp 2, torch.compile
# tracing once, one train / resume / sample round, the documented commands, bad input at tiny sizes. A file
# maps to None (all its tests) or to the test names (a parametrized test: all its cases, or those whose id holds
# the given text after '['). Names are matched exactly (a parametrized test by its function name), or by
# prefix when they hold '['.
FAST = {
    "test_model.py": None,
    "test_tensor_parallel.py": None,
    "test_generate.py": None,
    "test_configurator.py": None,
    "test_docs.py": None,
    "test_compile.py": ["test_compiled_traces_once_and_equals_eager", "test_recompile_detection_can_fail"],
    "test_real_tp.py": ["test_logits_loss_and_gradients_match_simulation[tp2", "test_dropout_masks_match_simulation[tp2",
                        "test_comparisons_can_fail[tp2", "test_bad_launch_outside_torchrun"],
    "test_train.py": ["test_resume_reproduces_uninterrupted_run", "test_bad_input_one_line_exit_2",
                      "test_bad_input_keeps_checkpoint"],
    "test_sample.py": ["test_sample_from_a_checkpoint", "test_sample_bad_input", "test_sample_bad_settings"],
    "test_bench.py": ["test_bad_values_are_one_line", "test_cli_error_has_no_traceback"],
    "test_checkpoints.py": ["test_unreadable_checkpoint_is_one_line", "test_nanogpt_reads_our_checkpoint"],
    "test_overlap.py": ["test_chunked_equals_unchunked_and_the_per_shard_reference", "test_dropout_masks_are_the_unchunked_ones",
                        "test_keep_mask_rows_are_the_whole_masks_rows", "test_counts_k_times_the_all_reduces_each_1_over_k_of_the_bytes",
                        "test_config_refuses_bad_tp_overlap"],
    "test_sequence_parallel.py": ["test_equals_the_per_shard_reference", "test_dropout_equals_without_sp",
                                  "test_counts_reduce_scatters_and_all_gathers_apart",
                                  "test_config_refuses_ladder_and_overlap", "test_activation_prediction_is_megatrons_formula"],
    "test_compression.py": ["test_roundtrip_error_bounds", "test_off_is_the_plain_all_reduce_bit_for_bit",
                            "test_simulated_equals_per_shard_reference[tp-parallel-ladder-ladder-int8",
                            "test_counted_bytes_are_the_compressed_payload", "test_config_refuses_bad_compression",
                            "test_real_tp2_equals_simulated[int8"],
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = FAST.get(os.path.basename(str(item.fspath)), ())
        if names is None or any(item.name.startswith(n) if "[" in n else item.originalname == n for n in names):
            item.add_marker("fast")
