"""What a hostile user typed, case by case. Each row is one line naming the key (or file) and the
value, exit 2, before any work, nothing overwritten; or, where the input is legitimate, it does what it says
(resume keeps the checkpoint's sync options; sample keeps the trained model's tp_size)."""

import glob
import json
import os
import pathlib
import pickle
import shutil

import pytest

from conftest import ROOT, TINY, losses, one_line_error, run_script

D = ["--model_type=distributed_gpt", "--tp_size=2"]
BENCH = ["bench.py", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=16",
         "--vocab_size=65", "--batch_size=2", "--iters=1", "--warmup=0"]
COMMITTED = sorted(glob.glob(os.path.join(ROOT, "experiments", "cpu", "runs", "*-seed1337.json")))[0]


def train_args(data, out, *extra):
    return ["train.py", *TINY, f"--data_dir={data}", f"--out_dir={out}", *extra]


def snapshot(*paths):
    """{path: bytes} of the files that exist: compared after a refusal, nothing overwritten."""
    return {p: open(p, "rb").read() for p in map(str, paths) if os.path.isfile(p)}


@pytest.fixture
def keep(tmp_path):
    """A file a command must not overwrite (another run's checkpoint, say)."""
    path = tmp_path / "keep.txt"
    path.write_bytes(b"PK\x03\x04 not a trace, not a plot")
    return path


# ---------- one line, exit 2, before any work, nothing overwritten ----------

def cases(tmp, data, keep):
    """(argv, words the line must hold, files that must stay as they are) per case of
    the issue, by its number."""
    out, folder = str(tmp / "out"), tmp / "folder"  # folder: made by the test
    figure = tmp / "answer_tradeoff.png"  # a copy of the README's figure (the report's), made by the test
    return {
        "1 train trace over a checkpoint": (train_args(data, out, *D, f"--trace={keep}", "--trace_iter=1"),
                                            ["trace", str(keep)], [keep]),
        "1 bench trace over a file": ([*BENCH, f"--trace={keep}"], ["trace", str(keep)], [keep]),
        "7 async grad at tp 1": (train_args(data, out, "--model_type=distributed_gpt",
                                            "--tp_async_grad=True"),
                                 ["tp_async_grad=True", "tp_size=1"], []),
        "7 bench async grad at tp 1": ([*BENCH, "--model_type=distributed_gpt", "--tp_async_grad=True"],
                                       ["tp_async_grad=True", "tp_size=1"], []),
        "7 bf16 with a block size": (train_args(data, out, *D, "--tp_comm_dtype=bf16", "--tp_comm_block=16"),
                                     ["tp_comm_block=16", "bf16"], []),
        "9 train trace in /proc": (train_args(data, out, *D, "--trace=/proc/t.json"), ["trace", "/proc"], []),
        "9 train trace a directory": (train_args(data, out, *D, f"--trace={folder}"), ["trace", str(folder)],
                                      []),
        "9 trace plot a directory": (["-m", "tpcomm.bench.trace", "plot", str(folder), COMMITTED],
                                     [str(folder)], []),
        "9 bench plot a directory": ([*BENCH, "--mode=decode", "--new_tokens=2", f"--plot={folder}"],
                                     ["plot", str(folder)], []),
        "11 train batch_size None": (train_args(data, out, *D, "--batch_size=None"), ["batch_size", "None"],
                                     []),
        "11 train tp_size None": (train_args(data, out, *D[:1], "--tp_size=None"), ["tp_size", "None"], []),
        "11 train n_embd None": (train_args(data, out, *D, "--n_embd=None"), ["n_embd", "None"], []),
        "11 sample num_samples None": (["sample.py", f"--out_dir={out}", "--num_samples=None"],
                                       ["num_samples", "None"], []),
        "11 comm_model mfu None": (["comm_model.py", "--mfu=None"], ["mfu", "None"], []),
        "12 bench variant tp_overlap 'x'": ([*BENCH, *D, "--variants=[{'tp_overlap': 'x'}]"],
                                            ["variants", "tp_overlap", "'x'"], []),
        "12 bench variant tp_overlap None": ([*BENCH, *D, "--variants=[{'tp_overlap': None}]"],
                                             ["variants", "tp_overlap", "None"], []),
        **more_cases(tmp, data, keep, out, folder, figure),
    }


def more_cases(tmp, data, keep, out, folder, figure):
    """The second half of cases(): output paths, the runner's options, the third pass's (64.*) rows."""
    return {
        "13 bench trace in /proc": ([*BENCH, "--trace=/proc/t.json"], ["trace", "/proc"], []),
        "13 bench plot not a png": ([*BENCH, "--mode=decode", "--new_tokens=2", f"--plot={keep}"],
                                    ["plot", str(keep)], [keep]),
        "13 trace plot over a file": (["-m", "tpcomm.bench.trace", "plot", str(keep), COMMITTED], [str(keep)],
                                      [keep]),
        "13 gpu_check out_dir /proc": (["-m", "tpcomm.gpu.gpu_check", "--sizes=tiny", "--device=cpu",
                                        "--out_dir=/proc"],
                                       ["out_dir", "/proc"], []),
        "13 calibration out a directory": (["comm_model.py", "measure", f"--out={folder}"],
                                           ["out", str(folder)], []),
        "14 gpu-node out a file": (["experiment.py", "gpu-node", "--rehearsal", f"--out={keep}"],
                                   ["out", str(keep)], [keep]),
        "10 gpu-node dry-run out a file": (["experiment.py", "gpu-node", "--dry-run", f"--out={keep}"],
                                           ["out", str(keep)], [keep]),
        "10 gpu-node shape twice": (["experiment.py", "gpu-node", "--dry-run", "--shapes=tiny,,tiny"],
                                    ["shapes", "tiny,,tiny"], []),
        "10 gpu-node mfu 1e-300": (["experiment.py", "gpu-node", "--dry-run", "--mfu=1e-300"],
                                   ["mfu", "1e-300"], []),
        "10 gpt2 one process real tp": (["experiment.py", "gpt2", "--nproc=1", "--tp_mode=real", "--dry-run"],
                                        ["nproc=1", "tp_mode='real'"], []),
        "14 gpu_check worker by hand": (["-m", "tpcomm.gpu.gpu_check", "--worker=real_tp"],
                                        ["worker", "real_tp"], []),
        "6 runner flag not a bool": (["experiment.py", "cpu", "--dry-run=maybe"], ["dry-run", "maybe"], []),
        "also learning_rate 1e400": (train_args(data, out, "--learning_rate=1e400"), ["learning_rate", "inf"],
                                     []),
        # the third pass (--overwrite is the out_dir's checkpoint only; a figure is replaced only by its own
        # maker)
        "64.2 train trace over a file, overwrite": (train_args(data, out, *D, f"--trace={keep}",
                                                               "--overwrite=True"),
                                                    ["trace", str(keep)], [keep]),
        "64.3 bench plot over the report's figure": ([*BENCH, "--mode=decode", "--new_tokens=2",
                                                      f"--plot={figure}"],
                                                     ["plot", str(figure)], [figure]),
        "64.3 trace plot over the report's figure": (["-m", "tpcomm.bench.trace", "plot", str(figure),
                                                      COMMITTED],
                                                     [str(figure)], [figure]),
        "64.5 train out_dir under /proc": (["train.py", *TINY, f"--data_dir={data}", "--out_dir=/proc/x/y"],
                                           ["/proc/x/y"], []),
        "64.5 train trace_iter -1": (train_args(data, out, "--trace_iter=-1"), ["trace_iter", "-1"], []),
        "64.5 sweep --jobs without a number": (["experiment.py", "cpu", "--jobs", "--dry-run"],
                                               ["--jobs", "nothing"],
                                               []),
        "64.5 gpu-scale dry-run out a file": (["experiment.py", "gpu-scale", "--dry-run", f"--out={keep}"],
                                              ["out", str(keep)], [keep]),
        "64.5 prepare input and source tiny": (["data/shakespeare_char/prepare.py", f"--input={keep}",
                                                "--source=tiny",
                                                f"--out_dir={out}"], ["--input", "--source=tiny"], []),
        "64 learning_rate 1e300": (train_args(data, out, "--learning_rate=1e300"),
                                   ["learning_rate", "1e+300"], []),
        "64 caat fraction at tp 1": (train_args(data, out, "--model_type=distributed_gpt",
                                                "--block_types=caat",
                                                "--caat_sync_fraction=0.25"), ["caat_sync_fraction=0.25",
                                                                               "tp_size=1"],
                                     []),
    }


CASE_NAMES = list(cases(pathlib.Path("/nonexistent"), "data", "keep"))  # no side effects: just the names


@pytest.mark.parametrize("name", CASE_NAMES)
def test_refused_in_one_line_before_any_work(name, tmp_path, char_data, keep):
    (tmp_path / "folder").mkdir()
    shutil.copy(os.path.join(ROOT, "docs", "answer_tradeoff.png"), tmp_path / "answer_tradeoff.png")
    argv, words, kept = cases(tmp_path, char_data, keep)[name]
    before = snapshot(*kept)
    r = run_script(*argv, timeout=120)
    line = one_line_error(r)
    assert all(w in line for w in words), line
    assert snapshot(*kept) == before  # nothing overwritten
    assert not os.path.exists(tmp_path / "out") and not glob.glob(str(tmp_path / "**" / "*.tmp"),
                                                                  recursive=True)



def test_a_config_file_that_exits_is_one_line(tmp_path, char_data):
    config = tmp_path / "bad_config.py"
    config.write_text("import sys\nsys.exit(3)\n")
    line = one_line_error(run_script("train.py", str(config), *TINY, f"--data_dir={char_data}",
                                     f"--out_dir={tmp_path / 'out'}", timeout=120))
    assert str(config) in line and "SystemExit" in line, line


# 2, 3: gpu_check writes into docs/ only from the full check on a GPU

@pytest.mark.parametrize("extra", [[], [f"--out_dir={os.path.join(ROOT, 'docs')}"], ["--out_dir=docs"]])
def test_a_gpu_check_rehearsal_never_writes_docs(extra):
    docs = [os.path.join(ROOT, "docs", n) for n in ("gpu.json", "gpu.md")]
    before = snapshot(*docs)
    try:
        r = run_script("-m", "tpcomm.gpu.gpu_check", "--sizes=tiny", "--device=cpu", "--sections=cost_model",
                       *extra, timeout=120)
        line = one_line_error(r)
        assert "out_dir" in line and "sizes='tiny'" in line, line
        assert snapshot(*docs) == before
    finally:  # on the old code the rehearsal replaced the committed figures: put them back
        for path, data in before.items():
            with open(path, "wb") as f:
                f.write(data)


def test_a_gpu_check_rehearsal_elsewhere_still_runs(tmp_path):
    """Anti-vacuity: the refusal above is of the place, not of the rehearsal."""
    r = run_script("-m", "tpcomm.gpu.gpu_check", "--sizes=tiny", "--device=cpu", "--sections=cost_model",
                   f"--out_dir={tmp_path}", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "gpu.json").read_text())["sizes"] == "tiny"
    keep = tmp_path / "gpu.json"
    keep.write_text("[1, 2]")  # not gpu_check's own output: refused, kept
    line = one_line_error(run_script("-m", "tpcomm.gpu.gpu_check", "--sizes=tiny", "--device=cpu",
                                     "--sections=cost_model", f"--out_dir={tmp_path}", timeout=120))
    assert "gpu.json" in line and keep.read_text() == "[1, 2]", line


# 3 (of the silent list), 8: resume keeps the checkpoint's sync options, refuses a contradicting one

INT8 = [*D, "--tp_comm_dtype=int8", "--tp_comm_block=8", "--eval_interval=2", "--lr_decay_iters=4"]


@pytest.fixture(scope="module")
def int8_runs(tmp_path_factory, char_data):
    """An int8-compressed tp-2 run straight through iters 0..4, the same run stopped at 2 (its checkpoint
    copied aside) and resumed with no sync flag, and a run without compression."""
    root = tmp_path_factory.mktemp("int8")
    for name, args in (("full", [*INT8, "--max_iters=4"]), ("part", [*INT8, "--max_iters=2"]),
                       ("plain", [*INT8[:2], *INT8[4:], "--max_iters=4"])):
        r = run_script(*train_args(char_data, root / name, *args), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    shutil.copytree(root / "part", root / "at2")
    r = run_script(*train_args(char_data, root / "part", *D, "--eval_interval=2", "--lr_decay_iters=4",
                               "--max_iters=4", "--init_from=resume"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def test_resume_continues_with_the_checkpoints_sync_options(int8_runs):
    """The resumed run is the uninterrupted int8 run: same ops in the same order on one CPU process, so equal
    to 1e-6; the run without compression differs by far more, so the comparison can fail."""
    full, part, plain = (losses(int8_runs / n) for n in ("full", "part", "plain"))
    assert json.loads((int8_runs / "part" / "config.json").read_text())["tp_comm_dtype"] == "int8"
    for it in range(2, 5):
        assert part[it] == pytest.approx(full[it], rel=1e-6, abs=1e-6), it
    assert plain[4] != pytest.approx(full[4], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("extra, words", [
    (["--tp_comm_dtype=None", "--max_iters=4"], ["tp_comm_dtype=None", "'int8'"]),
    (["--tp_comm_dtype=fp8", "--max_iters=4"], ["tp_comm_dtype='fp8'", "'int8'"]),
    (["--tp_comm_block=16", "--max_iters=4"], ["tp_comm_block=16", "tp_comm_block=8"]),
    (["--tp_comm_exchange=two_shot", "--max_iters=4"], ["tp_comm_exchange='two_shot'", "'one_shot'"]),
    (["--max_iters=1"], ["max_iters=1", "iteration 2"]),
])
def test_resume_refuses_a_contradicting_sync_option_or_a_passed_max_iters(int8_runs, char_data, extra, words):
    out = int8_runs / "at2"
    before = snapshot(out / "ckpt.pt", out / "config.json", out / "metrics.jsonl")
    line = one_line_error(run_script(*train_args(char_data, out, *D, "--init_from=resume", *extra),
                                     timeout=120))
    assert all(w in line for w in words), line
    assert snapshot(out / "ckpt.pt", out / "config.json", out / "metrics.jsonl") == before


def test_resume_refuses_a_contradicting_caat_fraction(char_data, tmp_path):
    """caat_sync_fraction is the model's function (docs/model.md): resumed with another value it is refused,
    as block_types is (before: the flag silently trained and saved a different model)."""
    out, caat = tmp_path / "caat", ["--model_type=distributed_gpt", "--tp_size=2", "--block_types=caat"]
    r = run_script(*train_args(char_data, out, *caat, "--max_iters=1", "--eval_interval=1"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    before = snapshot(out / "ckpt.pt", out / "config.json", out / "metrics.jsonl")
    line = one_line_error(run_script(*train_args(char_data, out, *caat, "--init_from=resume", "--max_iters=2",
                                                 "--caat_sync_fraction=0.25"), timeout=120))
    assert "caat_sync_fraction=0.25 contradicts the checkpoint's caat_sync_fraction=0.5" in line, line
    assert snapshot(out / "ckpt.pt", out / "config.json", out / "metrics.jsonl") == before


# 4: sample.py samples the model that was trained

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, char_data):
    """A tiny GPT and a tiny all-'spd' tp-4 and all-'tp' tp-4 DistributedGPT, one step each."""
    root = tmp_path_factory.mktemp("ckpts")
    for name, args in (("gpt", []), ("spd4", ["--model_type=distributed_gpt", "--tp_size=4",
                                              "--block_types=spd"]), ("tp4", ["--model_type=distributed_gpt",
                                                                              "--tp_size=4"])):
        r = run_script(*train_args(char_data, root / name, *args, "--max_iters=1", "--eval_interval=1"),
                       timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    return root


def sample(out, *extra):
    return run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1",
                      "--max_new_tokens=8", "--start=def", *extra, timeout=120)


@pytest.mark.parametrize("run, tp, words", [
    ("gpt", 2, ["tp_size=2", "'gpt'"]), ("gpt", 1, ["tp_size=1", "'gpt'"]),
    ("spd4", 1, ["tp_size=1", "tp_size=4", "spd"]), ("spd4", 2, ["tp_size=2", "tp_size=4", "spd"]),
])
def test_sample_refuses_a_tp_size_that_changes_the_model(checkpoints, run, tp, words):
    line = one_line_error(sample(checkpoints / run, f"--tp_size={tp}"))
    assert all(w in line for w in words), line


def test_sample_takes_a_tp_size_that_keeps_the_model(checkpoints):
    """Anti-vacuity: the checkpoint's own tp_size, and any tp_size of an all-'tp' model (GPT's function at
    every tp_size, docs/model.md), sample; the same seed gives the same text (float32 logits agree to ~1e-6,
    far inside the gaps between sampled tokens' probabilities at 8 tokens)."""
    texts = []
    for run, extra in (("spd4", ["--tp_size=4"]), ("spd4", []), ("tp4", ["--tp_size=2"]), ("tp4", [])):
        r = sample(checkpoints / run, *extra)
        assert r.returncode == 0, r.stdout + r.stderr
        texts.append(r.stdout.split("---------------")[0].splitlines()[-1])
    assert texts[0] == texts[1] and texts[2] == texts[3]


# 64.3: a crafted checkpoint is refused in one line before anything is written; metrics.jsonl keeps its lines

def crafted(checkpoint, change):
    """The checkpoint dict with one field changed as the third hostile pass did (None: the field removed)."""
    import torch

    field, value = change
    if field == "exp_avg":  # one moment of the wrong shape
        state = next(iter(checkpoint["optimizer"]["state"].values()))
        state["exp_avg"] = torch.zeros(3)
    elif field == "weights":
        checkpoint["model"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                               for k, v in checkpoint["model"].items()}
    elif value is None:
        del checkpoint[field]
    else:
        checkpoint[field] = value
    return checkpoint


CRAFTED = [  # (field, value), the command, words its line must hold
    (("iter_num", "abc"), "resume", ["iter_num", "'abc'"]), (("iter_num", None), "resume", ["iter_num"]),
    (("iter_num", -5), "resume", ["iter_num=-5"]), (("best_val_loss", "x"), "resume",
                                                    ["best_val_loss", "'x'"]),
    (("rng_state", "3 bytes"), "resume", ["rng_state"]), (("optimizer", {}), "resume", ["optimizer"]),
    (("exp_avg", None), "resume", ["exp_avg", "(3,)"]), (("config", [1, 2]), "sample", ["config", "[1, 2]"]),
    (("weights", None), "sample", ["NaN"]),
]


@pytest.mark.parametrize("change, command, words", CRAFTED, ids=[f"{c[0]}={c[1]!r}" for c, _, _ in CRAFTED])
def test_a_crafted_checkpoint_is_one_line_and_damages_nothing(change, command, words, checkpoints, char_data,
                                                              tmp_path):
    import torch

    out = tmp_path / "run"
    shutil.copytree(checkpoints / "gpt", out)
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    if change == ("rng_state", "3 bytes"):
        change = ("rng_state", torch.zeros(3, dtype=torch.uint8))
    torch.save(crafted(checkpoint, change), out / "ckpt.pt")
    before = snapshot(out / "ckpt.pt", out / "metrics.jsonl", out / "config.json")
    r = run_script(*train_args(char_data, out, "--init_from=resume",
                               "--max_iters=3")) if command == "resume" \
        else sample(out)
    line = one_line_error(r)
    assert all(w in line for w in words), line
    assert snapshot(out / "ckpt.pt", out / "metrics.jsonl", out / "config.json") == before


def test_a_resume_refuses_a_smaller_block_size_and_another_vocabulary(checkpoints, char_data, tmp_path):
    """A resume keeps the model: a smaller block_size (which would cut the position embedding under the
    optimizer's state) and a dataset of the same size with other characters are refused, the run as it was;
    the checkpoint's own data resumes (the test can fail)."""
    out = tmp_path / "run"
    shutil.copytree(checkpoints / "gpt", out)
    before = snapshot(out / "ckpt.pt", out / "metrics.jsonl")
    line = one_line_error(run_script(*train_args(char_data, out, "--init_from=resume", "--max_iters=3",
                                                 "--block_size=16")))
    assert "block_size=16" in line and "32" in line, line
    other = tmp_path / "other"
    shutil.copytree(char_data, other)
    with open(other / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    chars = [meta["itos"][i] for i in range(meta["vocab_size"])]
    chars = chars[1:] + chars[:1]  # the same size, each id another character
    with open(other / "meta.pkl", "wb") as f:
        pickle.dump(dict(meta, itos=dict(enumerate(chars)), stoi={c: i for i, c in enumerate(chars)}), f)
    line = one_line_error(run_script(*train_args(other, out, "--init_from=resume", "--max_iters=3")))
    assert "vocabulary" in line and str(other) in line, line
    assert snapshot(out / "ckpt.pt", out / "metrics.jsonl") == before
    r = run_script(*train_args(char_data, out, "--init_from=resume", "--max_iters=3"))
    assert r.returncode == 0, r.stdout + r.stderr


# 5 (and point 4): one validator of result files

def committed_record():
    with open(COMMITTED) as f:
        return json.load(f)


@pytest.mark.parametrize("change, words", [
    (dict(run="bogus"), ["'run'", "'bogus'"]),
    (dict(sweep="gpt2"), ["'sweep'", "'gpt2'", "'cpu'"]),
    (dict(seed=4242), ["'seed'", "4242", "1337"]),
    (dict(val_loss=1e308), ["val_loss", "1e+308"]),
    (dict(val_curve=[[0, 0, -1.0]]), ["val_curve[0] loss", "-1.0"]),
    (dict(timing=dict(step_ms=-5.0)), ["step_ms", "-5.0"]),
    # the fourth pass: fields the newer readers read (a traceback or a bare digest mismatch before)
    (dict(machine=[1]), ["'machine'", "[1]"]),
    (dict(machine=dict(cpu_capability=5)), ["cpu_capability", "5"]),
    (dict(data=dict(sha256=5)), ["sha256", "5"]),
    (dict(tokens_per_iter=0), ["tokens_per_iter", "0"]),
    (dict(git=dict(commit=5, dirty=False)), ["'git'", "5"]),
    (dict(config=dict(seed=1337, caat_sync_fraction="half")), ["caat_sync_fraction", "'half'"]),
])
def test_a_result_file_that_disagrees_with_its_name_or_is_out_of_range_is_refused(tmp_path, change, words):
    from tpcomm.experiments import results
    from tpcomm.experiments.result_check import ResultsError

    path = tmp_path / os.path.basename(COMMITTED)
    path.write_text(json.dumps(dict(committed_record(), **change)))
    with pytest.raises(ResultsError) as e:
        results.read_record(str(path), sweep="cpu")
    assert str(path) in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    results.read_record(COMMITTED, sweep="cpu")  # anti-vacuity: the committed file itself is accepted


def test_report_names_files_in_runs_that_are_no_runs_result(tmp_path):
    """Garbage under an unknown name, a folder, a seed no run has: each named in one line, not passed over."""
    from tpcomm.experiments.report import report

    runs = tmp_path / "experiments" / "cpu" / "runs"
    runs.mkdir(parents=True)
    shutil.copy(COMMITTED, runs)
    (runs / "junk.json").write_bytes(b"\x00\xff garbage")
    (runs / "a-folder").mkdir()
    lines = report.stray_lines(report.Results(root=str(tmp_path), say=lambda *a: None))
    assert [line.split(":")[0] for line in lines] == [os.path.join("experiments", "cpu", "runs", n)
                                                     for n in ("a-folder", "junk.json")], lines
    assert all("left out" in line for line in lines)


def test_report_check_names_a_stray_file(tmp_path, monkeypatch):
    from tpcomm.experiments.report import report

    monkeypatch.setattr(report, "stray_lines", lambda ctx: ["experiments/cpu/runs/junk.json: not a result "
                                                            "file"])
    monkeypatch.setattr(report, "markdown_files", lambda root: [])
    monkeypatch.setattr(report, "update_plots", lambda *a, **k: [])
    assert report.main(check=True, root=str(tmp_path), say=lambda *a: None) == 1


def test_report_check_names_a_stale_result_file(tmp_path, capsys):
    """A result file whose config is no longer its sweep's run (a planted gpu-scale file, say) is left out of
    the tables; report --check says so by name, not only that a README block differs."""
    from tpcomm.experiments.report import report

    root = tmp_path / "repo"
    runs = root / "experiments" / "gpu-scale" / "runs"
    runs.mkdir(parents=True)
    committed = os.path.join(ROOT, "experiments", "gpu-scale", "runs", "all-tp-12x64-seed1337.json")
    record = json.load(open(committed))
    record["config"]["n_layer"] = 7
    (runs / "all-tp-12x64-seed1337.json").write_text(json.dumps(record))
    shutil.copy(os.path.join(ROOT, "README.md"), root / "README.md")
    assert report.main(("gpu-scale",), check=True, root=str(root), say=lambda *a: None) == 1
    out = capsys.readouterr().out
    assert "left out all-tp-12x64-seed1337" in out and "is stale (n_layer=7" in out, out


# 5 (runner flags), 10, 14: the runners

@pytest.mark.parametrize("argv, key, value", [
    (["cpu", "--dry-run=False"], "dry-run", False), (["cpu", "--dry-run=True"], "dry-run", True),
    (["cpu", "--dry-run"], "dry-run", True), (["cpu", "--report-only=False"], "report-only", False),
    (["cpu", "--counts=False"], "counts", False),
])
def test_sweep_flags_parse_true_and_false(argv, key, value):
    from tpcomm.experiments import sweep_args as sweep

    _, opts, overrides = sweep.parse_args(argv)
    assert opts[key] is value and overrides == []


@pytest.mark.parametrize("arg, on", [("--report-only=False", False), ("--report-only=True", True),
                                     ("--report-only", True), ("--dry-run=False", False)])
def test_gpu_node_flags_parse_true_and_false(arg, on):
    from tpcomm.experiments import gpu_node

    _, flags = gpu_node.parse(["--rehearsal", arg])
    assert (arg[2:].split("=")[0] in flags) is on


def test_report_check_flag_parses_false():
    from tpcomm.experiments import sweep_args as sweep

    assert sweep.parse_args(["report", "--check=False"])[1]["check"] is False


@pytest.mark.parametrize("content, words", [
    ('{"config": {"shape": "ti', ["tiny.json", "JSON"]),
    ("", ["tiny.json", "JSON"]),
    ('{"config": {}}', ["tiny.json", "shape", "'tiny'"]),
    ("[1, 2]", ["tiny.json", "object"]),
    ("NAN", ["tiny.json", "ms_per_iter", "nan"]),
    ("INF", ["tiny.json", "in_collectives_ms", "inf"]),
])
def test_gpu_node_report_only_refuses_a_bad_result_file(tmp_path, content, words):
    (tmp_path / "runs").mkdir()
    way = dict(ms_per_iter=1.0, tokens_per_s=10.0, in_collectives_ms=0.5, exposed_ms=0.1, fwd_allreduces=8)
    if content == "NAN":
        way["ms_per_iter"] = float("nan")
    if content == "INF":
        way["in_collectives_ms"] = float("inf")
    if content in ("NAN", "INF"):
        content = json.dumps(dict(config=dict(shape="tiny"), machine={}, ways={"all tp": way},
                                  allreduce_sanity={}))
    (tmp_path / "runs" / "tiny.json").write_text(content)
    r = run_script("experiment.py", "gpu-node", "--rehearsal", "--report-only", f"--out={tmp_path}",
                   timeout=120)
    line = one_line_error(r)
    assert all(w in line for w in words), line
    assert not (tmp_path / "results.md").exists()


def test_a_command_replaces_its_own_output(tmp_path, char_data):
    """The other side of the mark: a trace train.py wrote, and a figure bench.py drew, are theirs to write
    again (each file names its maker); the same figure is another command's to refuse (the cases above)."""
    from tpcomm.train.output_path import png_text, written_by
    trace, plot = tmp_path / "t.json", tmp_path / "decode.png"
    for n in (1, 2):
        r = run_script(*train_args(char_data, tmp_path / f"out{n}", *D, f"--trace={trace}", "--trace_iter=1",
                                   "--max_iters=2", "--eval_interval=2"), timeout=120)
        assert r.returncode == 0, r.stderr
        r = run_script(*BENCH, "--mode=decode", "--new_tokens=2", f"--plot={plot}", timeout=120)
        assert r.returncode == 0, r.stderr
    assert written_by("trace")(str(trace)) and png_text(str(plot), "Software") == "nanoGPT-TP figure decode"
    assert not written_by("figure steps")(str(plot))  # bench's other figure is another kind
