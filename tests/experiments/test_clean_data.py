"""Clean data and stated statistics: every committed result file names its code,
the sweep refuses to write one from a dirty tree (--allow-dirty writes scratch files the report refuses),
the report prints each row's commits and flags rows from dirty trees, mixing code states or paired across
them (a rerun check clears a flag); and the answer's family-wise intervals, the t quantiles under them
and the shared baseline's correlation."""

import glob
import json
import os
import random
import re
import subprocess

import pytest

from conftest import ROOT
from tpcomm import git_state
from test_experiment import fake_results
from tpcomm.experiments import pairing, provenance, results, sweep_plan, sweep_records
from tpcomm.experiments.result_check import ResultsError
from tpcomm.experiments.report import report
from tpcomm.experiments import sweep as sweeps
from tpcomm.experiments.sweep_plan import SWEEPS

DIRTY = dict(commit="a" * 40, dirty=True)
CLEAN = dict(commit="b" * 40, dirty=False)


def committed_job(seed=99999):
    """A cpu-long job whose result file, experiments/cpu-long/runs/all-tp-seed<seed>.json, git would track."""
    job, = sweeps.plan(sweep_plan.runs_named("cpu-long", "all-tp"), sweep_dir="experiments/cpu-long",
                       seeds=[seed], sweep="cpu-long", check_data=False)
    return job


# ---------- the sweep: no committed result file from a dirty tree ----------

def test_the_sweep_refuses_a_committed_file_from_a_dirty_tree(monkeypatch, capsys):
    monkeypatch.setattr(sweeps, "git_state", lambda: DIRTY)
    monkeypatch.setattr(sweeps, "run_job", lambda *a, **k: pytest.fail("a run started from a dirty tree"))
    with pytest.raises(SystemExit) as e:  # before any work: one line, exit status 2
        sweeps.cli(["cpu-long", "--runs=all-tp", "--seeds=99999"])
    err = capsys.readouterr().err.strip()
    assert (e.value.code == 2 and "\n" not in err and "uncommitted changes" in err
            and "--allow-dirty" in err), err
    job = committed_job()
    assert sweep_records.committed(job.result_path)
    # and again at each run's start
    with pytest.raises(sweep_records.DirtyTreeError, match="would be committed"):
        sweeps.finish_job(job, progress=None, say=print)
    assert not os.path.exists(job.result_path)
    # the refusal can fail to fire: a clean tree, or a result file git ignores (a quick try's directory)
    sweep_records.refuse_dirty(job, CLEAN)
    quick, = sweeps.plan(sweep_plan.runs_named("cpu-long", "all-tp"),
                         sweep_dir="experiments/cpu-long+max_iters=9", seeds=[99999], sweep="cpu-long",
                         check_data=False)
    assert not sweep_records.committed(quick.result_path)
    sweep_records.refuse_dirty(quick, DIRTY)


@pytest.mark.parametrize("path", [sorted(glob.glob(os.path.join(ROOT, "experiments", "cpu-long", "runs",
                                                                "*.json")))[0], os.path.join(ROOT, "docs",
                                                                                             "gpu.json"),
                                  os.path.join(ROOT, "docs", "gpu.md")])
def test_result_files_are_not_code(path):
    """A sweep replacing its own committed result files, or gpu_check its docs/gpu.json and
    docs/gpu.md, leaves the tree clean: git_state looks outside them. Any other tracked file makes
    it dirty (the comparison can fail)."""
    before = git_state()
    if before is None:
        pytest.fail("the tests run in a git checkout")
    for changed, dirty in ((path, before["dirty"]), (__file__, True)):  # this file: no other test reads it
        with open(changed) as f:
            text = f.read()
        try:
            with open(changed, "a") as f:
                f.write(" ")
            assert git_state()["dirty"] == dirty, changed
        finally:
            with open(changed, "w") as f:
                f.write(text)


def test_allow_dirty_writes_scratch_files_the_report_refuses(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sweeps, "git_state", lambda: DIRTY)
    sweeps.main(["cpu-long", "--runs=all-tp", "--seeds=99999", "--allow-dirty", "--dry-run"])
    out = capsys.readouterr().out
    assert "--out_dir=experiments/scratch/cpu-long/all-tp-seed99999" in out, out
    job = committed_job()
    job.scratch = True
    recorded = {}
    monkeypatch.setattr(sweeps, "run_job", lambda *a, **k: None)
    monkeypatch.setattr(sweeps, "record_job", lambda job, *, git: recorded.update(git))
    sweeps.finish_job(job, progress=None, say=print)
    assert recorded == dict(DIRTY, when="run start", scratch=True)
    # a scratch file where a committed one belongs: the report refuses it, naming it
    record = results.read_record(sorted(glob.glob(os.path.join(ROOT, "experiments", "cpu-long", "runs",
                                                               "all-tp-seed*.json")))[0])
    record["git"] = dict(DIRTY, when="run start", scratch=True)
    path = tmp_path / "experiments" / "cpu-long" / "runs" / f"all-tp-seed{record['seed']}.json"
    results.write_record(record, str(path))
    with pytest.raises(ResultsError, match=re.escape(str(path)) + ".*scratch"):
        report.Results(root=str(tmp_path), say=lambda *a: None).rows("cpu-long")
    # its own sweep's tables read it in experiments/scratch/; without the mark the report reads it
    sweep_records.check_code_state(record, os.path.join(ROOT, sweep_records.SCRATCH_DIR, "cpu-long", "runs",
                                                        "a.json"))
    record["git"].pop("scratch")
    results.write_record(record, str(path))
    assert report.Results(root=str(tmp_path), say=lambda *a: None).rows("cpu-long")


# ---------- the report: each row's commits, and what they say ----------

def test_row_verdicts():
    one = {"bbbbbbb": 3}
    assert provenance.row_verdict("x", one, "base", one, []) == "one code state"
    dirty = provenance.row_verdict("x", {"bbbbbbb": 2, "aaaaaaa+dirty": 1}, "base", one, [])
    assert dirty.startswith("**from unnamed code until rerun** (1 of 3 files")
    mixed = {"bbbbbbb": 2, "ccccccc": 1}
    assert "**mixes 2 code states** (no rerun shows ccccccc equal to bbbbbbb)" in \
        provenance.row_verdict("x", mixed, "base", one, [])
    check = dict(run="x", seed=1, old="ccccccc", new="bbbbbbb", equal=True)
    assert provenance.row_verdict("x", mixed, "base", one, [check]) == "2 commits, shown equal by rerun"
    assert "**mixes" in provenance.row_verdict("x", mixed, "base", one, [dict(check, equal=False)])
    assert "**mixes" in provenance.row_verdict("x", mixed, "base", one, [dict(check, run="y")])
    # a row at another commit than its baseline: flagged until a rerun of the baseline bridges them
    later = {"ddddddd": 10}
    assert "**paired with base across code states** (ddddddd against bbbbbbb" in \
        provenance.row_verdict("x", later, "base", one, [])
    bridge = dict(run="base", seed=1337, old="bbbbbbb", new="ddddddd", equal=True)
    assert provenance.row_verdict("x", later, "base", one, [bridge]) == \
        "one code state; paired with base across code states, bridged by a rerun"


def _set_git(root, sweep, pattern, git):
    for path in glob.glob(os.path.join(root, "experiments", sweep, "runs", pattern)):
        with open(path) as f:
            record = json.load(f)
        record["git"] = git
        results.write_record(record, path)


def test_the_report_prints_commits_and_rerun_checks(tmp_path):
    root = str(tmp_path)
    fake_results(root, "cpu-long", seeds=(1337, 1338, 1339))
    _set_git(root, "cpu-long", "*.json", CLEAN)
    _set_git(root, "cpu-long", "all-spd-seed1339.json", dict(CLEAN, commit="c" * 40))
    _set_git(root, "cpu-long", "all-parallel-seed1338.json", DIRTY)
    ctx = report.Results(root=root, say=lambda *a: None)
    table = provenance.provenance_markdown(ctx, "cpu-long")
    row = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert row["all-tp"] == "| all-tp | bbbbbbb (3) | one code state |"
    assert "**mixes 2 code states**" in row["all-spd"] and "bbbbbbb (2), ccccccc (1)" in row["all-spd"]
    assert ("aaaaaaa+dirty (1)" in row["all-parallel"] and "**from unnamed code until "
            "rerun**" in row["all-parallel"])
    assert "No rerun checks yet" in table
    n = len(SWEEPS["cpu-long"])  # every planned row has fake files here
    assert f"code: {n - 2} of {n} rows from one named code state, 2 flagged" in provenance.summary(ctx,
                                                                                                   "cpu-long")
    # a rerun of all-spd seed 1339 at bbbbbbb, equal to 4 decimals, clears the mixed flag
    with open(os.path.join(root, "experiments", "cpu-long", "runs", "all-spd-seed1339.json")) as f:
        record = json.load(f)
    rerun = dict(record, git=dict(CLEAN, when="run start"), val_loss=record["val_loss"] + 2e-6)
    path = os.path.join(root, "experiments", "cpu-long", "reruns", "all-spd-seed1339.json")
    results.write_record(rerun, path)
    table = provenance.provenance_markdown(report.Results(root=root, say=lambda *a: None), "cpu-long")
    assert "| all-spd | bbbbbbb (2), ccccccc (1) | 2 commits, shown equal by rerun |" in table, table
    assert re.search(r"\| all-spd \| 1339 \| ccccccc \| [\d.]+ \| bbbbbbb \| [\d.]+ \| yes \|", table), table
    # anti-vacuity: a rerun that differs in the fourth decimal is said to differ, and the flag stays
    results.write_record(dict(rerun, val_loss=record["val_loss"] + 3e-4), path)
    table = provenance.provenance_markdown(report.Results(root=root, say=lambda *a: None), "cpu-long")
    assert "| **NO** |" in table and "**mixes 2 code states**" in table
    # a rerun from a dirty tree checks nothing: refused, named
    results.write_record(dict(rerun, git=DIRTY), path)
    with pytest.raises(ResultsError, match="reruns/all-spd-seed1339.json: a rerun check must come from"):
        provenance.rerun_checks("cpu-long", root=root)
    results.write_record(dict(rerun, git=dict(CLEAN, scratch=True)), path)  # nor does a scratch file
    with pytest.raises(ResultsError, match="reruns/all-spd-seed1339.json: a scratch result file"):
        provenance.rerun_checks("cpu-long", root=root)


def test_a_rerun_check_git_ignores_is_refused(tmp_path):
    """A rerun check only a local checkout has (git ignores it, so a clean clone's report differs) is refused
    by name; the same file, un-ignored, is read."""
    root = str(tmp_path)
    fake_results(root, "cpu-long", seeds=(1337,))
    _set_git(root, "cpu-long", "*.json", CLEAN)
    with open(os.path.join(root, "experiments", "cpu-long", "runs", "all-tp-seed1337.json")) as f:
        record = json.load(f)
    results.write_record(record, os.path.join(root, "experiments", "cpu-long", "reruns",
                                              "all-tp-seed1337.json"))
    subprocess.run(["git", "init", "-q", root], check=True)
    with open(os.path.join(root, ".gitignore"), "w") as f:
        f.write("experiments/**\n!experiments/*/\n!experiments/*/runs/\n!experiments/*/runs/*.json\n")
    with pytest.raises(ResultsError, match="reruns/all-tp-seed1337.json: git ignores this rerun check"):
        provenance.rerun_checks("cpu-long", root=root)
    with open(os.path.join(root, ".gitignore"), "a") as f:
        f.write("!experiments/*/reruns/\n!experiments/*/reruns/*.json\n")
    assert [c["equal"] for c in provenance.rerun_checks("cpu-long", root=root)] == [True]


def test_the_committed_files_name_their_code_or_are_flagged():
    """Every committed result file records a commit; a file from a dirty tree is never unflagged: its row says
    'from unnamed code until rerun' in the report (docs/axes.md's code tables)."""
    ctx = report.Results(say=lambda *a: None)
    for name in report.AXES:
        table = provenance.provenance_markdown(ctx, name)
        states, own = provenance.states_of(ctx, name)
        for run in own:
            line = next(line for line in table.splitlines() if line.startswith(f"| {run} |"))
            if any(not provenance.is_named(s) for s in states[run]):
                assert "**from unnamed code until rerun**" in line, line
    for path in glob.glob(os.path.join(ROOT, "experiments", "*", "runs", "*.json")):
        git = results.read_record(path)["git"]
        assert re.fullmatch(r"[0-9a-f]{40}", git["commit"]) and not git.get("scratch"), path


# ---------- statistics ----------

def test_t_quantile():
    """The closed-form t distribution gives the standard table (3 decimals) and known Bonferroni quantiles."""
    for df, t in enumerate(pairing.T_975, 1):
        assert pairing.t_quantile(0.05, df) == pytest.approx(t, abs=6e-4), df
    assert pairing.t_quantile(0.005, 9) == pytest.approx(3.690, abs=6e-4)  # 10 rows at 95%: 99.75% two-sided
    assert pairing.t_quantile(0.01, 10) == pytest.approx(3.169, abs=6e-4)
    assert pairing.t_quantile(0.05, 1000) == pytest.approx(pairing.t_975(1000), abs=1e-6)
    assert pairing.t_quantile(0.05, 9) != pytest.approx(pairing.t_quantile(0.05, 10), abs=6e-4)  # it can fail


def test_familywise_intervals_hold_together():
    """Bonferroni over m rows: all m intervals cover their true means together in >= 95% of simulated
    families, where the per-row 95% intervals together cover far less often (so the comparison can fail)."""
    rng = random.Random(47)
    m, n, trials, fam, own = 10, 10, 1500, 0, 0
    for _ in range(trials):
        diffs = {k: [rng.gauss(0.0, 1.0) for _ in range(n)] for k in range(m)}
        family, count = pairing.familywise(diffs)
        assert count == m
        fam += all(abs(mean) <= hw for mean, hw in family.values())
        own += all(abs(mean) <= hw for mean, hw in map(pairing.mean_ci, diffs.values()))
    assert fam / trials >= 0.94 and own / trials < 0.7, (fam / trials, own / trials)
    family, count = pairing.familywise({"a": [0.1, 0.2, 0.3], "b": [0.5]})  # one seed: not a measured row
    # one row: Bonferroni is the row's own interval (the table's t to 3 decimals against the exact one: 2e-4)
    assert count == 1 and set(family) == {"a"}
    assert family["a"][1] == pytest.approx(pairing.mean_ci([.1, .2, .3])[1], rel=2e-4)


def test_shared_baseline_correlation():
    """Rows paired with one baseline inherit its seed noise: r near 1 when the baseline's noise
    dominates, near 0 when it is absent; pairs of rows with fewer than CORRELATION_MIN_SEEDS
    common seeds are left out."""
    rng = random.Random(1)
    seeds = list(range(40))

    def pairs(base_sd):
        base = {s: rng.gauss(0, base_sd) for s in seeds}
        return {k: dict(seeds=seeds, final=(0, 0, [rng.gauss(0, 0.1) - base[s] for s in seeds]))
                for k in "abc"}
    assert min(pairing.shared_baseline_correlation(pairs(1.0))) > 0.9
    assert max(abs(r) for r in pairing.shared_baseline_correlation(pairs(0.0))) < 0.5
    short = {k: dict(p, seeds=seeds[:3], final=(0, 0, p["final"][2][:3])) for k, p in pairs(1.0).items()}
    assert pairing.shared_baseline_correlation(short) == []


def test_the_answer_table_states_its_family_wise_intervals():
    ctx = report.Results(say=lambda *a: None)
    from tpcomm.experiments.report import answer
    table = answer.answer_details(ctx)
    family, m = answer._familywise(ctx)
    assert (f"Bonferroni over the {m} measured rows" in table and f"family-wise [95%, Bonferroni over "
            f"{m}]" in table)
    # r < 0 too
    assert re.search(r"Pearson r between two rows' per-seed differences from -?0\.\d\d to -?0\.\d\d", table)
    pen, _ = answer._long_penalties(ctx)
    for run, (mean, hw) in family.items():
        assert hw > pen[run][1]  # wider than the row's own
    summary = answer.answer_long(ctx)
    assert "of all `tp`'s validation loss" in summary
    assert not re.search(r"at most [+-]\d\.\d{4}", table + summary)  # no bound to 4 decimals at these widths


def test_a_table_of_runs_on_other_shakespeare_bytes_says_so():
    """Runs on Shakespeare-char whose data is not the committed results' corpus (tiny shakespeare, say) are
    marked above their table; the committed files are not (the check can fail both ways)."""
    from tpcomm.experiments import results
    from tpcomm.experiments.report import report

    rows = report.Results(say=lambda *a: None).rows("cpu")
    assert rows and not results.markdown_table(rows).startswith("**Not the committed")
    tiny = [dict(r, data_sha256=["0" * 64]) for r in rows]
    assert results.markdown_table(tiny).startswith("**Not the committed results' corpus")
