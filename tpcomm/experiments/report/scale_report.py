"""
The scale axis in the report (`python experiment.py report`; tpcomm/experiments/report/report.py registers
these): from the gpu-scale sweep's result files, each pattern's paired cost to all `tp` at each size with its
95% interval, whether that cost grows, shrinks or holds from the smallest size to the largest (the per-seed
change, paired, with its interval), each pattern's measured step time over GPT's at the largest size, and the
plot of cost against size. Without result files it says the axis is pending and why.
"""

from tpcomm.experiments import pairing, plots, results
from tpcomm.experiments.gpu_scale import NAME
from tpcomm.experiments.readings import interval_cell, pattern_name, penalties
from tpcomm.experiments.sweep_plan import AXES_SIZE, AXES_STEPS, SCALE_PATTERNS, SCALE_SEEDS, SCALE_SIZES

STEP_LIMIT = 1.4  # the goal: simulated tp 4, compiled, at most this times GPT's step at the largest size
PLOT = "docs/gpu_scale_penalty_vs_size.png"


def model_rows(ctx):
    """The sweep's rows without GPT's own (its step time is the reference; its loss is all-tp's model)."""
    return [r for r in ctx.rows(NAME) if not r["config"].startswith("gpt-")]


def pending():
    (l0, c0, _), (l1, c1, _) = AXES_SIZE, max(SCALE_SIZES, key=lambda s: s[0] * s[1] ** 2)
    small, large = SCALE_SIZES[AXES_SIZE], SCALE_SIZES[(l1, c1, 8)]
    # same steps and block: tokens scale as the batch
    params, tokens = l1 * c1 ** 2 / (l0 * c0 ** 2), large / small
    return (f"_The scale axis is pending: no `{NAME}` result files yet (experiments/{NAME}/runs/). It needs "
            "a GPU: " f"the largest size, {l1} x {c1}, has {params:.0f}x the parameters of cpu-long's {l0} x "
            f"{c0} and trains {tokens:.0f}x its tokens ({AXES_STEPS:,} steps of {large} x 64), about "
            f"{params * tokens:.0f}x the compute of a cpu-long run (each of those took about 19 minutes "
            "on the 2 CPU cores here: months for the " f"sweep's {len(SCALE_SEEDS)} seeds x "
            f"{len(SCALE_PATTERNS)} patterns). `python experiment.py {NAME} --dry-run` prints the plan "
            "and its GPU-minutes; docs/gpu.md says how a " f"GPU session runs the next chunk._")


def started(rows):
    """One line while no pattern is paired with all `tp` yet: what has run, and what the costs wait for."""
    done = "; ".join(f"{r['config']} {r['val_loss_mean']:.4f} ({r['n_seeds']} "
                     f"seed{'s' if r['n_seeds'] > 1 else ''})"
                     for r in sorted(rows, key=lambda r: (r["params_non_embedding"] or 0, r["config"])))
    return (f"_The scale axis has begun: {sum(r['n_seeds'] for r in rows)} `{NAME}` run(s) (final val loss: "
            f"{done}); no pattern has a seed paired with all `tp` of its size yet, so each cost and its "
            "trend with size are " f"pending. `python experiment.py {NAME} --dry-run` prints what is left "
            "and its GPU-minutes._")


def trend(rows, pattern, pairs):
    """Per seed, the pattern's cost at the largest size minus at the smallest, paired:
    (mean, ci, seeds) or None."""
    by_size = {}
    for r in rows:
        if pattern_name(r) == pattern and r["config"] in pairs:
            by_size[r["params_non_embedding"] or 0] = dict(zip(pairs[r["config"]]["seeds"],
                                                               pairs[r["config"]]["final"][2]))
    if len(by_size) < 2:
        return None
    small, large = by_size[min(by_size)], by_size[max(by_size)]
    seeds = sorted(set(small) & set(large))
    if not seeds:
        return None
    return (*pairing.mean_ci([large[s] - small[s] for s in seeds]), len(seeds))


def trend_cell(t):
    if t is None:
        return "pending (needs the smallest and largest size on a common seed)"
    mean, ci, n = t
    if ci is None:
        return f"{mean:+.4f} (1 seed: no interval yet)"
    verdict = "grows" if mean - ci > 0 else "shrinks" if mean + ci < 0 else "holds"
    return f"{verdict}: {pairing.fmt_ci(mean, ci)} ({n} seeds)"


def step_line(ctx):
    """Each pattern's median step over GPT's at the largest size (the sweep's own
    timing), against STEP_LIMIT."""
    rows = ctx.rows(NAME)
    gpt = [r for r in rows if r["config"].startswith("gpt-") and r["step_ms"]]
    if not gpt:
        return ("Step time of simulated tp 4 over GPT's: pending (GPT's run at the largest size has no "
                "result file).")
    ref = gpt[0]
    same = [r for r in rows if r not in gpt and results.group_key(r) == results.group_key(ref)
            and r["step_ms"]]
    parts = [f"{pattern_name(r)} {r['step_ms'] / ref['step_ms']:.2f}x" for r in same]
    over = [pattern_name(r) for r in same if r["step_ms"] / ref["step_ms"] > STEP_LIMIT]
    return (f"Step time over GPT's ({ref['step_ms']:.1f} ms, median) at {ref['n_layer']} x {ref['n_embd']}: "
            f"{', '.join(parts) or 'pending'}; " +
            (f"over {STEP_LIMIT}x: {', '.join(over)}." if over else f"every one within {STEP_LIMIT}x."))


def scale_axis(ctx):
    rows = model_rows(ctx)
    if not rows:
        return pending()
    pen, pairs = penalties(rows), pairing.paired(rows)
    if not pen:  # the first chunks: only all `tp` files, nothing paired yet
        return started(rows)
    bases = sorted((r for r in rows if r["config"] == r["baseline"]),
                   key=lambda r: r["params_non_embedding"] or 0)
    head = " | ".join(f"{b['n_layer']} x {b['n_embd']} ({results.fmt(b['params_non_embedding'], ',d')})"
                      for b in bases)
    lines = ["Final val loss minus all `tp`'s of the same size and seed, mean [95% CI] (seeds), by "
             "non-embedding parameters; the last column: that cost at the largest size minus at the "
             "smallest, paired by seed.", "", f"| pattern | {head} | with size |",
             "|---|" + "---:|" * len(bases) + "---|", "| all-tp final val loss | " + " | "
             "".join(f"{b['val_loss_mean']:.4f}" for b in bases) + " | |"]
    for p in SCALE_PATTERNS[1:]:
        cells = [interval_cell(pen.get((p, b["tp_size"], results.group_key(b)))) for b in bases]
        lines.append(f"| {p} | " + " | ".join(cells) + f" | {trend_cell(trend(rows, p, pairs))} |")
    lines += ["", step_line(ctx)]
    if pen:  # scale_plot draws it only then
        lines += ["", f"![cost of each pattern vs model size, gpu-scale]({PLOT})"]
    return "\n".join(lines)


def scale_plot(ctx):
    rows = model_rows(ctx)
    pen = penalties(rows)
    if not pen:
        return None
    params = {results.group_key(r): r["params_non_embedding"] for r in rows}
    data = [dict(label=p, points=sorted([params[k[2]], m, ci or 0.0, n] for k,
                                        (m, ci, n) in pen.items() if k[0] == p)) for p in SCALE_PATTERNS[1:]
            if any(k[0] == p for k in pen)]
    title = f"{NAME}: cost of each pattern vs model size (tp 4 simulated, 6.49 tokens per parameter, Linux C)"
    return data, lambda: plots.draw_penalty(data, xlabel="non-embedding parameters", title=title,
                                            xticks=sorted({pt[0] for s in data for pt in s["points"]}))
