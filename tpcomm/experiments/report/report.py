"""
`python experiment.py report [SWEEP ...] [--check]`: the README's and docs' result tables and plots,
regenerated from the committed result files alone (experiments/<sweep>/runs/*.json; no run directory needed).

A table lives in a markdown file (README.md, docs/*.md) between two markers:

    <!-- report:NAME -->
    (generated: `report` replaces everything between the markers)
    <!-- /report:NAME -->

NAME is a key of blocks(): `<sweep>` (its results table), `<sweep>-paired` (paired differences to the
baseline, 95% CIs), `<sweep>-answer` (each pattern's claim at 95%, claim(); pending for a run without files),
the axes tables (tp-axis-penalty, tp-axis-alltp, size-axis-penalty, axes-compute), `<axes sweep>-provenance`
(each row's commits, the rerun checks and the rows mixing code states or from dirty trees:
tpcomm/experiments/provenance.py), `answer-table` and `answer` (the README's answer: each way of giving up a
sync, its quality cost at 95% and its predicted GPU speedup from tpcomm/costmodel/cost_model.py, called in
tpcomm/experiments/report/answer.py's gpu_speedups() alone; the figure docs/answer_tradeoff.png draws the
same). A plot is a PNG in docs/ (plot_specs()) whose metadata holds the sha256 of the numbers it shows
(png.save_png). `report` also rewrites each sweep's own outputs (experiments/<sweep>/results.md ...). `report
--check` regenerates everything in memory and exits 0 only when every marked table equals the generated one
and every plot's stored digest equals the generated data's; otherwise it prints one line per mismatch and
exits 1. A sweep without result files gets a note in place of its tables, and no plot. A figure a measuring
command draws (tpcomm/figures/command_figures.py) is checked against the data file it wrote beside it, and
redrawn from it; every PNG in docs/ must be one of these two kinds with its digest, so a hand-made,
unregistered or data-less figure fails the check.
"""

import glob
import os
import re
import statistics

from tpcomm import ROOT
from tpcomm.figures import command_figures, png
from tpcomm.experiments.report import doc_figures
from tpcomm.experiments import pairing, plots, results
from tpcomm.experiments import sweep as sweeps
from tpcomm.experiments import sweep_plan, sweep_records
from tpcomm.experiments.report.answer import (answer_details, answer_long, answer_summary, answer_table,
                                             tradeoff_plot)
from tpcomm.experiments.report.layout import layout_page
from tpcomm.experiments.provenance import provenance_markdown
from tpcomm.experiments.readings import (claim, comm_dtype_label, data_warning, interval_cell, no_results,
                                         pattern_name, penalties)
from tpcomm.experiments.report.scale_report import PLOT as SCALE_PLOT, scale_axis, scale_plot
from tpcomm.experiments.result_check import stray_files

MARKER = re.compile(r"<!-- report:([\w.-]+) -->(.*?)<!-- /report:\1 -->", re.S)
OPENING = re.compile(r"<!-- report:([\w.-]+) -->")
AXES = ("cpu-long", "tp-axis", "size-axis", "convergence")


class Results:
    """The rows (results.summarize) of each sweep's result files, loaded once; a stale file (its config is no
    longer the sweep's) is left out, said once."""

    def __init__(self, *, root=ROOT, say=print):
        self._rows, self._planned, self.root, self.say = {}, {}, root, say

    def jobs(self, name, *, seeds=None):
        """The sweep's jobs for the seeds of its result files (or the given ones), paths anchored at the repo
        root; planned once per report (the tables, the plan check and the stray-file check each ask)."""
        key = (name, None if seeds is None else tuple(seeds))
        if key not in self._planned:
            self._planned[key] = self._plan(name, seeds)
        return list(self._planned[key])

    def _plan(self, name, seeds):
        runs = sweep_plan.SWEEPS[name]
        sweep_dir = sweeps.sweep_dir_for(name, ())
        homes = sweeps.homes_of(runs, ())
        if seeds is None:
            seeds = sorted({int(m.group(1)) for d in {sweep_dir, *homes.values()}
                            for f in glob.glob(os.path.join(self.root, d, "runs", "*.json"))
                            for m in [re.search(r"-seed(\d+)\.json$", f)] if m})
        # planned from the repo-relative directories the runner uses, so the configs (out_dir) are the
        # recorded ones
        jobs = sweeps.plan(runs, sweep_dir=sweep_dir, seeds=seeds, sweep=name, homes=homes, check_data=False)
        for j in jobs:
            j.result_path = os.path.join(self.root, j.result_path)
        return jobs

    def rows(self, name):
        if name not in self._rows:
            jobs = self.jobs(name)
            self._rows[name], _ = sweep_records.rows_of(jobs, say=self.say) if jobs else ([], [])
        return self._rows[name]


def source_line(name, rows):
    n = sum(r["n_seeds"] for r in rows)
    seeds = sorted({s for r in rows for s in r["seeds"]})
    return (f"From {n} result files of `{name}` (seeds {', '.join(map(str, seeds))}), by `python "
            "experiment.py report`.")


def sweep_table(ctx, name):
    rows = ctx.rows(name)
    if not rows:
        return no_results(name)
    return data_warning(rows) + source_line(name, rows) + "\n\n" + results.markdown_table(rows)


PAIRED_IMAGES = {"cpu-long": "docs/cpu_long_paired_difference.png",
                 "convergence": "docs/convergence_paired_difference.png"}  # also in plot_specs()


def sweep_paired(ctx, name):
    rows = ctx.rows(name)
    if not rows:
        return no_results(name)
    if not pairing.has_pairs(rows):
        return (f"_`{name}`: no config shares 2+ seeds with its baseline yet; the paired comparison needs "
                "them._")
    image = f"\n\n![{name}: paired difference to the baseline during training]({PAIRED_IMAGES[name]})" \
        if name in PAIRED_IMAGES else ""
    return data_warning(rows) + pairing.paired_markdown(rows) + image


def seeds_cell(row, diff):
    """A row's seed count, and how many of them are paired with the baseline where that is fewer ('5 paired of
    6': the interval is over the 5)."""
    if diff is None or len(diff["seeds"]) == row["n_seeds"]:
        return str(row["n_seeds"])
    return f"{len(diff['seeds'])} paired of {row['n_seeds']}"


def sweep_answer(ctx, name):
    """A sweep's compact quality table: per pattern its forward syncs, the mean final val loss, the paired
    difference to the all-tp baseline with its 95% interval (one seed: the difference alone), seeds counted,
    and what that says at 95% (claim())."""
    rows = ctx.rows(name)
    if not rows:
        return no_results(name)
    pairs = pairing.paired(rows)
    lines = [source_line(name, rows), "", "| pattern | fwd syncs | val loss (mean) | difference to all `tp` "
             "[95% CI] | seeds | at 95% it |", "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        diff = pairs.get(r["config"])
        cell = "baseline" if r["config"] == r["baseline"] else "—" if diff is None else \
            pairing.fmt_ci(*diff["final"][:2])
        base_loss = next(b["val_loss_mean"] for b in rows if b["config"] == r["baseline"])
        reading = "" if r["config"] == r["baseline"] else \
            claim(None if diff is None else (*diff["final"][:2], len(diff["seeds"])), base_loss)
        note = " (delayed)" if r.get("delayed") else ""
        note += f" ({comm_dtype_label(r)})" if r.get("tp_comm_dtype") else ""
        lines.append(f"| `{r['block_pattern']}` | {r['fwd_allreduces']}{note} | {r['val_loss_mean']:.4f} | "
                     f"{cell} | {seeds_cell(r, diff)} | {reading} |")
    have = {r["config"] for r in rows}
    lines += [f"| {run.name} | — | — | — | 0 | pending (no result file yet) "
              "|" for run in sweep_plan.SWEEPS[name] if run.name not in have]
    return data_warning(rows) + "\n".join(lines)


# ---------- the axes (docs/axes.md) ----------


def tp_axis_penalty(ctx):
    rows = ctx.rows("tp-axis")
    pen = penalties(rows)
    if not pen:
        return no_results("tp-axis", "cpu-long")
    tps = sorted({tp for _, tp, _ in pen})
    base = next(r for r in rows if r["config"] == r["baseline"])
    lines = [f"Final val loss minus the all-`tp` baseline's (tp {base['tp_size']}, {base['n_seeds']} seeds: "
             f"{base['val_loss_mean']:.4f} ± {base['val_loss_std']:.4f}), same seed, at "
             f"{base['tokens']:,} tokens; mean [95% CI] (seeds). All-`tp` is the same model at every tp "
             "degree, up to fp32 rounding (table " f"`tp-axis-alltp`).", "", "| block pattern | fwd "
             "all-reduces | " + " | ".join(f"tp {tp}" for tp in tps) + " |",
             "|---|---:|" + "---:|" * len(tps)]
    for name in [p for p in sweep_plan.PATTERNS if any(k[0] == p for k in pen)]:
        r = next(r for r in rows if pattern_name(r) == name)
        lines.append(f"| `{r['block_pattern']}` | {r['fwd_allreduces']} | " + " | "
                     "".join(interval_cell(next((v for k, v in pen.items() if k[:2] == (name, tp)), None),
                                           empty="baseline"
                                           if (r["block_pattern"], tp) == (base["block_pattern"],
                                                                           base["tp_size"]) else "—")
                             for tp in tps) + " |")
    lines += ["", "![cost of dropping syncs vs tensor-parallel degree](docs/axes_penalty_vs_tp.png)"]
    return data_warning(rows) + "\n".join(lines)


ROUNDING = 1e-4  # nats/token: two curves within it agree up to fp32 rounding (an eval averages 50 batches)


def tp_axis_alltp(ctx):
    """All-tp at each tp degree against the tp-4 baseline, same seed: how long the val curves agree up
    to fp32 rounding, and how far apart they wander once rounding differences compound (as any two
    runs that sum in another order do), against the seed-to-seed spread. The step-level equality to
    GPT is proved by the tests."""
    rows = [r for r in ctx.rows("tp-axis") if pattern_name(r) == "all-tp"]
    ref = next((r for r in rows if r["config"] == r["baseline"]), None)
    if ref is None or len(rows) < 2:
        return no_results("tp-axis", "cpu-long")
    table, agreed, largest, final = [], [], 0.0, 0.0
    for r in sorted((r for r in rows if r is not ref), key=lambda r: r["tp_size"]):
        for seed, curve in zip(r["seeds"], r["curves"]):
            mine, theirs = (dict(curve), dict(ref["curves"][ref["seeds"].index(seed)]) if seed in ref["seeds"]
                            else {})
            shared = sorted(set(mine) & set(theirs))
            if not shared:
                continue
            diffs = [abs(mine[i] - theirs[i]) for i in shared]
            same = next((k for k, d in enumerate(diffs) if d > ROUNDING), len(shared))  # first eval apart
            through = shared[same - 1] if same else None
            agreed.append(through)
            largest, final = max(largest, max(diffs)), max(final, diffs[-1])
            table.append(f"| {r['tp_size']} | {seed} | {mine[shared[-1]]:.6f} | "
                         f"{mine[shared[-1]] - theirs[shared[-1]]:+.1e} | {diffs[0]:.0e} | "
                         f"{'—' if through is None else f'{through:,}'} | {max(diffs):.1e} |")
    spread = ref["val_loss_std"]
    # a degree apart from the first eval on: not the same model
    first = None if None in agreed else min(agreed)
    if first is None:
        verdict = "a degree's curve differs from the first eval on: NOT the same model"
    else:
        verdict = (f"the curves agree within {ROUNDING:.0e} through iter {first:,} at least, then fp32 "
                   "rounding " f"differences compound (each degree sums its shards in another order) and the "
                   "curves wander up " f"to {largest:.1e} apart, {final:.1e} at the end: "
                   f"{largest / spread:.2f} and {final / spread:.2f} of the seed-to-seed std of the "
                   f"final loss ({spread:.4f}), " + ("noise the paired intervals already carry: one baseline "
                                                     "serves every degree" if final < spread else "NOT small "
                                                     "beside the seed spread"))
    return "\n".join([f"The all-`tp` model at each tp degree against tp {ref['tp_size']}, same seed (same "
                      "initial weights, same " f"batches): {verdict}. That the models are the same step by "
                      "step is proved by the tests " f"(docs/tests.md); this table shows how far rounding "
                      "alone carries two such runs apart.", "", f"| tp | seed | final val loss | final "
                      f"difference to tp {ref['tp_size']} | difference at iter 0 | within {ROUNDING:.0e} "
                      "through iter | largest abs difference |", "|---:|---:|---:|---:|---:|---:|---:|",
                      *table])


def size_axis_penalty(ctx):
    rows = ctx.rows("size-axis")
    pen = penalties(rows)
    if not pen:
        return no_results("size-axis", "cpu-long")
    patterns = [p for p in sweep_plan.PATTERNS if any(k[0] == p for k in pen)]
    lines = ["Final val loss minus the all-`tp` baseline's of the same size, same seed; mean [95% CI] "
             "(seeds). Tokens per non-embedding parameter fixed (docs/axes.md, the size axis); epochs "
             "over the training data's train.bin.", "", "| model (layers x width, heads) | non-embedding "
             "params | params | steps | tokens | tokens/param | epochs | all-tp final val loss | " + " | "
             "".join(f"{p} − all-tp" for p in patterns) + " |", "|---|---:|---:|---:|---:|---:|---:|---:|"
             + "---:|" * len(patterns)]
    bases = sorted((r for r in rows if r["config"] == r["baseline"]),
                   key=lambda r: -(r["params_non_embedding"] or 0))
    for b in bases:
        n = b["params_non_embedding"]
        lines.append(f"| {b['n_layer']} x {b['n_embd']}, {b['n_head']} heads | {results.fmt(n, ',d')} | "
                     f"{results.fmt(b['params_total'], ',d')} | {b['final_iter']:,} | {b['tokens']:,} | "
                     f"{results.fmt(b['tokens'] / n if n else None, '.2f')} | "
                     f"{results.fmt(b['epochs'], '.3f')} | {b['val_loss_mean']:.4f} | " + " | "
                     "".join(interval_cell(pen.get((p, b["tp_size"], results.group_key(b))))
                             for p in patterns) + " |")
    lines += ["", "![cost of dropping syncs vs model size](docs/axes_penalty_vs_size.png)"]
    return data_warning(rows) + "\n".join(lines)


def axes_compute(ctx):
    lines = ["| sweep | runs (own + shared) | with a result file | wall hours of its own finished runs | "
             "ms/step, median (range over runs) | runs flagged scattered |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in AXES:
        planned = ctx.jobs(name, seeds=list(sweep_plan.SWEEP_SEEDS[name]))
        own = [j for j in planned if j.sweep == name]
        recs = [r for j in planned for r in [sweep_records.load_result(j, say=lambda *_: None)] if r]
        mine = [r for r in recs if r["sweep"] == name]
        ms = sorted(r["timing"]["step_ms"] for r in recs if r["timing"].get("step_ms"))
        hours = sum(r["timing"].get("wall_s") or 0 for r in mine) / 3600
        span = f"{statistics.median(ms):.1f} ({ms[0]:.1f}–{ms[-1]:.1f})" if ms else "—"
        lines.append(f"| `{name}` | {len(own)} + {len(planned) - len(own)} | {len(recs)} | {hours:.2f} | "
                     f"{span} | {sum(1 for r in recs if r['timing'].get('scattered'))} |")
    return "\n".join(lines)


def penalty_data(pen, *, x_of):
    """One series per pattern (all-tp, the baseline, left out), points [x, mean, ci, seeds] by x."""
    names = [p for p in sweep_plan.PATTERNS if p != "all-tp"] + sorted({k[0] for k in pen}
                                                                       - set(sweep_plan.PATTERNS))
    return [dict(label=name, points=sorted([x_of(k), mean, ci or 0.0, n] for k,
                                           (mean, ci, n) in pen.items() if k[0] == name)) for name in names
            if any(k[0] == name for k in pen)]


def penalty_vs_tp(ctx):
    pen = penalties(ctx.rows("tp-axis"))
    if not pen:
        return None
    data = penalty_data(pen, x_of=lambda k: k[1])
    title = "tp-axis: cost of dropping syncs vs tensor-parallel degree (12 x 64 model, 3.84M tokens)"
    return data, lambda: plots.draw_penalty(data, xlabel="tensor-parallel degree (shards per layer, "
                                            "simulated)", title=title, xticks=sorted({p[0] for s in data
                                                                                      for p in s["points"]}))


def penalty_vs_size(ctx):
    rows = ctx.rows("size-axis")
    pen = penalties(rows)
    if not pen:
        return None
    params = {results.group_key(r): r["params_non_embedding"] for r in rows}
    data = penalty_data(pen, x_of=lambda k: params[k[2]])
    tokens = {params[k]: k[3] for k in params}  # group_key's last field: a size's tokens grow with it
    xticks = sorted({p[0] for s in data for p in s["points"]})
    title = "size-axis: cost of dropping syncs at three model sizes (tp 4; the tokens grow with the size)"
    return data, lambda: plots.draw_penalty(data, xlabel="non-embedding parameters (and the tokens that size "
                                            "trains on)", title=title, xticks=xticks,
                                            xticklabels=[f"{x:,}\n{tokens[x] / 1e6:.2f}M "
                                                         "tokens" for x in xticks])


def sweep_plot(name, index):
    def spec(ctx):
        made = plots.sweep_plots(ctx.rows(name), title=f"{name} sweep",
                                 note=sweep_plan.SWEEP_REMARKS.get(name, ""))
        return made.get(plots.PLOTS[index])
    return spec


def paired_plot_spec(name):
    def spec(ctx):
        rows = ctx.rows(name)
        return plots.paired_plot(rows, title=f"{name} sweep") if rows and pairing.has_pairs(rows) else None
    return spec


def blocks():
    """{marker name: (sweeps it reads, function(Results) -> markdown)}."""
    out = {}
    for name in sweep_plan.SWEEPS:
        out[name] = ((name,), lambda ctx, name=name: sweep_table(ctx, name))
        out[f"{name}-paired"] = ((name,), lambda ctx, name=name: sweep_paired(ctx, name))
        out[f"{name}-answer"] = ((name,), lambda ctx, name=name: sweep_answer(ctx, name))
    for name in AXES:
        out[f"{name}-provenance"] = ((name,), lambda ctx, name=name: provenance_markdown(ctx, name))
    out["tp-axis-penalty"] = (("tp-axis", "cpu-long"), tp_axis_penalty)
    out["tp-axis-alltp"] = (("tp-axis", "cpu-long"), tp_axis_alltp)
    out["size-axis-penalty"] = (("size-axis", "cpu-long"), size_axis_penalty)
    out["axes-compute"] = (AXES, axes_compute)
    out["answer"] = (("cpu-long", "convergence"), answer_summary)
    out["answer-table"] = (("cpu-long",), answer_table)
    out["answer-details"] = (("cpu-long",), answer_details)  # docs/answer.md: the table's fine print
    out["answer-long"] = (("cpu-long", "convergence"), answer_long)
    out["gpu-scale-axis"] = (("gpu-scale",), scale_axis)  # tpcomm/experiments/report/scale_report.py
    out["layout"] = ((), layout_page)  # docs/layout.md, from the modules' docstrings (layout.py)
    return out


def plot_specs():
    """{PNG path under the repo root: (sweeps it reads, function(Results) -> (data,
    draw) or None: no data)}."""
    return {
        "docs/val_loss_vs_allreduces.png": (("cpu",), sweep_plot("cpu", 0)),
        "docs/val_loss_curves.png": (("cpu",), sweep_plot("cpu", 1)),
        "docs/tokens_per_s_vs_allreduces.png": (("cpu",), sweep_plot("cpu", 2)),
        "docs/cpu_real_tokens_per_s_vs_allreduces.png": (("cpu-real",), sweep_plot("cpu-real", 2)),
        "docs/cpu_long_paired_difference.png": (("cpu-long",), paired_plot_spec("cpu-long")),
        "docs/convergence_paired_difference.png": (("convergence",), paired_plot_spec("convergence")),
        "docs/axes_penalty_vs_tp.png": (("tp-axis", "cpu-long"), penalty_vs_tp),
        "docs/axes_penalty_vs_size.png": (("size-axis", "cpu-long"), penalty_vs_size),
        "docs/answer_tradeoff.png": (("cpu-long",), tradeoff_plot),
        SCALE_PLOT: (("gpu-scale",), scale_plot),
        "docs/cost_model_checks.png": ((), doc_figures.cost_checks_plot),
        "docs/parallel_reversal.png": (doc_figures.REVERSAL_SWEEPS, doc_figures.reversal_plot),
        **{png: ((), lambda ctx, png=png: command_figures.load(os.path.join(ctx.root, png)))
           for png in command_figures.COMMAND_PNGS},  # drawn by a command, from the data file beside the PNG
    }


def markdown_files(root=ROOT):
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


IMAGE_LINK = re.compile(r"\]\((docs/[^)\s]+\.png)\)")


def relink(content, md_dir, root):
    """Image paths written from the repo root (docs/x.png), made relative to the markdown file's folder."""
    return IMAGE_LINK.sub(lambda m: "](" + os.path.relpath(os.path.join(root, m.group(1)), md_dir) + ")",
                          content)


def update_blocks(text, generate, where, *, known):
    """(new text, names of the blocks that changed, problems): every marked block's content replaced by
    generate(name) (None: not selected, left as it is). Problems: unknown names, unclosed markers."""
    problems, changed = [], []
    starts = {m.start() for m in MARKER.finditer(text)}
    for m in OPENING.finditer(text):
        if m.start() not in starts:
            problems.append(f"{where}: <!-- report:{m.group(1)} --> has no <!-- /report:{m.group(1)} -->")

    def replace(m):
        name = m.group(1)
        if name not in known:
            problems.append(f"{where}: unknown report block {name!r} (tpcomm/experiments/report/report.py "
                            "blocks() lists them)")
            return m.group(0)
        content = generate(name)
        if content is None:
            return m.group(0)
        new = f"<!-- report:{name} -->\n{content.strip()}\n<!-- /report:{name} -->"
        if new != m.group(0):
            changed.append(name)
        return new

    return MARKER.sub(replace, text), changed, problems


def main(selected=(), *, check=False, root=ROOT, say=print):
    """Regenerate (with check: compare) the marked tables, the plots and the sweeps' own outputs;
    returns the exit status: 1 when check found a mismatch, or a marker is unknown or unclosed (each
    printed as one line), else 0."""
    # with check, a result file left out as stale is a mismatch: the tables it would change are wrong
    stale = []
    ctx = Results(root=root, say=stale.append if check else say)
    chosen = lambda deps: not selected or any(d in selected for d in deps)  # noqa: E731
    table_of, cache = blocks(), {}

    def generate(name):
        deps, fn = table_of[name]
        if not chosen(deps):
            return None
        if name not in cache:
            cache[name] = fn(ctx)
        return cache[name]

    problems, mismatches = [], []
    strays = stray_lines(ctx)
    if check:
        problems += strays
    for line in [] if check else strays:
        say(line)
    for path in markdown_files(root):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        md_dir = os.path.dirname(path)
        new, changed, bad = update_blocks(text, lambda name: None if generate(name) is None else
                                          relink(generate(name), md_dir, root), rel, known=table_of)
        problems += bad
        if check:
            mismatches += [f"{rel}: report:{name} differs from the result files" for name in changed]
        elif changed:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            say(f"updated {rel}: {', '.join(changed)}")
    mismatches += update_plots(ctx, chosen, check=check, root=root, say=say)
    if not check:
        write_sweep_outputs(ctx, selected or list(sweep_plan.SWEEPS), root=root, say=say)
    problems += sorted(set(stale))  # filled as the sweeps' rows were read
    for line in problems + mismatches:
        print(line)
    if check and not (problems or mismatches):
        files = {j.result_path for name in sweep_plan.SWEEPS for j in ctx.jobs(name)
                 if os.path.exists(os.path.join(root, j.result_path))}  # a shared run's file once
        print(f"report --check: every marked table and report figure equals what the {len(files)} result "
              "files give")
    return 1 if problems or mismatches else 0


def stray_lines(ctx):
    """One line per entry of the sweeps' runs/ folders that is no sweep's result file (another name, a seed no
    run has, a folder): the report leaves it out, and says so."""
    jobs = [j for name in sweep_plan.SWEEPS for j in ctx.jobs(name)]
    folders = {os.path.join(ctx.root, sweeps.sweep_dir_for(name, ()), "runs") for name in sweep_plan.SWEEPS}
    return [f"{os.path.relpath(p, ctx.root)}: not a result file of any sweep's run (its name); left out"
            for p in stray_files(folders, [j.result_path for j in jobs])]


def unregistered_pngs(root):
    """docs/*.png that neither the report nor a command's data file (plot_specs) accounts for: a figure whose
    staleness nothing can tell."""
    known = set(plot_specs())
    return sorted(rel for rel in (os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs",
                                                                                           "*.png")))
                  if rel not in known)


# (figure, data digest) of the command figures' data files that drew in this process: the same data draws the
# same
DRAWN = set()


def update_plots(ctx, chosen, *, check, root, say):
    """Write (with check: compare) the registered plots; returns the mismatch lines. With check, a
    committed figure that carries no data digest fails too: one not registered here, one whose result
    files are not committed, a command's figure without its data file; and a command's data file must
    draw (its figure is redrawn, not kept)."""
    mismatches = [f"{rel}: no data digest can be checked: not registered in "
                  "tpcomm/experiments/report/report.py plot_specs() (a command's figure: "
                  "tpcomm/figures/command_figures.py COMMAND_PNGS)" for rel in unregistered_pngs(root)]
    for line in [] if check else mismatches:
        say("note: " + line)
    mismatches = mismatches if check else []
    commands = set(command_figures.COMMAND_PNGS)
    for rel, (deps, spec) in plot_specs().items():
        if not chosen(deps):
            continue
        path = os.path.join(root, rel)
        stored, made = png.png_digest(path), spec(ctx)
        # no data: a plot made from data that is gone is stale; an older hand-made one is noted
        if made is None:
            if rel in commands and os.path.exists(path):
                line = (f"{rel}: has no data file ({os.path.basename(command_figures.data_path(rel))}) "
                        "beside it: draw it with the command its docs page shows")
                if check:
                    mismatches.append(line)
                else:
                    say("note: " + line)
            elif stored is not None:
                if check:
                    mismatches.append(f"{rel}: made from result files that are gone (no data for it now)")
                else:
                    os.remove(path)
                    say(f"removed {rel}: no result files for it")
            elif os.path.exists(path):
                if check:
                    mismatches.append(f"{rel}: carries no data digest and its result files are not committed")
                else:
                    say(f"note: {rel} was not made from result files (there are none yet); left as it is")
            continue
        data, draw = made
        digest = png.data_digest(data)
        # the data file must still draw (a hand-edited
        if check and rel in commands and (rel, digest) not in DRAWN:
            try:                                                       # one may not)
                png.pyplot().close(draw())
            except Exception as e:  # noqa: BLE001 - any failure to draw is the mismatch to report
                mismatches.append(f"{rel}: its data file does not draw ({type(e).__name__}: {e})")
                continue
            DRAWN.add((rel, digest))
        if stored == digest:
            continue
        if check:
            mismatches.append(f"{rel}: " + ("missing" if not os.path.exists(path) else
                                            "its data digest differs from the result files'" if stored else
                                            "has no data digest (not made by `python experiment.py report`)"))
        else:
            png.save_png(draw(), path, data, made_by=f"figure {data['kind']}" if rel in commands
                         else "report")
            say(f"wrote {rel}")
    return mismatches


def write_sweep_outputs(ctx, names, *, root, say):
    """Each sweep's own tables and plots (experiments/<sweep>/results.md ...) from its result files."""
    for name in names:
        rows = ctx.rows(name)
        if not rows:
            say(f"{name}: no result files yet, skipped")
            continue
        sweep_dir = os.path.join(root, sweeps.sweep_dir_for(name, ()))
        title = f"{name} sweep"
        results.write_tables(rows, sweep_dir, title=title, note=sweep_plan.SWEEP_REMARKS.get(name, ""))
        plots.write_plots(rows, sweep_dir, title=title, note=sweep_plan.SWEEP_REMARKS.get(name, ""))
        plots.write_paired(rows, sweep_dir, title=title)
        say(f"{name}: {len(rows)} configs; tables and plots in {os.path.relpath(sweep_dir, root)}")
