"""experiment.py runs a sweep (skipping finished runs, redoing interrupted ones, refusing unequal token
budgets); results.py turns metrics files into tables and plots whose numbers are the measured ones."""

import csv
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

import pytest

from tpcomm.experiments import sweep as experiment
from tpcomm.experiments.sweep_records import SweepError
from tpcomm.experiments import pairing, plots, results, sweep_plan, sweep_records
from tpcomm.experiments.result_check import ResultsError
from tpcomm.model import options
from tpcomm.figures import png
from tpcomm.configuration import _literal
from conftest import ROOT, TINY, fork_server_for_children, run_script
from tpcomm.experiments.sweep_plan import SCALE_CONFIG

TINY_SWEEP = [a for a in TINY if not a.startswith(("--n_layer", "--log_interval",
                                                   "--gradient_accumulation_steps"))]
TINY_SWEEP += ["--max_iters=6", "--lr_decay_iters=6", "--eval_interval=3", "--log_interval=1"]


@pytest.fixture(autouse=True)
def forked_train_runs(monkeypatch):
    """The sweeps' train.py runs, forked as run_script's are (a fresh interpreter
    took ~5 s of a 1 s tiny run)."""
    fork_server_for_children(monkeypatch, experiment)


def tiny_runs(tmp_path):
    """Two tiny DistributedGPT configs (4 and 1 forward all-reduces) written as config files."""
    runs = []
    for name, types in (("tp", "['tp'] * 2"), ("par", "['parallel'] * 2")):
        path = tmp_path / f"tiny_{name}.py"
        path.write_text(f"model_type = 'distributed_gpt'\ntp_size = 2\nn_layer = 2\nblock_types = {types}\n"
                        f"always_save_checkpoint = False\ngradient_accumulation_steps = 2\n")
        runs.append(sweep_plan.Run(name, str(path)))
    return runs


def metrics_mtime(job):
    return os.stat(os.path.join(job.out_dir, "metrics.jsonl")).st_mtime_ns


def test_sweep_runs_skips_finished_and_redoes_interrupted(tmp_path, char_data, capsys):
    sweep_dir = str(tmp_path / "sweep")
    jobs = experiment.plan(tiny_runs(tmp_path), sweep_dir=sweep_dir, seeds=[7],
                           overrides=[*TINY_SWEEP, f"--data_dir={char_data}"])
    assert [j.label for j in jobs] == ["tp-seed7", "par-seed7"]
    assert [j.result_path for j in jobs] == [os.path.join(sweep_dir, "runs", f"{n}-seed7.json")
                                             for n in ("tp", "par")]
    experiment.run_sweep(jobs)
    assert all(experiment.is_finished(j) for j in jobs)
    first = [metrics_mtime(j) for j in jobs]

    # second invocation: nothing is rerun
    capsys.readouterr()
    experiment.run_sweep(jobs)
    assert capsys.readouterr().out.count("skip ") == 2
    assert [metrics_mtime(j) for j in jobs] == first

    # a finished run directory whose result file is gone is recorded again, not rerun
    os.remove(jobs[0].result_path)
    experiment.run_sweep(jobs)
    assert f"record {jobs[0].label}: finished earlier" in capsys.readouterr().out
    assert experiment.is_finished(jobs[0]) and metrics_mtime(jobs[0]) == first[0]

    # an interrupted run (no result file, no done.json, leftovers) is started again from scratch
    os.remove(jobs[1].result_path)
    os.remove(os.path.join(jobs[1].out_dir, "done.json"))
    open(os.path.join(jobs[1].out_dir, "leftover"), "w").close()
    experiment.run_sweep(jobs)
    assert metrics_mtime(jobs[0]) == first[0] and metrics_mtime(jobs[1]) != first[1]
    assert not os.path.exists(os.path.join(jobs[1].out_dir, "leftover"))
    evals, train = results.read_metrics(jobs[1].out_dir)
    with open(os.path.join(jobs[1].out_dir, "metrics.jsonl")) as f:
        assert len(f.readlines()) == len(evals) + len(train)  # no records left from the first attempt

    # a changed config makes a result stale: the run is planned again, not silently reused
    stale = experiment.plan(tiny_runs(tmp_path), sweep_dir=sweep_dir, seeds=[7],
                            overrides=[*TINY_SWEEP, f"--data_dir={char_data}", "--learning_rate=1e-3"])
    assert not any(experiment.is_finished(j) for j in stale)
    assert "stale: its config has learning_rate=" in experiment.result_problem(stale[0])

    # the report reads the measured counts and the last eval record from the result files
    table, plots = experiment.report(jobs, sweep_dir, title="tiny")
    rows = {r["config"]: r for r in json.load(open(os.path.join(sweep_dir, "results.json")))}
    assert rows["tp"]["fwd_allreduces"] == 4 and rows["par"]["fwd_allreduces"] == 1
    assert rows["tp"]["val_loss_mean"] == results.read_metrics(jobs[0].out_dir)[0][-1]["val_loss"]
    assert rows["tp"]["final_iter"] == 6 and rows["par"]["gap_to_baseline"] == pytest.approx(
        rows["par"]["val_loss_mean"] - rows["tp"]["val_loss_mean"])
    assert all(os.path.getsize(p) > 10_000 for p in plots)

    # ... and from them alone: without the run directories the report is the same
    before = open(os.path.join(sweep_dir, "results.md")).read()
    for j in jobs:
        shutil.rmtree(j.out_dir)
    assert experiment.report(jobs, sweep_dir, title="tiny")[0] == table
    assert open(os.path.join(sweep_dir, "results.md")).read() == before
    capsys.readouterr()
    experiment.run_sweep(jobs)  # and a sweep resumes from the result files alone: nothing to run
    assert capsys.readouterr().out.count("skip ") == 2 and not os.path.exists(jobs[0].out_dir)


def test_result_file_holds_what_the_tables_need(tmp_path, char_data):
    """One run's result file: config, git state, parameter counts, tokens and epochs, the val curve, measured
    comm counts, robust timing, the machine; a few KB."""
    job, = experiment.plan(tiny_runs(tmp_path)[:1], sweep_dir=str(tmp_path / "sweep"), seeds=[7],
                           overrides=[*TINY_SWEEP, f"--data_dir={char_data}"], sweep="tiny")
    experiment.run_sweep([job])
    assert os.path.getsize(job.result_path) < 8000
    rec = results.read_record(job.result_path)
    assert (rec["sweep"], rec["run"], rec["seed"], rec["config"]) == ("tiny", "tp", 7, job.cfg)
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if git.returncode == 0:
        assert rec["git"]["commit"] == git.stdout.strip() and isinstance(rec["git"]["dirty"], bool)
    from tpcomm.train.build import build_model
    model = build_model("distributed_gpt", dict(job.cfg, vocab_size=rec["data"]["vocab_size"]))
    total = sum(p.numel() for p in model.parameters())
    emb = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    assert rec["params"] == dict(total=total, non_embedding=total - emb)
    per_iter = 4 * 32 * 2  # batch_size x block_size (TINY) x gradient_accumulation_steps (tiny_runs)
    train_tokens = os.path.getsize(os.path.join(char_data, "train.bin")) // 2
    assert (rec["tokens_per_iter"], rec["tokens"]) == (per_iter, per_iter * 6)
    assert rec["data"]["train_tokens"] == train_tokens and rec["data"]["epochs"] == pytest.approx(
        per_iter * 6 / train_tokens)
    evals, train = results.read_metrics(job.out_dir)
    assert rec["val_curve"] == [[r["iter"], r["iter"] * per_iter, r["val_loss"]] for r in evals]
    assert (rec["val_loss"], rec["final_iter"]) == (evals[-1]["val_loss"], 6)
    assert rec["comm"]["fwd_allreduces"] == rec["comm"]["bwd_allreduces"] == 4
    steady = sorted(r["dt_ms"] for r in train[results.SKIP_TRAIN_RECORDS:])
    assert rec["timing"]["step_ms"] == statistics.median(steady)
    assert rec["timing"]["tokens_per_s"] == pytest.approx(1000 * per_iter / statistics.median(steady))
    assert rec["machine"]["cpu_count"] == os.cpu_count() and rec["machine"]["torch"]


def test_step_timing_is_robust_and_flags_scatter():
    """Median of the steady-state steps (each process's first records left out), tokens/s from it; p90/median
    above 1.5 flags a run the host disturbed. Hand-computed: steady times 10, 10, 10, 10, 40 (ms); median 10;
    p90 (inclusive) = 10 + 0.6 * 30 = 28; ratio 2.8."""
    train = [dict(iter=i, dt_ms=ms, _seg_pos=i) for i, ms in enumerate([500, 300, 10, 10, 10, 10, 40])]
    t = results.step_timing(train, 100)
    assert (t["step_ms"], t["tokens_per_s"], t["steady_steps"]) == (10, 10_000, 5)
    assert t["p90_over_median"] == pytest.approx(2.8) and t["scattered"]
    calm = results.step_timing([dict(r, dt_ms=min(r["dt_ms"], 11)) for r in train], 100)
    assert calm["p90_over_median"] < results.SCATTER_LIMIT and not calm["scattered"]  # anti-vacuity


def test_sweep_output_in_a_log_has_no_escape_codes(tmp_path, monkeypatch, capfd):
    """Not a terminal (a log file): plain numbered lines, no progress bar escape codes."""
    jobs = [finished_job(tmp_path, seed=s) for s in (7, 8)]
    for j in jobs:
        os.remove(os.path.join(j.out_dir, "done.json"))
    monkeypatch.setattr(experiment, "run_job", fake_run_job)
    experiment.run_sweep(jobs)
    out, err = capfd.readouterr()
    assert "[1/2] done tp-seed7: " in out and "[2/2] done tp-seed8: " in out
    assert "\x1b[" not in out + err and "\r" not in out + err


def test_unequal_token_budgets_are_refused(tmp_path, char_data):
    runs = tiny_runs(tmp_path)
    runs[1] = sweep_plan.Run("par", runs[1].config, ("--gradient_accumulation_steps=4",))  # the configs': 2
    with pytest.raises(SweepError, match=r"same tokens.*tp=.*par="):
        experiment.plan(runs, sweep_dir=str(tmp_path / "s"), seeds=[1],
                        overrides=[*TINY_SWEEP, f"--data_dir={char_data}"])
    assert not os.path.exists(tmp_path / "s")  # refused before any work


def test_defined_sweeps_share_one_budget_and_name_their_configs():
    for name, runs in sweep_plan.SWEEPS.items():
        jobs = experiment.plan(runs, sweep_dir=f"experiments/{name}", seeds=[1337], check_data=False)
        by_size = {}
        for j in jobs:
            by_size.setdefault(experiment.model_size(j.cfg), set()).add(experiment.tokens_of(j.cfg))
        assert all(len(t) == 1 for t in by_size.values()), name
        for j in jobs:
            # <n>comm runs its <n>comm config, <n>comm-<change> that config with one change
            # the axes and gpu-scale: one config each
            assert j.run.config.endswith(f"_{j.run.name.split('-')[0]}.py") or \
                j.run.config in (sweep_plan.AXES_CONFIG, SCALE_CONFIG)
    assert [r.name for r in sweep_plan.SWEEPS["cpu"]] == [f"{n}comm"
                                                          for n in (24, 18, 16, 12, 8, 6, 4, 3, 2,
                                                                    1)] + ["24comm-ladder",
                                                                           "24comm-ladder-upper",
                                                                           "24comm-bf16", "24comm-fp8",
                                                                           "24comm-int8", "12comm-int8"]
    assert [r.name for r in sweep_plan.SWEEPS["gpt2"]] == [f"{n}comm" for n in (24, 18, 16, 12, 8, 6)] + [
        "24comm-ladder", "24comm-ladder-upper", "24comm-bf16", "24comm-fp8", "24comm-int8", "12comm-int8",
        "24comm-int8-2shot"]  # cpu-long's delay and shrink variants


def axes_jobs(name, seeds=None):
    runs = sweep_plan.SWEEPS[name]
    return experiment.plan(runs, sweep_dir=f"experiments/{name}", seeds=seeds or sweep_plan.SWEEP_SEEDS[name],
                           sweep=name, homes=experiment.homes_of(runs, ()), check_data=False)


def test_axes_sweeps_as_docs_axes_md_states():
    """cpu-long is the axes model (12 x 64, 8 heads, tp 4, 5000 steps, checkpointing); tp-axis and size-axis
    share its runs (same files, same configs) rather than duplicating them; seed-major, 3 seeds, and for the
    resolved patterns 10 (all tp and all spd 11: the power calculation in docs/axes.md)."""
    long = axes_jobs("cpu-long")
    cfg = long[0].cfg
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["tp_size"], cfg["block_size"],
            cfg["batch_size"]) == \
        (12, 64, 8, 4, 64, 12)
    assert (cfg["max_iters"], cfg["lr_decay_iters"], cfg["eval_interval"], cfg["eval_iters"]) == (5000, 5000,
                                                                                                  250, 50)
    assert all(j.cfg["always_save_checkpoint"] and j.cfg["dataset"] == "shakespeare_char" for j in long)
    # the 10 resolved patterns, seeds 4 to 10
    resolved = [s for seed in range(1340, 1347) for s in [seed] * 10]
    # seed-major
    assert [j.seed for j in long] == [1337] * 17 + [1338] * 17 + [1339] * 17 + resolved + [1347] * 2
    assert [j.run.name for j in long[-12:]] == ["all-tp", "all-spd", "parallel-spd", "all-parallel",
                                                "all-ladder", "all-tp-int8", "all-spd-int8",
                                                "all-tp-int8-2shot", "all-caat", "parallel3-spd", "all-tp",
                                                "all-spd"]
    assert [results.block_pattern(j.cfg) for j in long[:6]] == ["['tp']*12", "['spd']*12",
                                                                "['parallel','spd']*6", "['parallel']*12",
                                                                "['ladder']*12", "['tp']*6+['ladder']*6"]
    by_path = {j.result_path: j.cfg for j in long}
    counts = {}
    for name in ("tp-axis", "size-axis", "convergence"):
        jobs = axes_jobs(name)
        counts[name] = (len(jobs), sum(j.result_path in by_path for j in jobs))
        for j in jobs:  # a shared run: cpu-long's file and exactly cpu-long's config
            assert j.result_path not in by_path or by_path[j.result_path] == j.cfg
            assert (j.sweep == "cpu-long") == (j.result_path in by_path)
    # shrunk syncs
    assert [j.cfg["tp_comm_dtype"] for j in long[6:11]] == ["bf16", "fp8", "int8", "int8", "int8"]
    assert [j.cfg["tp_comm_exchange"] for j in long[8:11]] == ["one_shot", "one_shot", "two_shot"]
    assert counts == {"tp-axis": (3 * 16 + 2, 18), "size-axis": (27, 9), "convergence": (15, 0)}
    tp_axis = axes_jobs("tp-axis")
    assert sorted({j.cfg["tp_size"] for j in tp_axis}) == [2, 4, 8]
    assert sorted((j.cfg["tp_size"], j.seed) for j in tp_axis if j.run.name.startswith("all-tp")) == [
        (2, 1337), (4, 1337), (4, 1338), (4, 1339), (8, 1337)]
    conv = axes_jobs("convergence")
    assert {j.cfg["max_iters"] for j in conv} == {sweep_plan.CONVERGENCE_STEPS}


def test_size_axis_follows_its_tokens_per_parameter_rule():
    """docs/axes.md: steps = 3,840,000 / N(12 x 64) x N(size) / 768, to a multiple of 20 (N: non-embedding
    parameters, counted from the models); the sizes span >= 16x; the schedule scales with the steps."""
    jobs = axes_jobs("size-axis", seeds=[1337])
    n = {experiment.model_size(j.cfg): results.count_params(j.cfg, 65)[1] for j in jobs}
    per_param = 3_840_000 / n[sweep_plan.AXES_SIZE]
    assert max(n.values()) / min(n.values()) >= 16
    for j in jobs:
        steps = j.cfg["max_iters"]
        assert steps == 20 * round(per_param * n[experiment.model_size(j.cfg)] / 768 / 20), j.run.name
        assert (j.cfg["lr_decay_iters"], j.cfg["eval_interval"], j.cfg["warmup_iters"]) == (
            steps, steps // 20, steps // 100)
    # the axes model: 12 x (12 x 64^2) + 2 x 12 x 64 + 64 layer norms
    assert n[sweep_plan.AXES_SIZE] == 591_424


def test_cli_dry_run_and_bad_input():
    r = run_script("experiment.py", "gpt2", "--dry-run", "--seeds=1,2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("run   python train.py config/train_gpt2_") == 26  # 13 configs x 2 seeds
    assert "GPU-hours" in r.stdout
    r = run_script("experiment.py", "cpu", "--dry-run", "--max_iters=20", "--lr_decay_iters=20")
    assert r.returncode == 0 and "experiments/cpu+max_iters=20+lr_decay_iters=20/24comm-seed1337" in r.stdout
    for args, words in ((["nosuch"], "sweep must be one of"), (["cpu", "--no_such_key=1"], "no_such_key"),
                        (["cpu", "--seed=3"], "--seeds")):
        r = run_script("experiment.py", *args)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("types", [["tp"] * 12, ["parallel", "spd", "spd"] * 4,
                                   (["parallel"] * 5 + ["spd"]) * 2, ["tp", "spd"] * 6,
                                   ["spd", "tp", "tp", "parallel"], ["parallel"] * 3 + ["tp"]])
def test_block_pattern_is_compact_and_evaluates_back(types):
    expr = options.compact_list(types)
    assert _literal(expr) == types and len(expr) <= 40, expr


def fake_run(root, name, *, seed, fwd, val_losses, tok_s, wall_s):
    """A run directory as train.py + the runner leave it, with made-up numbers (16 tokens per step)."""
    d = root / f"{name}-seed{seed}"
    d.mkdir()
    cfg = dict(seed=seed, model_type="distributed_gpt", n_layer=4, tp_size=2, tp_mode="simulated",
               block_types=["parallel", "spd"] * 2, batch_size=2, block_size=8, gradient_accumulation_steps=1,
               max_iters=40)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "done.json").write_text(json.dumps(dict(config=cfg, config_file=f"cfg_{name}.py", wall_s=wall_s)))
    with open(d / "metrics.jsonl", "w") as f:
        for k, loss in enumerate(val_losses):
            f.write(json.dumps(dict(iter=20 * k, train_loss=loss + 0.1, val_loss=loss, lr=1e-3)) + "\n")
            for i in range(20 * k, min(20 * k + 20, 41), 10):
                f.write(json.dumps(dict(iter=i, loss=loss, lr=1e-3, dt_ms=16_000 / tok_s[i // 10],
                                        tokens_per_s=tok_s[i // 10], mfu=None, fwd_allreduces=fwd,
                                        bwd_allreduces=fwd, grad_sync_allreduces=4,
                                        comm_bytes_per_token=64.0 * fwd, comm_seconds=0.0)) + "\n")
    return str(d)


def record(run_dir, name="x"):
    """The result record of a fake run directory (no model to count parameters of)."""
    return results.run_record(run_dir, sweep="synthetic", run=name, params=False)


def test_writers_use_the_measured_numbers(tmp_path):
    # the labels claim other counts than measured: the table must show the measured ones
    base = [fake_run(tmp_path, "99comm", seed=s, fwd=8, val_losses=[4.0, 2.5, v], tok_s=[1, 2, 100, 300, 200],
                     wall_s=10.0 + s) for s, v in ((1, 2.0), (2, 2.2))]
    low = [fake_run(tmp_path, "98comm", seed=1, fwd=3, val_losses=[4.0, 2.6, 2.35],
                    tok_s=[1, 5, 400, 500, 600], wall_s=9.0)]
    rows = results.summarize([("99comm", [record(d) for d in base]), ("98comm", [record(d) for d in low])])
    md, csv_path, json_path = results.write_tables(rows, str(tmp_path))
    pngs = plots.write_plots(rows, str(tmp_path), title="synthetic")

    b, lo = rows
    assert (b["fwd_allreduces"], lo["fwd_allreduces"]) == (8, 3) and b["baseline"] == "99comm"
    assert (b["val_loss_mean"] == pytest.approx(2.1)
            and b["val_loss_std"] == pytest.approx(statistics.stdev([2, 2.2])))
    assert lo["gap_to_baseline"] == pytest.approx(0.35)  # over seed 1, the one both ran: 2.35 - 2.0
    # median step of records after the first two
    assert b["tokens_per_s"] == 200 and lo["tokens_per_s"] == 500
    # steady step times 160, 53.3, 80 ms: median 80, p90 (inclusive) 80 + 0.8 * (160 - 80) = 144, ratio 1.8
    assert b["step_ms"] == 80 and b["p90_over_median"] == pytest.approx(1.8) and b["scattered"]
    assert b["wall_s"] == pytest.approx(11.5) and b["tokens"] == 2 * 8 * 40
    text = open(md).read()
    for cell in ("| cfg_99comm.py | `['parallel','spd']*2` | 8 | 8 | 2.1000 ± 0.1414 | 2.0000–2.2000 | 2 | "
                 "+0.0000 | 80.0 | 200 | 1.80 scattered | 11.5 |", "| cfg_98comm.py | "
                 "`['parallel','spd']*2` | 3 | 3 | 2.3500 | — | 1 | +0.3500 | 32.0 | 500 | 1.20 | 9.0 |"):
        assert cell in text, text
    with open(csv_path) as f:
        got = list(csv.DictReader(f))
    assert [(g["config"], int(g["fwd_allreduces"]), float(g["val_loss_mean"])) for g in got] == [
        ("99comm", 8, pytest.approx(2.1)), ("98comm", 3, 2.35)]
    assert json.load(open(json_path))[1]["val_loss_per_seed"] == [2.35]
    for p in pngs:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert png.png_digest(p) is not None


def test_the_interval_uses_students_t_at_every_seed_count():
    """mean_ci's half-width is t(n-1) * sd / sqrt(n): Student's t from the table to 30 degrees of
    freedom, then a series within 2e-4 of the exact quantile; never the normal's 1.96 at 12 seeds
    (t(11) = 2.201, 12% wider)."""
    exact = {1: 12.706, 4: 2.776, 10: 2.228, 11: 2.201, 20: 2.086, 30: 2.042, 31: 2.0395, 40: 2.0211,
             60: 2.0003, 120: 1.9799}
    for df, t in exact.items():
        assert pairing.t_975(df) == pytest.approx(t, abs=2e-4), df
    xs = [0.01 * i for i in range(12)]
    mean, half = pairing.mean_ci(xs)
    assert mean == pytest.approx(0.055) and half == pytest.approx(2.201 * statistics.stdev(xs) / 12 ** 0.5,
                                                                  rel=1e-4)
    assert pairing.mean_ci([0.3]) == (0.3, None)


def test_the_gap_pairs_seeds_and_falls_back_to_the_means():
    base = dict(seeds=[1, 2, 3], val_loss_per_seed=[2.0, 2.2, 2.4], val_loss_mean=2.2)
    assert results.gap(dict(seeds=[3, 1], val_loss_per_seed=[2.5, 2.1], val_loss_mean=2.3), base) == \
        pytest.approx(0.1)  # (2.5 - 2.4 + 2.1 - 2.0) / 2: seeds matched by number, not by position
    assert results.gap(dict(seeds=[1, 4], val_loss_per_seed=[2.1, 9.0], val_loss_mean=5.55), base) == \
        pytest.approx(0.1)  # seed 4 has no partner: left out (the means' difference would be 3.35)
    assert results.gap(dict(seeds=[7], val_loss_per_seed=[2.5], val_loss_mean=2.5),
                       base) == pytest.approx(0.3)


def test_a_count_that_changes_mid_run_is_an_error(tmp_path):
    d = fake_run(tmp_path, "x", seed=1, fwd=8, val_losses=[4.0, 3.0], tok_s=[1] * 5, wall_s=1.0)
    with open(os.path.join(d, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(dict(iter=40, loss=1.0, tokens_per_s=1.0, fwd_allreduces=7)) + "\n")
    with pytest.raises(ValueError, match="fwd_allreduces changed"):
        record(d)


def test_counts_are_measured_per_config():
    r = run_script("experiment.py", "cpu", "--counts")
    assert r.returncode == 0, r.stderr
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| train_")]
    assert len(rows) == 16
    changed = {cells[0].strip(): [int(c.strip().replace(",", "")) for c in cells[3:6]] for cells in rows[10:]}
    # delayed: the same syncs and bytes; compressed (n_embd 64 in blocks of 32): 1.125 B/value forward, 4
    # backward
    assert changed["train_shakespeare_char_24comm.py --block_types=['ladder']*12"] == [24, 24,
                                                                                       24 * 2 * 64 * 4]
    assert changed["train_shakespeare_char_24comm.py --tp_comm_dtype=int8"] == [24, 24, 24 * 64 * (1.125 + 4)]
    for cells in rows[:10]:
        name, fwd, bwd, fp32, bf16 = cells[0].strip(), *(int(c.strip().replace(",", "")) for c in cells[3:7])
        assert name == f"train_shakespeare_char_{fwd}comm.py" and bwd == fwd
        assert fp32 == 2 * fwd * 64 * 4 and bf16 == fp32 // 2  # n_embd 64: fwd + bwd all-reduces of 64 floats


def test_counts_refuse_a_model_without_communication(tmp_path):
    """GPT's comm_per_forward is {}: --counts says so in one line instead of failing on a missing key."""
    path = tmp_path / "tiny_gpt.py"
    path.write_text("model_type = 'gpt'\nn_layer = 2\n")
    jobs = experiment.plan([sweep_plan.Run("gpt", str(path))], sweep_dir=str(tmp_path / "s"), seeds=[1],
                           overrides=TINY_SWEEP, check_data=False)
    with pytest.raises(SweepError, match=r"gpt: model_type='gpt' has no tensor-parallel "
                       r"communication"):
        experiment.comm_counts(jobs)
    assert "| 4 | 4 |" in experiment.comm_counts(experiment.plan(  # anti-vacuity: a TP config is counted
        tiny_runs(tmp_path)[:1], sweep_dir=str(tmp_path / "s"), seeds=[1], overrides=TINY_SWEEP,
                                                                 check_data=False))


@pytest.mark.parametrize("args, words", [(["--eval_interval=0"], "eval_interval must be >= 1, got 0"),
                                         (["--batch_size=0"], "batch_size must be >= 1, got 0"),
                                         (["--log_interval=-1"], "log_interval must be >= 1, got -1"),
                                         (["--max_iters=-5"], "max_iters must be >= 0, got -5"),
                                         (["--dropout=1.5"], "dropout must be in [0, 1), got 1.5"),
                                         (["--gradient_accumulation_steps=None"],
                                          "gradient_accumulation_steps: expected int (default 40), got None"),
                                         (["--tp_mode=fake"], "tp_mode must be 'simulated' or 'real', got "
                                          "'fake'"), (["--init_from=resume"], "runner starts every run from "
                                                      "scratch"), (["--nproc=0"], "--nproc must be >= 1, got "
                                                                   "0"), (["--nproc=two"], "--nproc takes an "
                                                                          "integer"), (["--seeds="],
                                                                                       "--seeds takes "
                                                                                       "distinct integers >= "
                                                                                       "0"), (["--seeds"],
                                                                                              "--seeds takes "
                                                                                              "distinct "
                                                                                              "integers >= "
                                                                                              "0"),
                                         (["--seeds=-3"], "got '-3'"), (["--seeds=1,1"], "got '1,1'"),
                                         (["--out="], "--out takes a directory"),])
def test_bad_runner_options_and_overrides_stop_before_any_work(tmp_path, args, words):
    out = tmp_path / "sweep"
    with pytest.raises(SweepError) as e:
        experiment.main(["cpu", "--dry-run", f"--out={out}", *args] if args[0] != "--out="
                        else ["cpu", *args])
    assert words in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()


def test_eval_interval_zero_is_one_line_not_a_traceback():
    r = run_script("experiment.py", "cpu", "--dry-run", "--eval_interval=0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == "error: 24comm: eval_interval must be >= 1, got 0"


def finished_job(tmp_path, *, sweep_dir=None, runs=None, seed=7, overrides=TINY_SWEEP):
    """A job (of tiny_runs by default) whose out_dir holds what a finished run leaves: config.json,
    metrics.jsonl, done.json; made-up numbers."""
    sweep_dir = sweep_dir or str(tmp_path / "sweep")
    job = experiment.plan(runs or tiny_runs(tmp_path)[:1], sweep_dir=sweep_dir, seeds=[seed],
                          overrides=overrides, check_data=False)[0]
    os.makedirs(job.out_dir, exist_ok=True)
    with open(os.path.join(job.out_dir, "config.json"), "w") as f:
        json.dump(job.cfg, f)
    with open(os.path.join(job.out_dir, "metrics.jsonl"), "w") as f:
        for i in range(7):
            if i % 3 == 0:
                f.write(json.dumps(dict(iter=i, train_loss=4.0 - i / 10, val_loss=4.1 - i / 10, lr=1e-3))
                        + "\n")
            f.write(json.dumps(dict(iter=i, loss=4.0, tokens_per_s=100.0 + i, fwd_allreduces=4,
                                    bwd_allreduces=4, grad_sync_allreduces=0, comm_bytes_per_token=128.0,
                                    comm_seconds=0.0)) + "\n")
    with open(os.path.join(job.out_dir, "done.json"), "w") as f:
        json.dump(dict(config=job.cfg, config_file="tiny_tp.py", wall_s=1.5), f)
    return job


def fake_run_job(job, *, bar=None):
    """run_job without train.py: the run's files stay, a valid done.json is written as the runner does."""
    done = dict(config=job.cfg, config_file="tiny_tp.py", wall_s=1.5)
    with open(os.path.join(job.out_dir, "done.json"), "w") as f:
        json.dump(done, f)
    return done


@pytest.mark.parametrize("content", ['{"config": {"seed": 7, "max_i', "[1, 2]", '{"config": "tiny"}',
                                     '{"config": {}}', "\xff\xfe", ""])
def test_a_corrupt_done_json_means_not_finished(tmp_path, content, capsys, monkeypatch):
    """The runner writes done.json last and atomically; one it cannot read marks no finished run: the run is
    planned again (and said so), never a traceback."""
    job = finished_job(tmp_path)
    assert sweep_records.run_dir_finished(job)  # anti-vacuity: the valid file counts
    with open(os.path.join(job.out_dir, "done.json"), "w", encoding="latin-1") as f:
        f.write(content)
    assert not sweep_records.run_dir_finished(job) and not experiment.is_finished(job)
    assert sweep_records.read_done(job.out_dir) is None
    capsys.readouterr()
    monkeypatch.setattr(experiment, "run_job", fake_run_job)
    experiment.run_sweep([job])
    out = capsys.readouterr().out
    assert f"redo {job.label}: " in out and f"done {job.label}: " in out and experiment.is_finished(job)


@pytest.mark.parametrize("line, words", [('{"iter": 7, "loss": 3.9, "tokens_p', "line 11: not JSON"),
                                         ('{"iter": "7", "loss": 3.9}', "line 11: 'iter' must be an int >= "
                                          "0, got '7'"), ('{"iter": 9, "val_loss": null}', "line 11: "
                                                          "'val_loss' must be a number, got None"),
                                         ('{"iter": 8, "loss": 3.9, "tokens_per_s": "fast"}', "line 11: "
                                          "'tokens_per_s' must be a number, got 'fast'"),
                                         ('{"iter": 8, "loss": 3.9, "fwd_allreduces": 4.5}', "line 11: "
                                          "'fwd_allreduces' must be an int, got 4.5"),
                                         ("[1, 2]", "line 11: expected a JSON object, got list"),])
def test_a_corrupt_metrics_file_of_a_finished_run_is_one_line_naming_it(tmp_path, line, words):
    job = finished_job(tmp_path)
    experiment.record_finished([job])  # anti-vacuity: the intact run is recorded
    assert experiment.is_finished(job)
    os.remove(job.result_path)
    path = os.path.join(job.out_dir, "metrics.jsonl")
    with open(path, "a") as f:
        f.write(line + "\n")
    with pytest.raises(ResultsError, match=re.escape(f"{path} {words}")) as e:
        experiment.record_finished([job])
    assert "\n" not in str(e.value) and not os.path.exists(job.result_path)


@pytest.mark.parametrize("edit, words", [(lambda text: text[:len(text) // 2], "not readable as JSON"),
                                         (lambda text: text.replace('"val_loss": ', '"val_loss": "low", "x": '
                                                                    '', 1), "'val_loss' must be a number"),
                                         (lambda text: text.replace('"val_curve": [', '"val_curve": [[1, 2], '
                                                                    '', 1), "'val_curve' must be a "
                                          "non-empty"),])
def test_a_corrupt_result_file_is_redone_by_a_sweep_and_named_by_a_report(tmp_path, edit, words, capsys,
                                                                          monkeypatch):
    job = finished_job(tmp_path)
    experiment.record_finished([job])
    sweep_dir = os.path.dirname(job.out_dir)
    experiment.report([job], sweep_dir, title="tiny")  # anti-vacuity: the intact file reports
    with open(job.result_path) as f:
        text = f.read()
    with open(job.result_path, "w") as f:
        f.write(edit(text))
    with pytest.raises(SweepError) as e:
        experiment.report([job], sweep_dir, title="tiny")
    assert job.result_path in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setattr(experiment, "run_job", fake_run_job)
    capsys.readouterr()
    experiment.run_sweep([job])  # the run directory is intact: recorded again, not rerun
    out = capsys.readouterr().out
    assert f"redo {job.label}: {job.result_path}: not a valid result file" in out and "record " in out
    assert experiment.is_finished(job)


@pytest.mark.parametrize("name, content, words", [
    ("config.json", '{"seed": 7, "batch', "config.json: not readable as JSON"),
    ("config.json", '{"seed": "7"}', "config.json: 'seed' must be an int, got '7'"),
    ("done.json", '{"config": {"seed": 7}, "wall_s": "long"}', "done.json: wall_s must be a number"),
])
def test_corrupt_json_files_are_named(tmp_path, name, content, words):
    job = finished_job(tmp_path)
    with open(os.path.join(job.out_dir, name), "w") as f:
        f.write(content)
    with pytest.raises(ResultsError, match=re.escape(words)):
        results.run_record(job.out_dir, sweep="tiny", run="tp")


def test_report_only_cli_names_a_corrupt_metrics_file(tmp_path):
    sweep_dir = str(tmp_path / "cpu")
    job = finished_job(tmp_path, sweep_dir=sweep_dir, runs=sweep_plan.SWEEPS["cpu"][:1], seed=1337,
                       overrides=())
    path = os.path.join(job.out_dir, "metrics.jsonl")
    with open(path, "a") as f:
        f.write('{"iter": 7, "lo')  # truncated
    r = run_script("experiment.py", "cpu", "--report-only", f"--out={sweep_dir}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert path in line and "line 11: not JSON" in line, line


def test_two_sweep_processes_share_the_runs(tmp_path, monkeypatch, capsys):
    """A sweep locks each run while it trains it (experiment.job_lock, an OS lock): a second sweep
    process over the same runs skips a locked run ("busy", returned) and trains the others, so the same
    command started twice trains two runs at a time; a run that another process finished while this one
    waited is not trained again."""
    jobs = [finished_job(tmp_path, seed=s) for s in (7, 8, 9)]
    for j in jobs:
        os.remove(os.path.join(j.out_dir, "done.json"))
    trained = []

    def run_job(job, *, bar=None):
        assert not experiment.job_lock(job).acquire()  # held by this sweep while it trains the run
        trained.append(job.label)
        return fake_run_job(job)

    monkeypatch.setattr(experiment, "run_job", run_job)
    with experiment.job_lock(jobs[1]):  # another process trains seed 8
        assert experiment.run_sweep(jobs) == [jobs[1]]
    assert trained == ["tp-seed7", "tp-seed9"] and not experiment.is_finished(jobs[1])
    assert "[2/3] busy tp-seed8: another sweep process is training it" in capsys.readouterr().out

    assert experiment.run_sweep(jobs) == []  # anti-vacuity: unlocked, the run is trained, the others skipped
    assert trained == ["tp-seed7", "tp-seed9", "tp-seed8"] and all(experiment.is_finished(j) for j in jobs)

    # the other process finished it between this sweep's first look and its lock: skipped, not trained again
    os.remove(jobs[0].result_path)
    real, looks = experiment.result_problem, []

    def result_problem(job):
        looks.append(job.label)
        if len(looks) == 1:  # the first look finds no result; meanwhile the other process records it
            experiment.record_finished([job], say=lambda *_: None)
            return "no result file"
        return real(job)

    monkeypatch.setattr(experiment, "result_problem", result_problem)
    experiment.run_sweep(jobs[:1])
    assert len(looks) >= 2 and len(trained) == 3  # looked again under the lock; nothing trained
    assert "[1/1] skip tp-seed7: already finished" in capsys.readouterr().out


def test_the_sweep_cli_reports_after_the_other_process(tmp_path, char_data, monkeypatch):
    """The report is written under a waiting lock on the sweep directory (one writer at a time); running and
    reading are not locked: --dry-run works while another sweep reports."""
    from tpcomm.train.runtime import RunLock

    sweep_dir = str(tmp_path / "sweep")
    argv = ["cpu", f"--out={sweep_dir}", f"--data_dir={char_data}"]
    calls = []

    def fake_report(jobs, directory, **kw):  # the report holds the sweep directory's lock
        assert not RunLock(directory).acquire()
        calls.append(len(jobs))
        return "table", []

    monkeypatch.setattr(experiment, "run_sweep", lambda jobs, **kw: [])
    monkeypatch.setattr(experiment, "report", fake_report)
    experiment.main(argv)
    assert calls == [16]
    with RunLock(sweep_dir, what="experiment.py sweep"):
        r = run_script("experiment.py", *argv, "--dry-run")
        assert r.returncode == 0 and r.stdout.count("run   ") == 16, r.stderr


def test_train_log_is_written_line_by_line(tmp_path, monkeypatch):
    """train.log holds each line train.py printed while the run is still going, so a killed sweep leaves a log
    that is complete up to the kill."""
    go, child = tmp_path / "go", tmp_path / "child.py"  # the child prints two lines, then waits for `go`
    child.write_text("import os, time\nprint('iter 0: loss 4.0', flush=True)\nprint('iter 1: loss 3.9', "
                     "flush=True)\ndeadline = time.time() + 60\n"
                     f"while not os.path.exists({str(go)!r}) and time.time() < deadline:\n"
                     "    time.sleep(0.05)\nprint('done', flush=True)\n")
    monkeypatch.setattr(experiment, "command", lambda job: [sys.executable, str(child)])
    job = experiment.Job(sweep_plan.Run("fake", "fake.py"), 1, str(tmp_path / "run"), [], {"max_iters": 1}, 1)
    thread = threading.Thread(target=experiment.run_job, args=(job,))
    thread.start()
    try:
        log = os.path.join(job.out_dir, "train.log")
        text, deadline = "", time.time() + 30
        while "iter 1: loss 3.9\n" not in text and time.time() < deadline:
            time.sleep(0.05)
            text = open(log).read() if os.path.exists(log) else ""
        assert thread.is_alive() and not go.exists()  # the child still runs
        assert text.splitlines()[1:] == ["iter 0: loss 4.0", "iter 1: loss 3.9"], text
    finally:
        go.touch()
        thread.join(60)
    assert open(log).read().splitlines()[-1] == "done" and sweep_records.read_done(job.out_dir) is not None


def test_a_resumed_runs_repeated_records_do_not_distort_rates_or_curves(tmp_path):
    """A resume logs again from the checkpoint's iteration: the last record of an iter wins, and the first
    logged steps of each process (its start-up, slow) stay out of tokens/s."""
    d = tmp_path / "run"
    d.mkdir()
    cfg = dict(seed=1, model_type="gpt", n_layer=2, batch_size=2, block_size=8, gradient_accumulation_steps=1,
               max_iters=5)
    (d / "config.json").write_text(json.dumps(cfg))
    ev = lambda i, v: dict(iter=i, train_loss=v, val_loss=v)  # noqa: E731
    tr = lambda i, tok_s: dict(iter=i, loss=1.0, tokens_per_s=tok_s)  # noqa: E731
    # first process: start-up steps at 1 tok/s, then 100; killed after iter 3, its checkpoint is at iter 2
    first = [ev(0, 4.0), tr(0, 1.0), tr(1, 1.0), ev(2, 3.8), tr(2, 100.0), tr(3, 100.0)]
    # resumed from iter 2: evaluates again (another value), start-up steps at 2 tok/s, then 100
    resumed = [ev(2, 3.7), tr(2, 2.0), tr(3, 2.0), ev(4, 3.5), tr(4, 100.0), tr(5, 100.0)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + resumed))

    evals, train = results.read_metrics(str(d))
    assert [r["iter"] for r in train] == list(range(6)) and [r["iter"] for r in evals] == [0, 2, 4]
    # the latest record per iter
    assert [r["tokens_per_s"] for r in train] == [1.0, 1.0, 2.0, 2.0, 100.0, 100.0]
    run = results.run_record(str(d), sweep="s", run="r", params=False)
    assert run["val_curve"] == [[0, 0, 4.0], [2, 32, 3.7], [4, 64, 3.5]]
    assert (run["val_loss"], run["final_iter"]) == (3.5, 4)
    # the resumed process's start-up steps (iters 2, 3) are left out like the first one's (iters 0, 1):
    # skipping only the first two records of the file would give the median of [2, 2, 100, 100] = 51
    assert run["timing"]["tokens_per_s"] == 100.0

    # killed right after the eval record and checkpoint at iter 4: the resume repeats only that eval record
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        ev(0, 4.0), *(tr(i, 1.0 if i < 2 else 100.0) for i in range(4)), ev(4, 3.5),
        ev(4, 3.4), tr(4, 2.0), tr(5, 2.0), *(tr(i, 100.0) for i in range(6, 9))]))
    run = results.run_record(str(d), sweep="s", run="r", params=False)
    assert run["val_curve"] == [[0, 0, 4.0], [4, 64, 3.4]] and run["timing"]["tokens_per_s"] == 100.0
    _, train = results.read_metrics(str(d))
    assert [r["iter"] for r in train if r["_seg_pos"] < results.SKIP_TRAIN_RECORDS] == [0, 1, 4, 5]


def test_paired_differences_confidence_intervals_and_ordering(tmp_path):
    """Hand-computed: per-seed differences to the baseline -0.1 and -0.3 at the end (mean -0.2, 95% CI
    half-width 12.706 * stdev / sqrt(2) = 12.706 * 0.1414 / 1.414 = 1.2706); at iter 20 the differences are
    -0.1 and -0.1 (CI of zero width: 'lower'), so the ordering reads lower at 20, tied at 40. The baseline's
    last fifth (iter 40 vs the first eval at or after 0.8 * 40 = 32, i.e. 40 itself) changed 0%: flat."""
    base = [fake_run(tmp_path, "8comm", seed=s, fwd=8, val_losses=[4.0, 2.5, 2.0], tok_s=[1] * 5, wall_s=1.0)
            for s in (1, 2)]
    low = [fake_run(tmp_path, "3comm", seed=s, fwd=3, val_losses=[4.0, 2.4, v], tok_s=[1] * 5, wall_s=1.0)
           for s, v in ((1, 1.9), (2, 1.7))]
    rows = results.summarize([("8comm", [record(d) for d in base]), ("3comm", [record(d) for d in low])])
    pairs = pairing.paired(rows)
    mean, ci, per_seed = pairs["3comm"]["final"]
    assert per_seed == pytest.approx([-0.1, -0.3]) and mean == pytest.approx(-0.2)
    assert ci == pytest.approx(12.706 * statistics.stdev([-0.1, -0.3]) / 2 ** 0.5)
    assert pairing.ordering(pairs["3comm"]["curve"], 16) == (
        "lower 20-20 (0.00M-0.00M tokens); tied 40-40 (0.00M-0.00M tokens)")
    assert pairing.has_pairs(rows)
    assert pairing.flatness(rows[0]) == (0.0, (40, 40))
    md = pairing.paired_markdown(rows, early_iter=20)
    assert ("| 3comm | `['parallel','spd']*2` | 3 | 1.8000 ± 0.1414 | -0.2000 [-1.4706, +1.0706] | "
            "-0.1000, -0.3000 | -0.1000 [-0.1000, -0.1000] |" in md), md
    assert "criterion for flat: under 1%: met" in md
    paths = plots.write_paired(rows, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["paired.md", "paired_difference_vs_tokens.png"]
    # one seed: nothing to pair, nothing written
    one = results.summarize([("8comm", [record(base[0])]), ("3comm", [record(low[0])])])
    assert plots.write_paired(one, str(tmp_path / "x")) == []


def test_an_interrupted_checkpointing_run_resumes_from_its_checkpoint(tmp_path, char_data):
    """A sweep with always_save_checkpoint (like cpu-long): a run killed after a checkpoint goes on from it
    (its metrics up to the checkpoint kept) and ends as the uninterrupted run does."""
    runs = [sweep_plan.Run("tp", "config/train_shakespeare_char_24comm.py",
                           ("--n_layer=2", "--block_types=['tp']*2", "--always_save_checkpoint=True"))]
    overrides = [*TINY_SWEEP, f"--data_dir={char_data}", "--max_iters=6", "--eval_interval=3"]
    whole, = experiment.plan(runs, sweep_dir=str(tmp_path / "whole"), seeds=[7], overrides=overrides)
    experiment.run_sweep([whole])
    job, = experiment.plan(runs, sweep_dir=str(tmp_path / "cut"), seeds=[7], overrides=overrides)
    experiment.run_sweep([job])
    os.remove(job.result_path)  # as if killed after the last checkpoint ...
    os.remove(os.path.join(job.out_dir, "done.json"))
    with open(os.path.join(job.out_dir, "metrics.jsonl")) as f:
        lines = f.readlines()
    with open(os.path.join(job.out_dir, "metrics.jsonl"), "w") as f:  # ... and before its last records
        f.writelines(lines[:-2])
    assert experiment.resumable(job)
    experiment.run_sweep([job])
    with open(os.path.join(job.out_dir, "train.log")) as f:
        assert "--init_from=resume" in f.read()
    assert results.read_metrics(job.out_dir)[0] == results.read_metrics(whole.out_dir)[0]  # the evals
    got, want = results.read_record(job.result_path), results.read_record(whole.result_path)
    assert got["val_curve"] == want["val_curve"]
    # its result records the planned config (config.json now says init_from='resume'): the next sweep skips it
    assert got["config"] == job.cfg and experiment.is_finished(job)


# ---------- `python experiment.py report`: docs tables and plots from the result files alone ----------

PATTERN_LOSS = {"all-tp": 0.0, "all-spd": 0.002, "parallel-spd": 0.004, "all-parallel": 0.016,
                "all-ladder": 0.001, "ladder-upper": 0.001, "all-caat": 0.003, "parallel3-spd": 0.012,
                "parallel2-spd": 0.008, "parallel5-spd": 0.014}


FAKE_PARAMS = {}


def fake_record(job, *, final):
    """A result record as run_record writes it, for a planned job, with made-up
    losses and times (no training)."""
    cfg, per_iter = job.cfg, results.tokens_per_iter(job.cfg)
    steps, every = cfg["max_iters"], cfg["eval_interval"]
    types = cfg["block_types"] if isinstance(cfg["block_types"], list) else ["tp"] * cfg["n_layer"]
    fwd = sum({"tp": 2, "spd": 1, "parallel": 0, "ladder": 2, "caat": 2}[t] for t in types) + \
        (types[-1] == "parallel")
    shape = tuple(cfg.get(k) for k in ("model_type", "n_layer", "n_embd", "n_head", "block_size", "bias"))
    # a model built per shape, not per record: the block types share the parameters
    if shape not in FAKE_PARAMS:
        FAKE_PARAMS[shape] = results.count_params(cfg, 65)
    total, non_embedding = FAKE_PARAMS[shape]
    return dict(schema=1, sweep=job.sweep, run=job.run.name, seed=job.seed, config_file="sweep_axes.py",
                config=cfg, git=None, params=dict(total=total, non_embedding=non_embedding),
                tokens_per_iter=per_iter, tokens=per_iter * steps, data=dict(train_tokens=4_000_000,
                                                                             epochs=per_iter * steps / 4e6),
                val_curve=[[i, i * per_iter, final + 2.0 * (1 - i / steps) ** 2]
                           for i in range(0, steps + 1, every)], val_loss=final, final_iter=steps,
                comm=dict(fwd_allreduces=fwd, bwd_allreduces=fwd), timing=dict(step_ms=80.0 + job.seed % 7,
                                                                               tokens_per_s=9600.0,
                                                                               p90_over_median=1.1,
                                                                               scattered=False, wall_s=400.0),
                machine=None)


def fake_results(root, name, seeds=None):
    """Result files of every run of a sweep under root/experiments (the shared ones in their home's)."""
    runs = sweep_plan.SWEEPS[name]
    jobs = experiment.plan(runs, sweep_dir=f"experiments/{name}", seeds=seeds or sweep_plan.SWEEP_SEEDS[name],
                           sweep=name, homes=experiment.homes_of(runs, ()), check_data=False)
    for j in jobs:
        pattern = next(p for p in PATTERN_LOSS if j.run.name.startswith(p))
        final = 1.7 + PATTERN_LOSS[pattern] + 0.01 * (j.seed - 1337) + 1e-7 * j.cfg["tp_size"] + \
            0.3 / j.cfg["n_layer"] + 0.001 * (j.seed % 3) * (pattern != "all-tp")
        results.write_record(fake_record(j, final=final), os.path.join(root, j.result_path))
    return jobs


@pytest.fixture
def docs_copy(tmp_path):
    """A copy of README.md and docs/*.md (with their report markers) to regenerate into."""
    (tmp_path / "docs").mkdir()
    shutil.copy(os.path.join(ROOT, "README.md"), tmp_path / "README.md")
    for path in glob.glob(os.path.join(ROOT, "docs", "*.md")):
        shutil.copy(path, tmp_path / "docs")
    return tmp_path


def test_report_check_passes_on_the_committed_files(capsys):
    """Every marked table in README.md and docs/*.md and every report plot in docs/ equals what the committed
    result files give."""
    from tpcomm.experiments.report import report

    # in this process, where the cost bands are computed once (the command's own path:
    # test_report_cli_bad_input...)
    assert report.main(check=True) == 0, capsys.readouterr().out


def test_report_regenerates_tables_and_plots_and_check_catches_an_edit(docs_copy, capsys):
    from tpcomm.experiments.report import report

    root = str(docs_copy)
    for name in ("cpu-long", "tp-axis", "size-axis"):
        fake_results(root, name)
    axes_md = docs_copy / "docs" / "axes.md"
    assert "<!-- report:tp-axis-penalty -->" in axes_md.read_text()
    assert report.main(root=root) == 0
    text = axes_md.read_text()
    # paired by seed: every all-spd run is 0.002 + 0.001 * (seed % 3) above its all-tp run: seeds 1337-1339
    # give +0.004, +0.002, +0.003: mean +0.003, CI 4.303 * 0.001 / sqrt(3) = 0.0025; at tp 4 (cpu-long's runs)
    # the 11 seeds 1337-1347 give the same mean, CI 2.228 * 0.00089 / sqrt(11) = 0.0006
    assert "| `['spd']*12` | 12 | +0.0030 [+0.0005, +0.0055] (3) | +0.0030 [+0.0024, +0.0036] (11) | " \
        "+0.0030 [+0.0005, +0.0055] (3) |" in text, text
    assert "| 2 x 32, 4 heads | 24,736 |" in text and "| 4 x 48, 4 heads | 111,024 |" in text
    assert ("| 12 x 64, 8 heads | 591,424 | " in text and "| `['tp']*12` | 24 | -0.0000 (1) | baseline "
            "|" in text)
    for name in ("axes_penalty_vs_tp.png", "axes_penalty_vs_size.png", "cpu_long_paired_difference.png"):
        assert png.png_digest(str(docs_copy / "docs" / name)) is not None, name
    assert (docs_copy / "experiments" / "tp-axis" / "results.md").exists()  # the sweep's own outputs too
    # the README's answer from the same numbers: each pattern's paired difference and what it says at 95% (all
    # spd is 0.002 + 0.001 * (seed % 3) above all tp on 11 seeds: an interval above 0, so a cost, not a bound)
    readme = (docs_copy / "docs" / "answer.md").read_text()  # the README's table with its fine print
    # beside each row's own interval the family-wise one (Bonferroni over the 12 measured rows: wider); a
    # bound rounded up, no finer than a tenth of the half-width
    # an interval off 0: its ends as they are (no bound to round up)
    assert ("| drop | all `spd` | +0.0030 [+0.0024, +0.0036] (11) | [+0.0020, +0.0040] | "
            "costs +0.0030 [+0.0024, +0.0036] nats (0.2%) |" in readme)
    assert ("| delay | `ladder` in the upper half | +0.002 [-0.000, +0.005] (3) | [-0.007, +0.011] | "
            "costs at most +0.005 nats (0.3%) |" in readme), readme
    assert png.png_digest(str(docs_copy / "docs" / "answer_tradeoff.png")) is not None
    capsys.readouterr()
    assert report.main(check=True, root=root) == 0
    # one line
    assert capsys.readouterr().out.startswith("report --check: every marked table and report figure equals")

    # the run directories were never there: the report read the result files alone. Now edit one number ...
    axes_md.write_text(text.replace("+0.0030 [+0.0005, +0.0055] (3)", "+0.0031 [+0.0005, +0.0055] (3)", 1))
    assert report.main(check=True, root=root) == 1
    assert (capsys.readouterr().out.strip() == "docs/axes.md: report:tp-axis-penalty differs from the result "
            "files")
    axes_md.write_text(text)
    # ... or one result: the tables and the plots that show it no longer match
    path = docs_copy / "experiments" / "size-axis" / "runs" / "all-spd-2x32-seed1338.json"
    rec = json.loads(path.read_text())
    rec["val_curve"][-1][2] = rec["val_loss"] = rec["val_loss"] + 0.01
    path.write_text(json.dumps(rec))
    assert report.main(check=True, root=root) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert "docs/axes.md: report:size-axis-penalty differs from the result files" in lines
    assert "docs/axes_penalty_vs_size.png: its data digest differs from the result files'" in lines
    assert not any("tp-axis" in line or "penalty_vs_tp" in line for line in lines), lines


def test_alltp_table_says_how_long_the_degrees_agree(tmp_path):
    """tp-axis-alltp: all-tp at tp 2 and 8 against tp 4, same seed: agreement up to rounding (1e-4)
    through which eval, the drift after it against the seed spread; a curve apart from the first
    eval is NOT the same model."""
    from tpcomm.experiments.report import report

    root = str(tmp_path)
    for name in ("cpu-long", "tp-axis"):
        fake_results(root, name)
    text = report.tp_axis_alltp(report.Results(root=root, say=lambda *a: None))
    assert ("agree within 1e-04 through iter 5,000 at least" in text and "one baseline serves every "
            "degree" in text)
    assert "| 2 | 1337 | " in text and "| 8 | 1337 | " in text

    path = os.path.join(root, "experiments", "tp-axis", "runs", "all-tp-tp8-seed1337.json")
    rec = json.load(open(path))
    for point in rec["val_curve"][6:]:  # apart from iter 1500 on, by more than the seed spread at the end
        point[2] += 0.05
    rec["val_loss"] = rec["val_curve"][-1][2]
    results.write_record(rec, path)
    text = report.tp_axis_alltp(report.Results(root=root, say=lambda *a: None))
    assert "through iter 1,250 at least" in text and "NOT small beside the seed spread" in text, text
    for point in rec["val_curve"]:
        point[2] += 0.05
    results.write_record(rec, path)
    assert "NOT the same model" in report.tp_axis_alltp(report.Results(root=root, say=lambda *a: None))


def test_report_without_result_files_notes_them_and_refuses_bad_markers(docs_copy, capsys):
    from tpcomm.experiments.report import report

    root = str(docs_copy)
    page = docs_copy / "docs" / "x.md"
    page.write_text("<!-- report:cpu -->\nold\n<!-- /report:cpu -->\n")
    assert report.main(["cpu"], root=root) == 0
    assert "_No result files yet for `cpu`" in page.read_text()
    page.write_text("<!-- report:nosuch -->\n<!-- /report:nosuch -->\n<!-- report:cpu -->\n")
    assert report.main(["cpu"], check=True, root=root) == 1
    assert capsys.readouterr().out.strip().splitlines()[-2:] == [
        "docs/x.md: <!-- report:cpu --> has no <!-- /report:cpu -->",
        "docs/x.md: unknown report block 'nosuch' (tpcomm/experiments/report/report.py blocks() lists them)"]


def test_report_cli_bad_input_is_one_line():
    for args, words in ((["report", "nosuch"], "report: sweep must be one of"),
                        (["report", "--fix"], "--fix")):
        r = run_script("experiment.py", *args)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_result_files_are_committed_and_run_directories_ignored():
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    ignored = lambda path: subprocess.run(["git", "check-ignore", "-q", "--no-index", path],  # noqa: E731
                                          cwd=ROOT).returncode == 0
    assert not ignored("experiments/cpu-long/runs/all-tp-seed1337.json")
    assert not ignored("experiments/cpu-long/reruns/all-tp-seed1337.json")  # a rerun check the report reads
    assert ignored("experiments/cpu-long/all-tp-seed1337/metrics.jsonl")
    assert ignored("experiments/cpu-long/results.md") and ignored("experiments/cpu-long/runs/x.json.tmp")
    assert ignored("experiments/cpu+max_iters=20/runs/24comm-seed1337.json")  # a quick try
    assert ignored("experiments/local/cpu/runs/24comm-seed1337.json")  # make experiment's own runs


def test_on_a_terminal_the_run_progress_goes_into_the_one_sweep_bar():
    """run_job advances RunProgress (n, total, refresh) as it advanced its own
    bar; it shows in the sweep bar."""
    import io

    from tqdm import tqdm

    out = io.StringIO()
    with tqdm(total=2, desc="sweep", file=out) as bar:
        progress = experiment.RunProgress(bar, "24comm-seed1337", 501)
        progress.n = 250
        progress.refresh()
    assert "24comm-seed1337 iter 250/501" in out.getvalue()
