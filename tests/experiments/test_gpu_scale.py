"""The gpu-scale sweep: the Linux corpus (data/linux/prepare.py, data/linux_corpus.py),
the sweep's sizes, its CPU rehearsal (the GPU path with device cpu, fp32, eager, tiny sizes), and
the scale axis in the report."""

import hashlib
import json
import os
import random
import re

import numpy as np
import pytest

from conftest import ROOT, one_line_error, run_script
from data import linux_corpus as lc
from tpcomm.experiments import results
from tpcomm.experiments.report import scale_report
from tpcomm.experiments.sweep_plan import (AXES_SIZE, AXES_STEPS, PATTERNS, SCALE_PATTERNS, SCALE_SEEDS,
                                           SCALE_SIZES, SWEEPS, scale_runs)

PREPARE = os.path.join("data", "linux", "prepare.py")
C_WORDS = ["int", "return", "static", "void", "struct", "if", "(", ")", "{", "}", ";", "x", "0", "\n", "\t",
           " ", "*"]


def c_file(path, n, seed):
    rng = random.Random(seed)
    path.write_text("".join(rng.choice(C_WORDS) + " " for _ in range(n)))
    return str(path)


def decode(path):
    return "".join(lc.VOCAB[i] for i in np.fromfile(path, dtype=np.uint16))


# ---------- the corpus ----------

def test_select_keeps_the_smallest_keys_that_reach_the_need():
    """select() streams and evicts; the reference sorts everything by key and takes the shortest prefix."""
    rng = random.Random(0)
    files = [(f"linux/dir{i % 7}/f{i}.c", b"x" * rng.randint(1, 50)) for i in range(300)]
    files.append(("linux/bad.c", "caf\u00e9".encode()))  # outside VOCAB: left out
    for need in (1, 500, 4000, 10 ** 9):
        kept, dropped = lc.select(iter(files), need)
        ordered = sorted(files[:-1], key=lambda f: lc.path_key(f[0]))
        ref, total = [], 0
        for f in ordered:
            if total >= need:
                break
            ref.append(f)
            total += len(f[1])
        assert kept == ref and dropped == 1, need
    assert lc.select(iter(files), 500)[0] != lc.select(iter(files), 4000)[0]  # the comparison can fail


def test_prepare_local_files_then_compact_and_unpack(tmp_path):
    a, b = c_file(tmp_path / "a.c", 3000, 1), c_file(tmp_path / "b.h", 3000, 2)
    bad = tmp_path / "c.c"
    bad.write_text("/* caf\u00e9 */\n")
    out = tmp_path / "out"
    r = run_script(PREPARE, "--input", a, b, str(bad), "--out_dir", str(out), "--compact")
    assert r.returncode == 0, r.stderr
    assert "1 left out" in r.stdout
    stream = "".join(open(p).read() for p in sorted((a, b), key=lc.path_key))  # hash order of the paths
    val, train = decode(out / "val.bin"), decode(out / "train.bin")
    assert val + train == stream and len(val) == len(stream) // 10
    meta = json.loads((out / "meta.json").read_text())
    assert meta["vocab_size"] == 97 and "".join(meta["chars"]) == lc.VOCAB
    source = json.loads((out / "source.json").read_text())
    assert source["sha256"] == hashlib.sha256(stream.encode()).hexdigest()
    assert (source["train_tokens"], source["val_tokens"]) == (len(train), len(val))
    # the compact form gives the same files back
    again = tmp_path / "again"
    r = run_script(PREPARE, "--unpack", str(out / lc.COMPACT), "--out_dir", str(again))
    assert r.returncode == 0, r.stderr
    for name in ("train.bin", "val.bin", "meta.json", "source.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    # a compact form whose text does not match its recorded sha256 is refused in one line
    source["sha256"] = "0" * 64
    lc.pack(str(tmp_path / "forged.tar.xz"), val.encode(), train.encode(), source)
    r = run_script(PREPARE, "--unpack", str(tmp_path / "forged.tar.xz"), "--out_dir", str(tmp_path / "x"))
    assert "sha256" in one_line_error(r)


def test_prepare_bad_input(tmp_path):
    fake = tmp_path / "linux.tar.xz"
    fake.write_bytes(b"not the package")
    cases = [(["--tarball", str(tmp_path / "nope.tar.xz")], "apt-get install -y linux-source-6.12"),
             (["--tarball", str(fake)], "is not the pinned linux-source-6.12"),
             (["--input", c_file(tmp_path / "a.c", 100, 0), "--train_tokens", "0"], "--train_tokens 0"),
             (["--unpack", str(tmp_path / "missing.tar.xz")], "no such file")]
    for args, words in cases:
        line = one_line_error(run_script(PREPARE, *args, "--out_dir", str(tmp_path / "out")))
        assert words in line, (args, line)
    assert not os.path.exists(tmp_path / "out" / "train.bin")


def test_pinned_source_and_sizes_are_recorded():
    assert len(lc.TARBALL_SHA256) == 64 and lc.VERSION.startswith("6.12.")
    largest = max(SCALE_SIZES, key=lambda s: s[0] * s[1] ** 2)
    assert lc.TRAIN_TOKENS >= AXES_STEPS * 64 * SCALE_SIZES[largest] >= 100_000_000  # under one epoch per run


# ---------- the sweep ----------

def test_sizes_hold_tokens_per_parameter_in_cpu_longs_family():
    from tpcomm.configuration import configure
    from tpcomm.train.train_config import DEFAULTS

    per_param = AXES_STEPS * 12 * 64 / 591_424  # cpu-long: 6.49
    seen = []
    for (n_layer, n_embd, n_head), batch in SCALE_SIZES.items():
        assert 3 * n_embd == 16 * n_layer and n_head == 8  # the 12 x 64 aspect, 8 heads
        cfg = configure(DEFAULTS, [os.path.join(ROOT, "config/gpu_scale.py"), f"--n_layer={n_layer}",
                                   f"--n_embd={n_embd}", f"--block_types=['tp']*{n_layer}"])
        _, non_embedding = results.count_params(cfg, len(lc.VOCAB))
        assert abs(AXES_STEPS * batch * 64 / non_embedding / per_param - 1) < 0.01, (n_layer, n_embd)
        seen.append(non_embedding)
    assert AXES_SIZE in SCALE_SIZES and seen[1] > 2.5e6 and seen[2] > 1.5e7
    names = {r.name for r in SWEEPS["gpu-scale"]}
    assert {p for p in PATTERNS if any(n.startswith(p + "-") for n in names)} >= set(SCALE_PATTERNS)
    assert len(SCALE_SEEDS) >= 3 and {"gpt-36x192"} <= names


def scale(*args):
    return run_script("experiment.py", "gpu-scale", *args)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """A tiny corpus in the compact form only (the sweep unpacks it), then one chunk that fits one run."""
    tmp = tmp_path_factory.mktemp("gpu_scale")
    data = tmp / "data"
    r = run_script(PREPARE, "--input", c_file(tmp / "a.c", 4000, 3), "--out_dir", str(data), "--compact")
    assert r.returncode == 0, r.stderr
    for split in ("train", "val"):
        os.remove(data / f"{split}.bin")
    common = ["--rehearsal", f"--out={tmp / 'sweep'}", f"--data_dir={data}", "--seeds=1337"]
    r = scale(*common, "--budget-minutes=0.4")  # the assumed 15 s start-up (no compile): one run fits
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp, common, r


def test_rehearsal_runs_one_chunk_and_writes_result_files(rehearsal):
    tmp, _, r = rehearsal
    assert "unpacking" in r.stdout and "trained 1 run(s)" in r.stdout, r.stdout
    assert os.path.isfile(tmp / "data" / "train.bin")
    (path,) = sorted((tmp / "sweep" / "runs").glob("*.json"))
    assert path.name == "all-tp-2x16-seed1337.json"
    record = results.read_record(str(path))
    assert record["sweep"] == "gpu-scale" and record["config"]["device"] == "cpu"
    assert "cuda" in record["machine"] and record["timing"]["step_ms"] > 0  # the device named, the step timed
    assert record["config"]["dtype"] == "float32" and record["config"]["compile"] is False


def test_rehearsal_resumes_with_measured_estimates(rehearsal):
    tmp, common, _ = rehearsal
    r = scale(*common, "--dry-run", "--budget-minutes=0.4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("skip  all-tp-2x16-seed1337") for line in lines), r.stdout
    assert any("all-spd-2x16-seed1337" in line and "(measured, size)" in line for line in lines), r.stdout
    assert any("3x24" in line and "(assumed)" in line for line in lines), r.stdout
    assert "GPU-minutes still to run" in r.stdout and "next chunk of 0.4 min" in r.stdout


def test_real_plan_dry_run_states_gpu_minutes():
    r = scale("--dry-run", "--budget-minutes=8")
    assert r.returncode == 0, r.stderr
    planned = [line for line in r.stdout.splitlines() if line.startswith(("run ", "skip "))]
    # + GPT once
    assert len(planned) == len(SCALE_PATTERNS) * len(SCALE_SIZES) * len(SCALE_SEEDS) + 1, r.stdout
    assert "GPU-minutes still to run" in r.stdout and "453" not in r.stdout  # the rate, converted, not pasted
    assert "103,680,000 tokens" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--budget-minutes=soon"], "--budget-minutes takes a number"),
    (["--concurrent=0", "--dry-run"], "--concurrent takes a number >= 1"),
    ([], "give --budget-minutes=N"),
    (["--fast"], "argument '--fast'"),
])
def test_bad_options_are_one_line(args, words):
    assert words in one_line_error(scale(*args))


def test_the_real_plan_wants_a_gpu(monkeypatch):
    import torch
    from tpcomm.experiments import gpu_scale
    from tpcomm.experiments.sweep_records import SweepError

    job = type("Job", (), dict(cfg=dict(device="auto")))()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SweepError, match="no CUDA GPU here"):
        gpu_scale.check_device([job])
    gpu_scale.check_device([type("Job", (), dict(cfg=dict(device="cpu")))()])  # the rehearsal's: allowed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu_scale.check_device([job])


def test_missing_data_and_no_compact_form_is_one_line(tmp_path):
    line = one_line_error(scale("--rehearsal", f"--out={tmp_path}", f"--data_dir={tmp_path / 'none'}",
                                "--budget-minutes=1"))
    assert "no train.bin/val.bin and no linux-char.tar.xz" in line


# ---------- the report's scale axis ----------

class FakeResults:
    def __init__(self, rows):
        self._rows = rows

    def rows(self, name):
        return self._rows


def record(run, size, seed, loss, *, step_ms=10.0, model_type="distributed_gpt"):
    (n_layer, n_embd, n_head), batch = size, SCALE_SIZES[size]
    pattern = run.rsplit("-", 1)[0]
    cfg = dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, tp_size=4, model_type=model_type,
               max_iters=5000, block_types=None if model_type == "gpt" else PATTERNS[pattern](n_layer))
    fwd = {"all-tp": 2, "all-spd": 1, "all-parallel": 0, "all-ladder": 2}.get(pattern, 0) * n_layer
    return dict(config=cfg, seed=seed, val_loss=loss, val_curve=[[5000, 5000 * batch * 64, loss]],
                final_iter=5000, tokens=5000 * batch * 64, tokens_per_iter=batch * 64,
                params=dict(total=1, non_embedding=n_layer * n_embd ** 2 * 12),
                comm=dict(fwd_allreduces=None if model_type == "gpt" else fwd, bwd_allreduces=0),
                timing=dict(step_ms=step_ms, wall_s=60.0), data={})


def rows_of(costs, *, with_gpt=True):
    """costs: {pattern: function(size index) -> cost}; three seeds with their own noise."""
    groups = {}
    for k, size in enumerate(SCALE_SIZES):
        for seed in SCALE_SEEDS:
            base = 1.5 - 0.1 * k + 0.003 * (seed - 1338)
            for p in SCALE_PATTERNS:
                run = f"{p}-{size[0]}x{size[1]}"
                noise = 0.0005 * ((seed * 7 + k) % 3 - 1) if p != "all-tp" else 0.0
                groups.setdefault(run, []).append(record(run, size, seed, base + costs.get(p, lambda i: 0)(k)
                                                         + noise, step_ms=12.0 if p == "all-spd" else 11.0))
            if with_gpt and k == 2 and seed == SCALE_SEEDS[0]:
                groups["gpt-36x192"] = [record("gpt-36x192", size, seed, base, step_ms=10.0,
                                               model_type="gpt")]
    return results.summarize(list(groups.items()))


def test_scale_axis_says_grows_shrinks_or_holds():
    rows = rows_of({"all-spd": lambda k: 0.01 + 0.02 * k, "all-parallel": lambda k: 0.05,
                    "all-ladder": lambda k: 0.03 - 0.01 * k})
    text = scale_report.scale_axis(FakeResults(rows))
    line = {ln.split(" |")[0][2:]: ln for ln in text.splitlines() if ln.startswith("| all-")}
    assert ("grows: +0.040" in line["all-spd"] and "holds" in line["all-parallel"]
            and "shrinks" in line["all-ladder"])
    assert "(3)" in line["all-spd"]  # the paired intervals, 3 seeds each
    assert "all-spd 1.20x" in text and "over 1.4x" not in text and "within 1.4x" in text
    # the reading follows the data: the same check on a flat spd cost fails
    flat = scale_report.scale_axis(FakeResults(rows_of({"all-spd": lambda k: 0.01})))
    assert "grows" not in flat
    data, draw = scale_report.scale_plot(FakeResults(rows))
    # every pattern but the baseline
    assert [len(s["points"]) for s in data] == [3] * (len(SCALE_PATTERNS) - 1)


def test_scale_axis_is_pending_without_result_files():
    text = scale_report.scale_axis(FakeResults([]))
    assert text.startswith("_The scale axis is pending") and "GPU" in text and "--dry-run" in text
    assert scale_report.scale_plot(FakeResults([])) is None


def test_a_baseline_alone_names_no_figure():
    """The first GPU chunk may leave only all `tp` files: the table shows their loss, and the page links no
    figure that scale_plot (no paired cost yet) does not draw (a broken image in the README, 2026-11-27)."""
    rows = [r for r in rows_of({}, with_gpt=False) if r["config"] == r["baseline"]]
    text = scale_report.scale_axis(FakeResults(rows))
    assert text.startswith("_The scale axis has begun: 9 `gpu-scale` "
                           "run(s)") and "all-tp-12x64 1.50" in text, text
    assert scale_report.PLOT not in text
    assert scale_report.scale_plot(FakeResults(rows)) is None
    assert scale_report.PLOT in scale_report.scale_axis(FakeResults(rows_of({})))  # with pairs it is linked


def test_report_registers_the_axis():
    from tpcomm.experiments.report import report

    assert "gpu-scale-axis" in report.blocks() and scale_report.PLOT in report.plot_specs()
    assert [r.name for r in scale_runs()] == [r.name for r in SWEEPS["gpu-scale"]]


@pytest.mark.slow
def test_concurrent_workers_share_one_chunk(tmp_path):
    """--concurrent=2: two copies of the command, each run trained once, by one of them (the job locks share
    them out). How many runs fit depends on how fast the first ones finish (a finished run's time replaces the
    estimate): at least the two the estimates fit."""
    data = tmp_path / "data"
    r = run_script(PREPARE, "--input", c_file(tmp_path / "a.c", 4000, 3), "--out_dir", str(data))
    assert r.returncode == 0, r.stderr
    r = scale("--rehearsal", f"--out={tmp_path / 'sweep'}", f"--data_dir={data}", "--seeds=1337",
              "--budget-minutes=0.6", "--concurrent=2")  # 2 runs of an assumed 15 s fit
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(p.name.removesuffix(".json") for p in (tmp_path / "sweep" / "runs").glob("*.json"))
    assert {"all-spd-2x16-seed1337", "all-tp-2x16-seed1337"} <= set(files), files
    done = sorted(re.findall(r"\] done (\S+):", r.stdout))
    assert done == files, r.stdout  # each run trained once
    trained = [int(k) for k in re.findall(r"trained (\d+) run\(s\)", r.stdout)]
    assert len(trained) == 2 and sum(trained) == len(files), r.stdout  # by the two copies between them
