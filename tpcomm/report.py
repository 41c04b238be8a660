"""
`python experiment.py report [SWEEP ...] [--check]`: the README's and docs' result tables and plots, regenerated from
the committed result files alone (experiments/<sweep>/runs/*.json; no run directory needed).

A table lives in a markdown file (README.md, docs/*.md) between two markers:

    <!-- report:NAME -->
    (generated: `report` replaces everything between the markers)
    <!-- /report:NAME -->

NAME is a key of blocks(): `<sweep>` (its results table), `<sweep>-paired` (paired differences to the baseline, 95%
CIs), `<sweep>-answer` (each pattern's claim at 95%, claim(); pending for a run without files), the axes tables
(tp-axis-penalty, tp-axis-alltp, size-axis-penalty, axes-compute), `answer-table` and `answer` (the README's answer:
each way of giving up a sync, its quality cost at 95% and its predicted GPU speedup from tpcomm/cost_model.py,
called in gpu_speedups() alone; the figure docs/answer_tradeoff.png draws the same). A plot is a PNG in docs/
(plot_specs()) whose metadata holds the sha256 of the numbers it shows (plots.save_png). `report` also rewrites
each sweep's own outputs (experiments/<sweep>/results.md ...). `report --check` regenerates everything in memory and
exits 0 only when every marked table equals the generated one and every plot's stored digest equals the generated
data's; otherwise it prints one line per mismatch and exits 1. A sweep without result files gets a note in place of
its tables, and no plot.
"""

import glob
import os
import re
import statistics

from tpcomm import ROOT, plots, results
from tpcomm import sweep as sweeps

MARKER = re.compile(r"<!-- report:([\w.-]+) -->(.*?)<!-- /report:\1 -->", re.S)
OPENING = re.compile(r"<!-- report:([\w.-]+) -->")
AXES = ("cpu-long", "tp-axis", "size-axis", "convergence")


class Results:
    """The rows (results.summarize) of each sweep's result files, loaded once; a stale file (its config is no longer
    the sweep's) is left out, said once."""

    def __init__(self, *, root=ROOT, say=print):
        self._rows, self._jobs, self.root, self.say = {}, {}, root, say

    def jobs(self, name, *, seeds=None):
        """The sweep's jobs for the seeds of its result files (or the given ones), paths anchored at the repo root."""
        runs = sweeps.SWEEPS[name]
        sweep_dir = sweeps.sweep_dir_for(name, ())
        homes = sweeps.homes_of(runs, ())
        if seeds is None:
            seeds = sorted({int(m.group(1)) for d in {sweep_dir, *homes.values()}
                            for f in glob.glob(os.path.join(self.root, d, "runs", "*.json"))
                            for m in [re.search(r"-seed(\d+)\.json$", f)] if m})
        # planned from the repo-relative directories the runner uses, so the configs (out_dir) are the recorded ones
        jobs = sweeps.plan(runs, sweep_dir=sweep_dir, seeds=seeds, sweep=name, homes=homes, check_data=False)
        for j in jobs:
            j.result_path = os.path.join(self.root, j.result_path)
        return jobs

    def rows(self, name):
        if name not in self._rows:
            self._jobs[name] = self.jobs(name)
            self._rows[name], _ = sweeps.rows_of(self._jobs[name], say=self.say) if self._jobs[name] else ([], [])
        return self._rows[name]


def no_results(*names):
    return "_No result files yet for " + ", ".join(f"`{n}` (experiments/{n}/runs/)" for n in names) + \
        f": `python experiment.py {names[0]}` writes them, then `python experiment.py report`._"


def source_line(name, rows):
    n = sum(r["n_seeds"] for r in rows)
    seeds = sorted({s for r in rows for s in r["seeds"]})
    return f"From {n} result files of `{name}` (seeds {', '.join(map(str, seeds))}), by `python experiment.py report`."


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
    if not results.has_pairs(rows):
        return f"_`{name}`: no config shares 2+ seeds with its baseline yet; the paired comparison needs them._"
    image = f"\n\n![{name}: paired difference to the baseline during training]({PAIRED_IMAGES[name]})" \
        if name in PAIRED_IMAGES else ""
    return data_warning(rows) + results.paired_markdown(rows) + image


def sweep_answer(ctx, name):
    """A sweep's compact quality table: per pattern its forward syncs, the mean final val loss, the paired
    difference to the all-tp baseline with its 95% interval (one seed: the difference alone), seeds counted, and
    what that says at 95% (claim())."""
    rows = ctx.rows(name)
    if not rows:
        return no_results(name)
    pairs = results.paired(rows)
    lines = [source_line(name, rows), "",
             "| pattern | fwd syncs | val loss (mean) | difference to all `tp` [95% CI] | seeds | at 95% it |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        diff = pairs.get(r["config"])
        cell = "baseline" if r["config"] == r["baseline"] else "—" if diff is None else \
            results.fmt_ci(*diff["final"][:2])
        base_loss = next(b["val_loss_mean"] for b in rows if b["config"] == r["baseline"])
        reading = "" if r["config"] == r["baseline"] else \
            claim(None if diff is None else (*diff["final"][:2], len(diff["seeds"])), base_loss)
        note = " (delayed)" if "ladder" in r["block_pattern"] else ""
        note += f" ({comm_dtype_label(r)})" if r.get("tp_comm_dtype") else ""
        lines.append(f"| `{r['block_pattern']}` | {r['fwd_allreduces']}{note} | {r['val_loss_mean']:.4f} | "
                     f"{cell} | {r['n_seeds']} | {reading} |")
    have = {r["config"] for r in rows}
    lines += [f"| {run.name} | — | — | — | 0 | pending (no result file yet) |" for run in sweeps.SWEEPS[name]
              if run.name not in have]
    return data_warning(rows) + "\n".join(lines)


def side_of(mean, ci):
    """'worse' / 'better' than the baseline when the 95% interval mean ± ci excludes 0, else None."""
    if ci is None or abs(mean) <= ci:
        return None
    return "worse" if mean > 0 else "better"


def data_warning(rows):
    """A line when the runs of a table trained on different data (prepare.py's source sha256 differs)."""
    shas = {s for r in rows for s in r["data_sha256"]}
    return f"**Warning: these runs trained on {len(shas)} different datasets (source.json sha256).**\n\n" \
        if len(shas) > 1 else ""


# ---------- the axes (docs/axes.md) ----------

def pattern_name(row):
    """The sweeps.PATTERNS name of a row's block pattern (e.g. 'all-spd'), or the pattern itself; '-int8' etc.
    after it when its syncs were compressed."""
    name = next((p for p, f in sweeps.PATTERNS.items() if results.compact_list(f(row["n_layer"])) ==
                 row["block_pattern"]), row["block_pattern"])
    return name + (f"-{comm_dtype_label(row).replace(' ', '-')}" if row.get("tp_comm_dtype") else "")


def comm_dtype_label(row):
    """'int8', or 'int8 2shot' for a row whose compressed reductions used the two_shot exchange."""
    return row["tp_comm_dtype"] + (" 2shot" if row.get("tp_comm_exchange") == "two_shot" else "")


def penalties(rows):
    """{(pattern name, tp, size key): (mean, ci, n seeds)} of the final paired difference to the all-tp baseline."""
    pairs = results.paired(rows)
    return {(pattern_name(r), r["tp_size"], results.group_key(r)): (*pairs[r["config"]]["final"][:2],
                                                                    len(pairs[r["config"]]["seeds"]))
            for r in rows if r["config"] in pairs and r["config"] != r["baseline"]}


def _cell(p, *, empty="—"):
    return empty if p is None else f"{results.fmt_ci(p[0], p[1])} ({p[2]})"


def tp_axis_penalty(ctx):
    rows = ctx.rows("tp-axis")
    pen = penalties(rows)
    if not pen:
        return no_results("tp-axis", "cpu-long")
    tps = sorted({tp for _, tp, _ in pen})
    base = next(r for r in rows if r["config"] == r["baseline"])
    lines = [f"Final val loss minus the all-`tp` baseline's (tp {base['tp_size']}, {base['n_seeds']} seeds: "
             f"{base['val_loss_mean']:.4f} ± {base['val_loss_std']:.4f}), same seed, at {base['tokens']:,} tokens; "
             f"mean [95% CI] (seeds). All-`tp` is the same model at every tp degree, up to fp32 rounding (table "
             f"`tp-axis-alltp`).", "",
             "| block pattern | fwd all-reduces | " + " | ".join(f"tp {tp}" for tp in tps) + " |",
             "|---|---:|" + "---:|" * len(tps)]
    for name in [p for p in sweeps.PATTERNS if any(k[0] == p for k in pen)]:
        r = next(r for r in rows if pattern_name(r) == name)
        lines.append(f"| `{r['block_pattern']}` | {r['fwd_allreduces']} | " +
                     " | ".join(_cell(next((v for k, v in pen.items() if k[:2] == (name, tp)), None),
                                      empty="baseline" if (r["block_pattern"], tp) == (base["block_pattern"],
                                                                                       base["tp_size"]) else "—")
                                for tp in tps)
                     + " |")
    lines += ["", "![cost of dropping syncs vs tensor-parallel degree](docs/axes_penalty_vs_tp.png)"]
    return data_warning(rows) + "\n".join(lines)


ROUNDING = 1e-4  # nats/token: two curves within it agree up to fp32 rounding (an eval averages 50 batches)


def tp_axis_alltp(ctx):
    """All-tp at each tp degree against the tp-4 baseline, same seed: how long the val curves agree up to fp32
    rounding, and how far apart they wander once rounding differences compound (as any two runs that sum in another
    order do), against the seed-to-seed spread. The step-level equality to GPT is proved by the tests."""
    rows = [r for r in ctx.rows("tp-axis") if pattern_name(r) == "all-tp"]
    ref = next((r for r in rows if r["config"] == r["baseline"]), None)
    if ref is None or len(rows) < 2:
        return no_results("tp-axis", "cpu-long")
    table, agreed, largest, final = [], [], 0.0, 0.0
    for r in sorted((r for r in rows if r is not ref), key=lambda r: r["tp_size"]):
        for seed, curve in zip(r["seeds"], r["curves"]):
            mine, theirs = dict(curve), dict(ref["curves"][ref["seeds"].index(seed)]) if seed in ref["seeds"] else {}
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
    first = None if None in agreed else min(agreed)  # a degree apart from the first eval on: not the same model
    if first is None:
        verdict = "a degree's curve differs from the first eval on: NOT the same model"
    else:
        verdict = (f"the curves agree within {ROUNDING:.0e} through iter {first:,} at least, then fp32 rounding "
                   f"differences compound (each degree sums its shards in another order) and the curves wander up "
                   f"to {largest:.1e} apart, {final:.1e} at the end: {largest / spread:.2f} and {final / spread:.2f} "
                   f"of the seed-to-seed std of the final loss ({spread:.4f}), " +
                   ("noise the paired intervals already carry: one baseline serves every degree" if final < spread
                    else "NOT small beside the seed spread"))
    return "\n".join([
        f"The all-`tp` model at each tp degree against tp {ref['tp_size']}, same seed (same initial weights, same "
        f"batches): {verdict}. That the models are the same step by step is proved by the tests "
        f"(docs/tests.md); this table shows how far rounding alone carries two such runs apart.", "",
        f"| tp | seed | final val loss | final difference to tp {ref['tp_size']} | difference at iter 0 | within "
        f"{ROUNDING:.0e} through iter | largest abs difference |", "|---:|---:|---:|---:|---:|---:|---:|", *table])


def size_axis_penalty(ctx):
    rows = ctx.rows("size-axis")
    pen = penalties(rows)
    if not pen:
        return no_results("size-axis", "cpu-long")
    patterns = [p for p in sweeps.PATTERNS if any(k[0] == p for k in pen)]
    lines = ["Final val loss minus the all-`tp` baseline's of the same size, same seed; mean [95% CI] (seeds). "
             "Tokens per non-embedding parameter fixed (docs/axes.md, the size axis); epochs over the training "
             "data's train.bin.", "",
             "| model (layers x width, heads) | non-embedding params | params | steps | tokens | tokens/param | epochs "
             "| all-tp final val loss | " + " | ".join(f"{p} − all-tp" for p in patterns) + " |",
             "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(patterns)]
    bases = sorted((r for r in rows if r["config"] == r["baseline"]), key=lambda r: -(r["params_non_embedding"] or 0))
    for b in bases:
        n = b["params_non_embedding"]
        lines.append(f"| {b['n_layer']} x {b['n_embd']}, {b['n_head']} heads | {results.fmt(n, ',d')} | "
                     f"{results.fmt(b['params_total'], ',d')} | {b['final_iter']:,} | {b['tokens']:,} | "
                     f"{results.fmt(b['tokens'] / n if n else None, '.2f')} | {results.fmt(b['epochs'], '.3f')} | "
                     f"{b['val_loss_mean']:.4f} | " +
                     " | ".join(_cell(pen.get((p, b["tp_size"], results.group_key(b)))) for p in patterns) + " |")
    lines += ["", "![cost of dropping syncs vs model size](docs/axes_penalty_vs_size.png)"]
    return data_warning(rows) + "\n".join(lines)


# ---------- the answer: each way of giving up a sync, its quality cost at 95% and its predicted GPU speedup ----------

ANSWER_LABELS = {"all-spd": "all `spd`", "parallel-spd": "`['parallel','spd']*6`", "all-parallel": "all `parallel`",
                 "all-ladder": "all `ladder`", "ladder-upper": "`ladder` in the upper half", "all-tp-bf16": "bf16",
                 "all-tp-fp8": "fp8", "all-tp-int8": "int8", "all-tp-int8-2shot": "int8 two-shot",
                 "all-spd-int8": "all `spd` + int8"}

# (way, what, cpu-long run name or None (the math is all tp's: 0 by construction), the GPU variant or None (not
# modelled)); the GPU variants are cost_model.predicted_speedups' names. One row per way of giving up a sync, in the
# README's table.
WAYS = (("drop", "all `spd`", "all-spd", "all-spd"),
        ("drop", "`['parallel','spd']*6`", "parallel-spd", "parallel-spd"),
        ("drop", "all `parallel`", "all-parallel", "all-parallel"),
        ("hide", "`tp_overlap=2`", None, "tp_overlap=2"),
        ("hide", "sequence parallelism", None, "sequence_parallel"),
        ("delay", "all `ladder`", "all-ladder", "all-ladder-fwd-only"),
        ("delay", "`ladder` in the upper half", "ladder-upper", None),
        ("shrink", "bf16", "all-tp-bf16", "all-tp-bf16"),
        ("shrink", "fp8", "all-tp-fp8", "all-tp-fp8"),
        ("shrink", "int8", "all-tp-int8", "all-tp-int8"),
        ("shrink", "int8 two-shot", "all-tp-int8-2shot", "all-tp-int8-2shot"),
        ("drop + shrink", "all `spd` + int8", "all-spd-int8", "all-spd-int8"))
GPU_SHAPE, GPU_TP, GPU_BASELINE = "1.3B", 8, "megatron"  # the answer's GPU case (cost_model.predicted_speedups)


def gpu_speedups():
    """{variant: {network: predicted training-step speedup over Megatron-LM's all-'tp' step}} for the answer's GPU
    case (the 1.3B shape at tp 8), the networks' names, a line saying what it assumes, and every published-figure
    check with its error. The only place the answer calls tpcomm/cost_model.py."""
    from tpcomm import cost_model as cm

    cfg = cm.PREDICT_DEFAULTS
    shape = cm.FIGURE_SHAPE
    by_link = {link.name: cm.predicted_speedups(link.name, GPU_BASELINE) for link in cm.LINKS}
    out = {}
    for name, speedups in by_link.items():
        for variant, x in speedups.items():
            out.setdefault(variant, {})[name] = x
    assumes = (f"{shape.name} at tp {GPU_TP} on H100 SXM, bf16 at MFU {cfg['mfu']:.0%}, {cfg['batch_size']} x "
               f"{cfg['seq_len']} tokens per tp group; links by assumed constants (" +
               ", ".join(f"{link.name.split(' (')[0]} {link.busbw / 1e9:.0f} GB/s, {link.alpha * 1e6:.0f} us" for link
                         in cm.LINKS) +
               f"); overlap at efficiency {cfg['efficiency']:g} (the compute beside a collective hides it one for "
               "one); the baseline is Megatron-LM's all-`tp` step, whose backward hides each input-gradient "
               "all-reduce behind its weight-gradient GEMM (docs/cost_model.md); `ladder` is priced with its forward "
               "all-reduces delayed and its backward ones hidden as Megatron's are (the repo's `tp_async_grad` "
               "also hides each MLP's backward all-reduce behind the attention's backward: between this and the "
               "cost model's all-delayed bound, docs/cost_model.md)")
    checks = [(what, end, cm.error(m, p)) for what, published, model in cm.published_checks(cfg, cm.options(cfg))
              for end, m, p in (zip(("low ", "high "), model, published) if isinstance(published, tuple)
                                else [("", model, published)])]
    return out, [link.name for link in cm.LINKS], assumes, checks


def claim(p, base_loss):
    """What a paired difference (mean, ci, seeds) says at 95%: where the interval holds 0, the largest cost it
    rules out ("costs at most +0.008 nats (0.5%)"); where it does not, the cost (or gain) with its interval; with
    fewer than 2 paired seeds, that it is pending."""
    if p is None or p[1] is None:
        return f"pending ({0 if p is None else p[2]} paired seed{'' if p and p[2] == 1 else 's'})"
    mean, ci, _ = p
    side = side_of(mean, ci)
    pct = lambda x: f"{100 * x / base_loss:.1f}%"  # noqa: E731
    if side is None:
        return f"costs at most {mean + ci:+.3f} nats ({pct(mean + ci)})"
    if side == "worse":
        return f"costs {mean:+.3f} [{mean - ci:+.3f}, {mean + ci:+.3f}] nats ({pct(mean)})"
    return f"gains {-mean:.3f} [{mean - ci:+.3f}, {mean + ci:+.3f}] nats ({pct(-mean)})"


def _short(p):
    """'+0.020 [-0.005, +0.044] (2)': a paired difference, its 95% interval and its seeds, in 3 decimals."""
    return f"{results.fmt_ci(p[0], p[1], 3)} ({p[2]})"


def _long_penalties(ctx):
    """(cpu-long's {run name: (mean, ci, seeds)}, its baseline row or None)."""
    rows = ctx.rows("cpu-long")
    base = next((r for r in rows if r["config"] == r["baseline"]), None)
    return {k[0]: v for k, v in penalties(rows).items()}, base


def answer_table(ctx):
    """The README's one table: every way of giving up a sync, its quality cost at 95% in cpu-long and its predicted
    GPU speedup."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return no_results("cpu-long")
    gpu, links, assumes, checks = gpu_speedups()
    lines = [f"Quality: final val loss minus all `tp`'s ({base['val_loss_mean']:.3f}, exactly GPT), paired seed by "
             f"seed, mean [95% interval] (seeds), after {base['tokens'] / 1e6:.2f}M tokens (`cpu-long`, "
             f"{sum(r['n_seeds'] for r in ctx.rows('cpu-long'))} result files); time: predicted step speedup over "
             f"Megatron-LM's all-`tp` step (its backward all-reduces hidden behind the weight-gradient GEMMs), "
             f"{GPU_SHAPE} at tp {GPU_TP} (docs/cost_model.md). Generated by `python "
             "experiment.py report`.", "",
             "| way | what | quality cost [95%] (seeds) | at 95% it | NVLink | InfiniBand |",
             "|---|---|---:|---|---:|---:|"]
    for way, what, run, variant in WAYS:
        p = pen.get(run)
        cost = "0 (same math)" if run is None else "pending" if p is None else _short(p)
        said = "costs nothing: the math is all `tp`'s" if run is None else claim(p, base["val_loss_mean"])
        times = [f"{gpu[variant][n]:.2f}x" if variant else "not modelled" for n in links]
        lines.append(f"| {way} | {what} | {cost} | {said} | " + " | ".join(times) + " |")
    errors = {}
    for what, end, err in checks:
        errors.setdefault(what.replace(" (range)", ""), []).append(f"{end}{err:+.1f}%")
    lines += ["", f"The prediction assumes {assumes}. Before it, the cost model is checked against every published "
              "figure it can be (docs/cost_model.md), each with its error: " +
              "; ".join(f"{what} {', '.join(e)}" for what, e in errors.items()) + "."]
    return data_warning(ctx.rows("cpu-long")) + "\n".join(lines)


def _share(part, whole):
    """How much of whole's saving part recovers, from their speedups: '81%' of (1.27x - 1)."""
    return f"{100 * (part - 1) / (whole - 1):.0f}%" if whole > 1 else "—"


def _pace(x):
    """A predicted speedup in words: within 2% of 1 is about even."""
    return f"gains {x:.2f}x" if x >= 1.02 else f"is slower ({x:.2f}x)" if x <= 0.98 else f"is about even ({x:.2f}x)"


def answer_summary(ctx):
    """The README's answer in four sentences (quality at 95%; hiding and delaying against dropping on each link;
    shrinking; 4x the training), every number from the result files (claim()) and the cost model
    (gpu_speedups())."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return no_results("cpu-long")
    loss = base["val_loss_mean"]
    gpu, links, _, _ = gpu_speedups()
    nv, ib = links
    measured = {n: p for n, p in pen.items() if p[1] is not None and n in ANSWER_LABELS}
    worse = [n for n, p in measured.items() if side_of(*p[:2]) is not None]  # a cost (or a gain) at 95%
    bounded = sorted((p[0] + p[1], n) for n, p in measured.items() if side_of(*p[:2]) is None)
    wide = [ANSWER_LABELS[n] for b, n in bounded if b > 0.01 * loss]
    costs = "; ".join(f"{ANSWER_LABELS[n]} {claim(measured[n], loss)}" for n in worse)
    if bounded:
        first = (f"After {base['tokens'] / 1e6:.2f}M tokens the 95% intervals rule out costs above "
                 f"{bounded[0][0]:+.3f} nats ({ANSWER_LABELS[bounded[0][1]]}) to {bounded[-1][0]:+.3f} "
                 f"({ANSWER_LABELS[bounded[-1][1]]}), {100 * bounded[0][0] / loss:.1f}% to "
                 f"{100 * bounded[-1][0] / loss:.1f}% of all `tp`'s {loss:.3f}"
                 + (f", so a cost under 1% is not yet shown for {', '.join(wide)}" if wide else "")
                 + (f"; {costs}" if costs else "") + ".")
    else:
        first = (f"After {base['tokens'] / 1e6:.2f}M tokens, at 95%: {costs}." if costs else
                 "No pattern has 2 paired seeds yet.")
    out = [first]
    hide, delay, half = gpu["tp_overlap=2"], gpu["all-ladder-fwd-only"], gpu["all-spd"]
    out.append(f"On GPUs (predicted, {GPU_SHAPE} at tp {GPU_TP}), hiding the syncs (`tp_overlap=2`, same math) "
               f"recovers {_share(hide[nv], half[nv])} of what dropping half of them (all `spd`) saves on "
               f"{nv.split(' (')[0]} ({hide[nv]:.2f}x against {half[nv]:.2f}x) and {_share(hide[ib], half[ib])} over "
               f"{ib.split(' (')[0]} ({hide[ib]:.2f}x against {half[ib]:.2f}x); delaying them (all `ladder`) "
               f"{_share(delay[nv], half[nv])} and {_share(delay[ib], half[ib])}.")
    one, two, bf16 = gpu["all-tp-int8"], gpu["all-tp-int8-2shot"], gpu["all-tp-bf16"]
    out.append(f"Shrinking them to int8 with the one-shot all-gather {_pace(one[nv])} on {nv.split(' (')[0]} and "
               f"{_pace(one[ib])} over {ib.split(' (')[0]} at tp {GPU_TP}; the two-shot exchange {_pace(two[nv])} "
               f"and {_pace(two[ib])} (its quality: {claim(pen.get('all-tp-int8-2shot'), loss)}); bf16 sums, already "
               f"the autocast dtype, gain nothing from compression and the one-shot all-gather of them "
               f"{_pace(bf16[nv])} on {nv.split(' (')[0]}.")
    longer = ctx.rows("convergence")
    cpen = {k[0]: v for k, v in penalties(longer).items()}
    cbase = next((r for r in longer if r["config"] == r["baseline"]), None)
    if cbase is not None and cpen:
        out.append(f"After {cbase['tokens'] / base['tokens']:g}x the training ({cbase['tokens'] / 1e6:.2f}M tokens, "
                   "`convergence`): " + ", ".join(f"{ANSWER_LABELS[n]} {claim(p, cbase['val_loss_mean'])}"
                                                  for n, p in cpen.items()) + ".")
    return " ".join(out)


def tradeoff_plot(ctx):
    """(data, draw) of the answer's figure: each way's quality cost (paired, 95%) against its predicted speedup."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return None
    gpu, links, _, _ = gpu_speedups()
    points = []
    for way, what, run, variant in WAYS:
        if variant is None:
            continue
        p = (0.0, 0.0, 0) if run is None else pen.get(run)
        status = "same math" if run is None else "pending" if p is None or p[1] is None else "measured"
        mean, ci, n = (None, None, 0 if p is None else p[2]) if status == "pending" else p
        points.append(dict(way=way, label=what.replace("`", ""), status=status, mean=mean, ci=ci, seeds=n,
                           speedup=[gpu[variant][name] for name in links]))
    data = dict(points=points, links=[n.split(" (")[0] for n in links], base_loss=base["val_loss_mean"])
    title = (f"Each way of giving up a sync: its quality cost, measured on CPU (`cpu-long`: a "
             f"{base['params_total'] / 1e6:.1f}M-parameter character model, {base['tokens'] / 1e6:.2f}M tokens, tp "
             f"{base['tp_size']}), against its training-step speedup, predicted for GPUs by the cost model "
             f"({GPU_SHAPE} at tp {GPU_TP}, H100; the assumptions: the README, under the answer's table)")
    return data, lambda: plots.draw_tradeoff(data, title=title)


def axes_compute(ctx):
    lines = ["| sweep | runs (own + shared) | with a result file | wall hours of its own finished runs | ms/step, "
             "median (range over runs) | runs flagged scattered |", "|---|---:|---:|---:|---:|---:|"]
    for name in AXES:
        planned = ctx.jobs(name, seeds=list(sweeps.SWEEP_SEEDS[name]))
        own = [j for j in planned if j.sweep == name]
        recs = [r for j in planned for r in [sweeps.load_result(j, say=lambda *_: None)] if r]
        mine = [r for r in recs if r["sweep"] == name]
        ms = sorted(r["timing"]["step_ms"] for r in recs if r["timing"].get("step_ms"))
        hours = sum(r["timing"].get("wall_s") or 0 for r in mine) / 3600
        span = f"{statistics.median(ms):.1f} ({ms[0]:.1f}–{ms[-1]:.1f})" if ms else "—"
        lines.append(f"| `{name}` | {len(own)} + {len(planned) - len(own)} | {len(recs)} | {hours:.2f} | {span} | "
                     f"{sum(1 for r in recs if r['timing'].get('scattered'))} |")
    return "\n".join(lines)


def penalty_data(pen, *, x_of):
    """One series per pattern (all-tp, the baseline, left out), points [x, mean, ci, seeds] by x."""
    names = [p for p in sweeps.PATTERNS if p != "all-tp"] + sorted({k[0] for k in pen} - set(sweeps.PATTERNS))
    return [dict(label=name, points=sorted([x_of(k), mean, ci or 0.0, n] for k, (mean, ci, n) in pen.items()
                                           if k[0] == name)) for name in names if any(k[0] == name for k in pen)]


def penalty_vs_tp(ctx):
    pen = penalties(ctx.rows("tp-axis"))
    if not pen:
        return None
    data = penalty_data(pen, x_of=lambda k: k[1])
    title = "tp-axis: cost of dropping syncs vs tensor-parallel degree (12 x 64 model, 3.84M tokens)"
    return data, lambda: plots.draw_penalty(data, xlabel="tensor-parallel degree (shards per layer, simulated)",
                                      title=title, xticks=sorted({p[0] for s in data for p in s["points"]}))


def penalty_vs_size(ctx):
    rows = ctx.rows("size-axis")
    pen = penalties(rows)
    if not pen:
        return None
    params = {results.group_key(r): r["params_non_embedding"] for r in rows}
    data = penalty_data(pen, x_of=lambda k: params[k[2]])
    title = "size-axis: cost of dropping syncs vs model size (tp 4, tokens per parameter fixed)"
    return data, lambda: plots.draw_penalty(data, xlabel="non-embedding parameters", title=title,
                                      xticks=sorted({p[0] for s in data for p in s["points"]}))


def sweep_plot(name, index):
    def spec(ctx):
        made = plots.sweep_plots(ctx.rows(name), title=f"{name} sweep")
        return made.get(plots.PLOTS[index])
    return spec


def paired_plot(name):
    def spec(ctx):
        rows = ctx.rows(name)
        return plots.paired_plot(rows, title=f"{name} sweep") if rows and results.has_pairs(rows) else None
    return spec


def blocks():
    """{marker name: (sweeps it reads, function(Results) -> markdown)}."""
    out = {}
    for name in sweeps.SWEEPS:
        out[name] = ((name,), lambda ctx, name=name: sweep_table(ctx, name))
        out[f"{name}-paired"] = ((name,), lambda ctx, name=name: sweep_paired(ctx, name))
        out[f"{name}-answer"] = ((name,), lambda ctx, name=name: sweep_answer(ctx, name))
    out["tp-axis-penalty"] = (("tp-axis", "cpu-long"), tp_axis_penalty)
    out["tp-axis-alltp"] = (("tp-axis", "cpu-long"), tp_axis_alltp)
    out["size-axis-penalty"] = (("size-axis", "cpu-long"), size_axis_penalty)
    out["axes-compute"] = (AXES, axes_compute)
    out["answer"] = (("cpu-long", "convergence"), answer_summary)
    out["answer-table"] = (("cpu-long",), answer_table)
    return out


def plot_specs():
    """{PNG path under the repo root: (sweeps it reads, function(Results) -> (data, draw) or None: no data)}."""
    return {
        "docs/val_loss_vs_allreduces.png": (("cpu",), sweep_plot("cpu", 0)),
        "docs/val_loss_curves.png": (("cpu",), sweep_plot("cpu", 1)),
        "docs/tokens_per_s_vs_allreduces.png": (("cpu",), sweep_plot("cpu", 2)),
        "docs/cpu_real_tokens_per_s_vs_allreduces.png": (("cpu-real",), sweep_plot("cpu-real", 2)),
        "docs/cpu_long_val_loss_curves.png": (("cpu-long",), sweep_plot("cpu-long", 1)),
        "docs/cpu_long_paired_difference.png": (("cpu-long",), paired_plot("cpu-long")),
        "docs/convergence_paired_difference.png": (("convergence",), paired_plot("convergence")),
        "docs/axes_penalty_vs_tp.png": (("tp-axis", "cpu-long"), penalty_vs_tp),
        "docs/axes_penalty_vs_size.png": (("size-axis", "cpu-long"), penalty_vs_size),
        "docs/answer_tradeoff.png": (("cpu-long",), tradeoff_plot),
    }


def markdown_files(root=ROOT):
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


IMAGE_LINK = re.compile(r"\]\((docs/[^)\s]+\.png)\)")


def relink(content, md_dir, root):
    """Image paths written from the repo root (docs/x.png), made relative to the markdown file's folder."""
    return IMAGE_LINK.sub(lambda m: "](" + os.path.relpath(os.path.join(root, m.group(1)), md_dir) + ")", content)


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
            problems.append(f"{where}: unknown report block {name!r} (tpcomm/report.py blocks() lists them)")
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
    """Regenerate (with check: compare) the marked tables, the plots and the sweeps' own outputs; returns the exit
    status: 1 when check found a mismatch, or a marker is unknown or unclosed (each printed as one line), else 0."""
    ctx = Results(root=root, say=(lambda *_: None) if check else say)
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
        write_sweep_outputs(ctx, selected or list(sweeps.SWEEPS), root=root, say=say)
    for line in problems + mismatches:
        print(line)
    return 1 if problems or mismatches else 0


def update_plots(ctx, chosen, *, check, root, say):
    """Write (with check: compare) the registered plots; returns the mismatch lines."""
    mismatches = []
    for rel, (deps, spec) in plot_specs().items():
        if not chosen(deps):
            continue
        path = os.path.join(root, rel)
        stored, made = plots.png_digest(path), spec(ctx)
        if made is None:  # no data: a plot made from data that is gone is stale; an older hand-made one is noted
            if stored is not None:
                if check:
                    mismatches.append(f"{rel}: made from result files that are gone (no data for it now)")
                else:
                    os.remove(path)
                    say(f"removed {rel}: no result files for it")
            elif os.path.exists(path) and not check:
                say(f"note: {rel} was not made from result files (there are none yet); left as it is")
            continue
        data, draw = made
        if stored == plots.data_digest(data):
            continue
        if check:
            mismatches.append(f"{rel}: " + ("missing" if not os.path.exists(path) else
                                            "its data digest differs from the result files'" if stored else
                                            "has no data digest (not made by `python experiment.py report`)"))
        else:
            plots.save_png(draw(), path, data)
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
        results.write_tables(rows, sweep_dir, title=title, note=sweeps.SWEEP_REMARKS.get(name, ""))
        plots.write_plots(rows, sweep_dir, title=title)
        plots.write_paired(rows, sweep_dir, title=title)
        say(f"{name}: {len(rows)} configs; tables and plots in {os.path.relpath(sweep_dir, root)}")
