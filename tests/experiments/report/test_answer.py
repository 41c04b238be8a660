"""The README's answer (tpcomm/experiments/report/report.py): each way of giving up a sync, its quality cost
stated as a bound at 95% and its predicted GPU speedup, in one table, a few generated sentences and one
figure; and the README's shape around it (what it is, the answer, the Quickstart's two commands before line
60, the GPU pointer, the tools). Nothing is trained: the quality side reads made-up result files
(test_experiment.fake_results)."""

import os
import re
import shutil

import pytest

from conftest import ROOT
from test_experiment import fake_results
from tpcomm.experiments.report import answer as ans
from tpcomm.experiments import pairing, readings
from tpcomm.figures import png
from tpcomm.experiments.report import report


# ---------- a paired difference stated at 95% ----------

def test_claim_bounds_a_cost_where_the_interval_holds_zero():
    """Holding 0: the largest cost ruled out (the interval's upper end) and its share of the baseline;
    excluding 0: the cost (or the gain) with its interval; under 2 paired seeds: pending."""
    assert readings.claim((0.002, 0.006, 10), 1.7) == "costs at most +0.008 nats (0.5%)"
    # a bound is printed no finer than a tenth of its half-width, rounded up (never understated): +0.0005 with
    # a half-width of 0.005 is +0.001 (0.1%), not the +0.0005 (0.03%) one more seed would move
    assert readings.claim((-0.0045, 0.0050, 10), 1.7) == "costs at most +0.001 nats (0.1%)"
    # 0.025 (1.47%) with a half-width of 0.021 (1.2%): 2 decimals in nats, none in percent, each rounded up
    assert readings.claim((0.004, 0.021, 3), 1.7) == "costs at most +0.03 nats (2%)"
    assert readings.bound(0.0251, 1.7, half_width=0.0021) == ("+0.026", "1.6%")
    # the share is the printed bound's: all `caat` at 4 seeds read "+0.01 nats (0.2%)", the share of +0.003
    assert readings.claim((-0.010, 0.013, 4), 1.704) == "costs at most +0.01 nats (0.6%)"
    # a cost at the interval's digits, its upper end rounded up as the tables print it
    assert readings.claim((0.025, 0.022, 3), 1.7) == "costs +0.03 [+0.00, +0.05] nats (1.5%)"
    assert readings.claim((0.0251, 0.0064, 3), 1.7) == "costs +0.025 [+0.019, +0.032] nats (1.5%)"
    assert readings.claim((-0.046, 0.026, 3), 2.0) == "gains 0.05 [-0.07, -0.02] nats (2.3%)"
    # anti-vacuity: the same mean with a narrower interval is a cost, not a bound
    assert readings.claim((0.002, 0.001, 10), 1.7).startswith("costs +0.0020 [")
    assert readings.claim((0.02, None, 1), 1.7) == "pending (1 paired seed)"
    assert readings.claim(None, 1.7) == "pending (0 paired seeds)"
    # 2 seeds: an interval on one degree of freedom is not read (all `caat` showed [-0.013, -0.012] from 2)
    assert readings.claim((-0.0123, 0.0003, 2), 1.7) == "pending (2 paired seeds)"


# ---------- the GPU side: the cost model, called in one place ----------

def test_gpu_speedups_are_the_cost_models():
    """The answer's speedups are the cost model's predicted_speedups over Megatron's baseline, for
    every way that has a GPU variant; drops order as their syncs do; every published-figure check
    comes back with its error."""
    from tpcomm.costmodel import cost_model as cm

    gpu, links, assumes, checks = ans.gpu_speedups()
    assert links == [link.name for link in cm.LINKS] and "tp 8" in assumes and "Megatron" in assumes
    for link in cm.LINKS:
        want = cm.predicted_speedups(link.name, "megatron")
        for _, _, _, variant in ans.way_rows():
            if variant is not None:
                assert gpu[variant][link.name] == pytest.approx(want[variant], rel=1e-12), variant
        assert gpu["all-parallel"][link.name] > gpu["parallel-spd"][link.name] > gpu["all-spd"][link.name] > 1
        blocking = cm.predicted_speedups(link.name, "blocking")
        # the baseline matters: the comparison can fail
        assert blocking["all-spd"] != gpu["all-spd"][link.name]
    cfg = cm.PREDICT_DEFAULTS
    published = cm.published_checks(cfg, cm.options(cfg))
    ends = sum(2 if isinstance(p, tuple) else 1 for _, p, _ in published)
    assert len(checks) == ends >= 7  # every check, each end of a range, not the best one


# ---------- a pattern without result files: pending, not a crash ----------

@pytest.fixture(scope="module")
def fake_long(tmp_path_factory):
    """Made-up result files of every cpu-long run (all seeds), written once for this file's tests."""
    root = tmp_path_factory.mktemp("long")
    fake_results(str(root), "cpu-long")
    return root


def test_a_pattern_without_result_files_is_pending(tmp_path, fake_long):
    shutil.copytree(fake_long, tmp_path, dirs_exist_ok=True)
    root = str(tmp_path)
    runs = tmp_path / "experiments" / "cpu-long" / "runs"
    for path in runs.glob("all-tp-int8-2shot-seed*.json"):
        path.unlink()
    ctx = report.Results(root=root, say=lambda *a: None)
    table = ans.answer_details(ctx)
    assert "| shrink | int8 two-shot | pending | — | pending (0 paired seeds) |" in table, table
    assert "| all-tp-int8-2shot | — | — | — | 0 | pending (no result file yet) |" in report.sweep_answer(ctx,
                                                                                             "cpu-long")
    data, draw = ans.tradeoff_plot(ctx)
    (point,) = [p for p in data["points"] if p["label"] == "int8 two-shot"]
    assert point["status"] == "pending" and point["mean"] is None
    assert "its quality: pending (0 paired seeds)" in ans.answer_long(ctx)
    png.save_png(draw(), str(tmp_path / "a.png"), data)  # it draws

    # one seed of it: still pending (no interval), said so
    fake_results(root, "cpu-long", seeds=(1337,))
    ctx = report.Results(root=root, say=lambda *a: None)
    assert ("| shrink | int8 two-shot | +0.000 (1 of 10) | — | pending (1 of 10 paired seeds) "
            "|" in ans.answer_details(ctx))

    # two seeds: no interval read (one degree of freedom), no family-wise one, pending in the figure too
    fake_results(root, "cpu-long", seeds=(1337, 1338))
    ctx = report.Results(root=root, say=lambda *a: None)
    table = ans.answer_details(ctx)
    assert ("| shrink | int8 two-shot | +0.000 (2 of 10) | — | pending (2 of 10 paired seeds) "
            "|" in table), table
    (point,) = [p for p in ans.tradeoff_plot(ctx)[0]["points"] if p["label"] == "int8 two-shot"]
    assert point["status"] == "pending" and point["seeds"] == 2

    # five: an interval could be read, but the row is short of its planned 10 seeds: pending until they are in
    for path in runs.glob("all-tp-int8-2shot-seed*.json"):
        path.unlink()
    fake_results(root, "cpu-long", seeds=(1337, 1338, 1339, 1340, 1341))
    for path in runs.glob("all-tp-int8-2shot-seed134[2-9].json"):
        path.unlink()
    ctx = report.Results(root=root, say=lambda *a: None)
    assert "| shrink | int8 two-shot | +0.000 (5 of 10) | — | pending (5 of 10 paired seeds) |" in \
        ans.answer_details(ctx)
    assert "| shrink | int8 two-shot | +0.000 (5 of 10) | pending |" in ans.answer_table(ctx)


def test_a_seed_the_baseline_lacks_is_not_counted_as_paired(tmp_path, fake_long):
    """While all tp has not finished a seed another pattern has, the answer's seeds cell says how many seeds
    its interval is over, and the results table's gap pairs seeds as the interval does."""
    shutil.copytree(fake_long, tmp_path, dirs_exist_ok=True)
    runs = tmp_path / "experiments" / "cpu-long" / "runs"
    n_spd = len(list(runs.glob("all-spd-seed*.json")))
    last = max(runs.glob("all-tp-seed*.json"))
    last.unlink()
    ctx = report.Results(root=str(tmp_path), say=lambda *a: None)
    row = next(line for line in report.sweep_answer(ctx, "cpu-long").splitlines()
               if line.startswith("| `['spd']*12`"))
    assert f"| {n_spd - 1} paired of {n_spd} |" in row, row
    rows = ctx.rows("cpu-long")
    spd = next(r for r in rows if r["config"] == "all-spd")
    assert spd["gap_to_baseline"] == pytest.approx(pairing.paired(rows)["all-spd"]["final"][0], abs=1e-12)


def test_the_figure_marks_the_ways_that_keep_the_math(fake_long):
    """Hiding (tp_overlap, sequence parallelism) is 0 by construction and drawn so; every way in the
    figure has both networks' speedups; a changed cost-model number changes the figure's digest
    (report --check sees it)."""
    ctx = report.Results(root=str(fake_long), say=lambda *a: None)
    data, _ = ans.tradeoff_plot(ctx)
    status = {p["label"]: p["status"] for p in data["points"]}
    assert status["tp_overlap=2"] == status["sequence parallelism"] == "same math"
    assert status["all spd"] == status["int8"] == status["all ladder"] == "measured"
    assert {p["way"] for p in data["points"]} == {"drop", "hide", "delay", "shrink", "drop + shrink"}
    assert all(len(p["speedup"]) == 2 for p in data["points"])
    moved = dict(data, points=[dict(p, speedup=[s * 1.01 for s in p["speedup"]]) for p in data["points"]])
    assert png.data_digest(moved) != png.data_digest(data)
    assert "docs/answer_tradeoff.png" in report.plot_specs()


# ---------- the README's shape ----------

def readme_lines():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read().split("\n")


def test_readme_leads_with_the_answer_then_the_quickstart():
    """The first screen: the question in one sentence, the answer in 3-5 plain sentences (none over ~40 words,
    no nested parentheses), the figure, one compact table, and the quickstart (set-up, prepare, a minute of
    training, sample, make experiment, make test) within the first 60 lines; the README at most 200 lines."""
    lines = readme_lines()
    assert len(lines) <= 201, f"README.md has {len(lines)} lines (at most 200)"
    heads = [(i + 1, line) for i, line in enumerate(lines) if line.startswith("## ")]
    names = [h for _, h in heads]
    assert names[:4] == ["## The answer", "## Quickstart", "## On GPUs", "## The tools"], names
    at = dict((h, i) for i, h in heads)
    question = " ".join(lines[1:at["## The answer"] - 1]).strip()
    assert len(re.findall(r"[.!?](?=\s|$)", question)) == 1, question
    answer = "\n".join(lines[at["## The answer"]:at["## Quickstart"] - 1])
    said = re.search(r"<!-- report:answer -->(.*?)<!-- /report:answer -->", answer, re.S).group(1).strip()
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z])", said)
    assert 3 <= len(sentences) <= 5, sentences
    for sentence in sentences:
        assert len(sentence.split()) <= 42, sentence
        assert not re.search(r"\([^()]*\(", sentence), f"nested parentheses: {sentence}"
    assert "](docs/answer_tradeoff.png)" in answer
    rows = [line for line in answer.split("\n") if line.startswith("| ") and not line.startswith("| way")]
    assert 0 < len(rows) <= 16 and answer.count("\n|---") == 1, rows
    assert "| way | what | quality cost [95%] (seeds) | over training | NVLink | InfiniBand |" in answer
    assert "(docs/answer.md)" in answer  # the fine print, linked from the table
    first = "\n".join(lines[:60])
    for step in ("make setup", "prepare.py", "train.py config/train_shakespeare_char_cpu.py", "sample.py",
                 "make experiment ", "make test "):
        assert step in first, f"{step!r} is not in the README's first 60 lines"
    for c in ("make experiment", "make test"):
        line = next(line for line in lines if line.startswith(c + " "))
        assert re.search(r"\d+ (s|min)\b", line), f"{c}: no time on its line"


def test_over_training_reads_where_the_sign_changes():
    """Each evaluation's side (its 95% interval against 0), a side counted once it holds at two evaluations in
    a row, the end read from the last evaluation."""
    def reading(sides, tokens_per_iter=1000):
        curve = [(0, 0.0, 0.01)] + [(250 * k, {"l": -0.05, "h": 0.05, "t": 0.0}[c], 0.01)
                                    for k, c in enumerate(sides, 1)]
        return pairing.over_training(curve, tokens_per_iter)

    assert reading("llttt") == "leads until 0.50M tokens"
    assert reading("llthh") == "leads until 0.50M tokens, costs from 1.00M"
    assert reading("tthhh") == "costs from 0.75M tokens"
    assert reading("hhhhh") == "costs throughout"
    assert reading("lllll") == "leads throughout"
    assert reading("ttlll") == "leads from 0.75M tokens"
    # a lone side is chance
    assert reading("ttttt") == reading("thttt") == reading("ltltt") == "tied throughout"
    assert reading("thhtt") == "costs until 0.75M tokens"
    assert reading("llttl") == "leads from 1.25M tokens"  # the end's own side, though the lead lapsed
    assert pairing.over_training([(0, 0.0, None)], 1000) == "n/a"


def test_the_readme_does_not_claim_the_exposed_invariant_or_a_cpu_build():
    """Two contradictions whose code others own: the README states neither until it is true."""
    text = "\n".join(readme_lines())
    assert "upper bound of what a GPU" not in text and "CPU build)" not in text
    assert "part of the time in collectives" not in text and "within 7%" not in text


def test_the_sentences_follow_the_intervals(fake_long):
    """Where every interval excludes 0 there is no bound to state: the first
    sentence names each cost instead."""
    ctx = report.Results(root=str(fake_long), say=lambda *a: None)
    first = ans.answer_long(ctx).split(". On GPUs")[0]
    assert first.startswith("After 3.84M tokens the per-row 95% intervals rule out costs above ")
    assert "of all `tp`'s validation loss (" in first
    assert re.search(r"all `parallel` costs \+0\.017\d? \[", first) and re.search(r"all `ladder` costs "
                                                                                  r"\+0\.002\d? \[", first)
    pen, base = ans._long_penalties(ctx)
    narrow = {k: (abs(m) + 0.01, 0.001, n) for k, (m, c, n) in pen.items() if c is not None}  # all above 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ans, "_long_penalties", lambda ctx: (narrow, base))
        first = ans.answer_long(ctx).split(". On GPUs")[0]
    assert first.startswith("After 3.84M tokens, at 95%: all `spd` costs +0.0130 "
                            "[") and "rule out" not in first


def test_the_time_side_is_a_band_and_holds_at_both_ends(fake_long):
    """Each speedup cell prints the point and [low, high] over the declared ranges (the point
    inside), the collective-matmul row is the strongest hide, and the time sentences give ms saved a
    micro-step with where each comparison holds, not ratios of (speedup - 1)."""
    import re

    from tpcomm.costmodel import cost_bands

    ctx = report.Results(root=str(fake_long), say=lambda *a: None)
    table = ans.answer_details(ctx)
    row = next(line for line in table.splitlines() if "collective matmul" in line)
    cells = re.findall(r"(\d+\.\d\d)x \[(\d+\.\d\d), (\d+\.\d\d)\]", row)
    assert len(cells) == 2 and all(float(lo) <= float(x) <= float(hi) for x, lo, hi in cells), row
    summary = ans.answer_long(ctx)
    assert "recovers" not in summary and "ms a micro-step saved" in summary
    assert "dropping beats hiding them" in summary and " ms" in summary
    lo, hi = cost_bands.step_saved_ms("nvlink", "all-spd")
    assert f"dropping half of them (all `spd`) {lo:+.1f} to {hi:+.1f} ms" in summary
    # a band's end near 0 keeps its sign and size: -0.02
    assert "-0.0 " not in summary and "+0.0 " not in summary
    assert ans._ms((-0.0248, 5.3)) == "-0.02 to +5.3 ms" and ans._ms((0.0, 0.04)) == "+0.0 to +0.04 ms"
    data, _ = ans.tradeoff_plot(ctx)
    assert all(len(p["speedup_band"]) == 2
               and p["speedup_band"][0][0] <= p["speedup"][0] <= p["speedup_band"][0][1]
               for p in data["points"])
