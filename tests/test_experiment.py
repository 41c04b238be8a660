"""experiment.py runs a sweep (skipping finished runs, redoing interrupted ones, refusing unequal token
budgets); results.py turns metrics files into tables and plots whose numbers are the measured ones."""

import csv
import json
import os
import statistics

import pytest

import experiment
import results
from configurator import _literal
from conftest import TINY, run_script

TINY_SWEEP = [a for a in TINY if not a.startswith(("--n_layer", "--log_interval"))] + [
    "--max_iters=6", "--lr_decay_iters=6", "--eval_interval=3", "--log_interval=1"]


def tiny_runs(tmp_path):
    """Two tiny DistributedGPT configs (4 and 1 forward all-reduces) written as config files."""
    runs = []
    for name, types in (("tp", "['tp'] * 2"), ("par", "['parallel'] * 2")):
        path = tmp_path / f"tiny_{name}.py"
        path.write_text(f"model_type = 'distributed_gpt'\ntp_size = 2\nn_layer = 2\nblock_types = {types}\n"
                        f"always_save_checkpoint = False\n")
        runs.append(experiment.Run(name, str(path)))
    return runs


def metrics_mtime(job):
    return os.stat(os.path.join(job.out_dir, "metrics.jsonl")).st_mtime_ns


def test_sweep_runs_skips_finished_and_redoes_interrupted(tmp_path, char_data, capsys):
    sweep_dir = str(tmp_path / "sweep")
    jobs = experiment.plan(tiny_runs(tmp_path), sweep_dir=sweep_dir, seeds=[7],
                           overrides=[*TINY_SWEEP, f"--data_dir={char_data}"])
    assert [j.label for j in jobs] == ["tp-seed7", "par-seed7"]
    experiment.run_sweep(jobs)
    assert all(experiment.is_finished(j) for j in jobs)
    first = [metrics_mtime(j) for j in jobs]

    # second invocation: nothing is rerun
    capsys.readouterr()
    experiment.run_sweep(jobs)
    assert capsys.readouterr().out.count("skip ") == 2
    assert [metrics_mtime(j) for j in jobs] == first

    # an interrupted run (no done.json, leftovers) is started again from scratch; the finished one is kept
    os.remove(os.path.join(jobs[1].out_dir, "done.json"))
    open(os.path.join(jobs[1].out_dir, "leftover"), "w").close()
    experiment.run_sweep(jobs)
    assert metrics_mtime(jobs[0]) == first[0] and metrics_mtime(jobs[1]) != first[1]
    assert not os.path.exists(os.path.join(jobs[1].out_dir, "leftover"))
    evals, train = results.read_metrics(jobs[1].out_dir)
    with open(os.path.join(jobs[1].out_dir, "metrics.jsonl")) as f:
        assert len(f.readlines()) == len(evals) + len(train)  # no records left from the first attempt

    # a changed config makes a finished run stale: it is planned for a rerun, not silently reused
    stale = experiment.plan(tiny_runs(tmp_path), sweep_dir=sweep_dir, seeds=[7],
                            overrides=[*TINY_SWEEP, f"--data_dir={char_data}", "--learning_rate=1e-3"])
    assert not any(experiment.is_finished(j) for j in stale)

    # the report reads the measured counts and the last eval record
    table, plots = experiment.report(jobs, sweep_dir, title="tiny")
    rows = {r["config"]: r for r in json.load(open(os.path.join(sweep_dir, "results.json")))}
    assert rows["tp"]["fwd_allreduces"] == 4 and rows["par"]["fwd_allreduces"] == 1
    assert rows["tp"]["val_loss_mean"] == results.read_metrics(jobs[0].out_dir)[0][-1]["val_loss"]
    assert rows["tp"]["final_iter"] == 6 and rows["par"]["gap_to_baseline"] == pytest.approx(
        rows["par"]["val_loss_mean"] - rows["tp"]["val_loss_mean"])
    assert all(os.path.getsize(p) > 10_000 for p in plots)


def test_unequal_token_budgets_are_refused(tmp_path, char_data):
    runs = tiny_runs(tmp_path)
    runs[1] = experiment.Run("par", runs[1].config, ("--gradient_accumulation_steps=2",))
    with pytest.raises(experiment.SweepError, match=r"same tokens.*tp=.*par="):
        experiment.plan(runs, sweep_dir=str(tmp_path / "s"), seeds=[1],
                        overrides=[*TINY_SWEEP, f"--data_dir={char_data}"])
    assert not os.path.exists(tmp_path / "s")  # refused before any work


def test_defined_sweeps_share_one_budget_and_name_their_configs():
    for name, runs in experiment.SWEEPS.items():
        jobs = experiment.plan(runs, sweep_dir=f"experiments/{name}", seeds=[1337], check_data=False)
        assert len({experiment.tokens_of(j.cfg) for j in jobs}) == 1, name
        for j in jobs:
            assert j.run.config.endswith(f"_{j.run.name}.py")
    assert [r.name for r in experiment.SWEEPS["cpu"]] == [f"{n}comm" for n in (24, 18, 16, 12, 8, 6, 4, 3, 2, 1)]
    assert [r.name for r in experiment.SWEEPS["gpt2"]] == [f"{n}comm" for n in (24, 18, 16, 12, 8, 6)]


def test_cli_dry_run_and_bad_input():
    r = run_script("experiment.py", "gpt2", "--dry-run", "--seeds=1,2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("run   python train.py config/train_gpt2_") == 12
    r = run_script("experiment.py", "cpu", "--dry-run", "--max_iters=20", "--lr_decay_iters=20")
    assert r.returncode == 0 and "experiments/cpu+max_iters=20+lr_decay_iters=20/24comm-seed1337" in r.stdout
    for args, words in ((["nosuch"], "sweep must be one of"), (["cpu", "--no_such_key=1"], "no_such_key"),
                        (["cpu", "--seed=3"], "--seeds")):
        r = run_script("experiment.py", *args)
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("types", [["tp"] * 12, ["parallel", "spd", "spd"] * 4, (["parallel"] * 5 + ["spd"]) * 2,
                                   ["tp", "spd"] * 6, ["spd", "tp", "tp", "parallel"], ["parallel"] * 3 + ["tp"]])
def test_block_pattern_is_compact_and_evaluates_back(types):
    expr = results.compact_list(types)
    assert _literal(expr) == types and len(expr) <= 40, expr


def fake_run(root, name, *, seed, fwd, val_losses, tok_s, wall_s):
    """A run directory as train.py + the runner leave it, with made-up numbers."""
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
                f.write(json.dumps(dict(iter=i, loss=loss, lr=1e-3, dt_ms=1.0, tokens_per_s=tok_s[i // 10],
                                        mfu=None, fwd_allreduces=fwd, bwd_allreduces=fwd, grad_sync_allreduces=4,
                                        comm_bytes_per_token=64.0 * fwd, comm_seconds=0.0)) + "\n")
    return str(d)


def test_writers_use_the_measured_numbers(tmp_path):
    # the labels claim other counts than measured: the table must show the measured ones
    base = [fake_run(tmp_path, "99comm", seed=s, fwd=8, val_losses=[4.0, 2.5, v], tok_s=[1, 2, 100, 300, 200],
                     wall_s=10.0 + s) for s, v in ((1, 2.0), (2, 2.2))]
    low = [fake_run(tmp_path, "98comm", seed=1, fwd=3, val_losses=[4.0, 2.6, 2.35], tok_s=[1, 5, 400, 500, 600],
                    wall_s=9.0)]
    rows = results.summarize([("99comm", base), ("98comm", low)])
    md, csv_path, json_path = results.write_tables(rows, str(tmp_path))
    plots = results.write_plots(rows, str(tmp_path), title="synthetic")

    b, lo = rows
    assert (b["fwd_allreduces"], lo["fwd_allreduces"]) == (8, 3) and b["baseline"] == "99comm"
    assert b["val_loss_mean"] == pytest.approx(2.1) and b["val_loss_std"] == pytest.approx(statistics.stdev([2, 2.2]))
    assert lo["gap_to_baseline"] == pytest.approx(0.25)
    assert b["tokens_per_s"] == 200 and lo["tokens_per_s"] == 500  # median of records after the first two
    assert b["wall_s"] == pytest.approx(11.5) and b["tokens"] == 2 * 8 * 40
    text = open(md).read()
    for cell in ("| cfg_99comm.py | `['parallel','spd']*2` | 8 | 8 | 2.1000 ± 0.1414 | 2.0000–2.2000 | 2 | +0.0000 "
                 "| 200 | 11.5 |",
                 "| cfg_98comm.py | `['parallel','spd']*2` | 3 | 3 | 2.3500 | — | 1 | +0.2500 | 500 | 9.0 |"):
        assert cell in text, text
    with open(csv_path) as f:
        got = list(csv.DictReader(f))
    assert [(g["config"], int(g["fwd_allreduces"]), float(g["val_loss_mean"])) for g in got] == [
        ("99comm", 8, pytest.approx(2.1)), ("98comm", 3, 2.35)]
    assert json.load(open(json_path))[1]["val_loss_per_seed"] == [2.35]
    for p in plots:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_count_that_changes_mid_run_is_an_error(tmp_path):
    d = fake_run(tmp_path, "x", seed=1, fwd=8, val_losses=[4.0, 3.0], tok_s=[1] * 5, wall_s=1.0)
    with open(os.path.join(d, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(dict(iter=40, loss=1.0, tokens_per_s=1.0, fwd_allreduces=7)) + "\n")
    with pytest.raises(ValueError, match="fwd_allreduces changed"):
        results.summarize_run(d)


def test_counts_are_measured_per_config():
    r = run_script("experiment.py", "cpu", "--counts")
    assert r.returncode == 0, r.stderr
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| train_")]
    assert len(rows) == 10
    for cells in rows:
        name, fwd, bwd, fp32, bf16 = cells[0].strip(), *(int(c.strip().replace(",", "")) for c in cells[3:7])
        assert name == f"train_shakespeare_char_{fwd}comm.py" and bwd == fwd
        assert fp32 == 2 * fwd * 64 * 4 and bf16 == fp32 // 2  # n_embd 64: fwd + bwd all-reduces of 64 floats
