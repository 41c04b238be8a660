"""
The sweeps' plots. Each is the numbers it shows (plain JSON-able data, computed from summarized
rows) and a function drawing them; png.save_png stores the sha256 of those numbers (rounded) in the
PNG's metadata, so `python experiment.py report --check` (tpcomm/experiments/report/report.py) tells
a stale plot without drawing it.

    write_plots(rows, out_dir)  # val_loss_vs_allreduces.png, val_loss_curves.png,
                                # tokens_per_s_vs_allreduces.png
"""

import os
import statistics
import textwrap

from tpcomm.figures import plot_labels, png, way_styles
from tpcomm.experiments.pairing import has_pairs, over_training, paired, paired_markdown
from tpcomm.experiments.readings import pattern_name, planned_seeds
from tpcomm.experiments import ways
from tpcomm.experiments.results import SCATTER_LIMIT, group_key, size_label, sizes_vary, varies

PLOTS = ("val_loss_vs_allreduces.png", "val_loss_curves.png", "tokens_per_s_vs_allreduces.png")


def _series(rows):
    """Rows split into lines of one model size, tp degree and token budget (a sweep of block
    patterns is one line); (label, rows sorted by decreasing fwd all-reduces) each; the label is
    empty when there is one line."""
    key = lambda r: (r["n_layer"], r["n_embd"], r["tp_size"], r["tokens"])  # noqa: E731
    keys = sorted({key(r) for r in rows})
    out = []
    for k in keys:
        members = sorted((r for r in rows if key(r) == k), key=lambda r: -r["fwd_allreduces"])
        label = f"{k[0]}x{k[1]} tp {k[2]}, {k[3] / 1e6:.2f}M tokens" if len(keys) > 1 else ""
        out.append((label, members))
    return out


def _context(rows, title, note):
    """(tp text, tokens text, seeds text, note) for the plot titles."""
    sim = all(r["tp_mode"] == "simulated" for r in rows)
    tps = sorted({r["tp_size"] for r in rows})
    tp_txt = f"tp_size={'/'.join(map(str, tps))} {'simulated' if sim else 'real'}"
    tokens = sorted({r["tokens"] for r in rows})
    tok_txt = f"{tokens[0]:,} tokens per run" if len(tokens) == 1 else "tokens per run by model size"
    n_seeds = max(r["n_seeds"] for r in rows)
    return tp_txt, tok_txt, n_seeds, note, sim


def _footer(fig, note):
    """The sweep's remark (early training, overrides) in small print under the figure: the title stays at two
    lines."""
    if note:
        fig.text(0.01, 0.005, "\n".join(textwrap.wrap(note, 150)), fontsize=7, va="bottom", color="0.3")
        fig.tight_layout(rect=(0, 0.03 * (1 + len(note) // 150), 1, 1))


def _varied(row):
    """A run that keeps its syncs but delays (ladder), shrinks (tp_comm_dtype) or hides (tp_overlap, sequence
    parallelism) them: drawn as its own marker, off the budget sweep's line."""
    return bool(row.get("tp_comm_dtype") or row.get("delayed") or (row.get("tp_overlap") or 1) > 1
                or row.get("sequence_parallel"))


def _sweep_points(rows, value, err, extra):
    """One series per _series line; a point [fwd all-reduces, value, err, extra,
    baseline?, way key, varied?]."""
    return [dict(series=label, points=[[r["fwd_allreduces"], r[value], r[err], r[extra],
                                        r["config"] == r["baseline"], pattern_name(r), _varied(r)]
                                       for r in members if r[value] is not None]) for label,
            members in _series(rows)]


def loss_vs_allreduces_data(rows):
    return _sweep_points(rows, "val_loss_mean", "val_loss_std", "gap_to_baseline")


LINESTYLES = ("-", "--", ":", "-.")


def _draw_sweep(ax, data, *, text_of):
    """Each series' budget sweep as a grey line, its delayed, shrunk or hidden runs as markers off the line;
    every point in its way's colour and marker (way_styles) with the label text_of(point, way name or "");
    returns the labels and the marks (x, y low, y high) they keep off, for plot_labels.separate."""
    labels, marks = [], []
    for k, s in enumerate(data):
        line = sorted(p[:2] for p in s["points"] if not p[6])
        ax.plot([p[0] for p in line], [p[1] for p in line], ls=LINESTYLES[k % 4], color="0.6", lw=1.2,
                zorder=1, label="budget sweep" + (f", {s['series']}" if s["series"] else "") + ": syncs "
                "dropped by block pattern")
        for p in s["points"]:
            st = way_styles.style(p[5], fwd_allreduces=p[0])
            ax.errorbar([p[0]], [p[1]], yerr=[p[2]], fmt=st.marker, ms=7, capsize=3, color=st.color, zorder=3)
            marks.append((p[0], p[1] - (p[2] or 0), p[1] + (p[2] or 0)))
            name = st.name if way_styles.is_way(p[5]) else ""
            text = text_of(p, name)
            if text:
                labels.append(ax.annotate(text, (p[0], p[1]), xytext=(7, 0), textcoords="offset points",
                                          va="center", ha="left", fontsize=8, color=st.color if name
                                          else "0.3", arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5,
                                                                      shrinkA=0, shrinkB=4)))
    ax.set_xticks(sorted({p[0] for s in data for p in s["points"]}))
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, hi + 0.12 * (hi - lo))  # room for the labels right of the last budget
    return labels, marks


def _place(fig, ax, labels, marks):
    plot_labels.separate(fig, labels, obstacles=lambda: plot_labels.mark_boxes(ax, marks), step=3)


def _gap_text(p, name):
    if p[4]:
        return f"{name}: baseline"
    return f"{name} {p[3]:+.3f}" if name else f"{p[3]:+.3f}"


def draw_loss_vs_allreduces(data, *, title, context):
    plt = png.pyplot()
    tp_txt, tok_txt, n_seeds, note, _ = context
    fig, ax = plt.subplots(figsize=(10, 6))
    labels, marks = _draw_sweep(ax, data, text_of=_gap_text)
    ax.margins(y=0.12)
    ax.set_xlabel("forward all-reduces per forward pass (measured)")
    ax.set_ylabel("final validation loss (nats/token)")
    seeds_txt = f"{n_seeds} seeds, error bars: std" if n_seeds > 1 else "1 seed, no error bars"
    ax.set_title(f"{title}: final val loss vs communication ({tp_txt}, {tok_txt}, {seeds_txt})\n" "grey "
                 "line: the budget sweep; markers off it: the same syncs delayed or shrunk; labels: gap to "
                 "the baseline", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    _footer(fig, note)
    _place(fig, ax, labels, marks)
    return fig


def curves_data(rows):
    out = []
    for r in sorted(rows, key=lambda r: -r["fwd_allreduces"]):
        iters = sorted({i for c in r["curves"] for i, _ in c})
        per_iter = {i: [v for c in r["curves"] for j, v in c if j == i] for i in iters}
        tp = f" tp{r['tp_size']}" if varies(rows, "tp_size") else ""
        size = f" {size_label(r)}" if sizes_vary(rows) else ""
        out.append(dict(label=way_styles.label(pattern_name(r), fwd_allreduces=r["fwd_allreduces"]) + tp
                        + size, key=pattern_name(r), fwd=r["fwd_allreduces"],
                        base=r["config"] == r["baseline"], iters=iters, seeds=r["n_seeds"],
                        mean=[statistics.fmean(per_iter[i]) for i in iters]))
    return out


CURVES_PER_PANEL = 5  # and the baseline in every panel: at most 6 lines a panel


def draw_curves(data, *, title, context):
    """The validation loss during training, the ways in panels of CURVES_PER_PANEL beside the baseline (one y
    axis), zoomed past iter 0."""
    plt = png.pyplot()
    tp_txt, tok_txt, _, _, _ = context
    base = [c for c in data if c["base"]]
    others = [c for c in data if not c["base"]]
    groups = [others[k:k + CURVES_PER_PANEL] for k in range(0, len(others), CURVES_PER_PANEL)] or [[]]
    fig, axes = plt.subplots(1, len(groups), figsize=(max(6.5 * len(groups), 9), 5.2), sharey=True,
                             squeeze=False)
    for ax, group in zip(axes[0], groups):
        for c in base + group:
            st = way_styles.style(c["key"], fwd_allreduces=c["fwd"])
            named = not c["base"] or ax is axes[0, 0]  # the baseline's legend entry once
            ax.plot(c["iters"], c["mean"], "-", marker=st.marker if len(c["iters"]) < 30 else None, ms=4,
                    lw=2.2 if c["base"] else 1.3, color=st.color, label=c["label"] if named else "_baseline")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", prop={"size": 8})
    lows = [min(c["mean"]) for c in data]
    # zoom past iter 0: ~ln(vocab) for every run
    highs = [v for c in data for v in (c["mean"][1:2] or c["mean"])]
    axes[0, 0].set_ylim(min(lows) - 0.05, max(highs) + 0.1)
    first = min(c["iters"][:2] for c in data)
    if len(first) == 2:
        axes[0, 0].set_xlim(left=first[1] - 0.25 * (first[1] - first[0]))
    seeds = sorted({c["seeds"] for c in data})
    axes[0, 0].set_ylabel("validation loss (nats/token)" + (" (mean over seeds)" if seeds[-1] > 1 else ""))
    curve_seeds = "1 seed" if seeds == [1] else f"mean over each run's {'/'.join(map(str, seeds))} seeds"
    fig.suptitle(f"{title}: validation loss during training ({tp_txt}, {tok_txt}, {curve_seeds})\n"
                 "the baseline (thick) in every panel; zoomed past iter 0, where every run is at ~ln(vocab)",
                 fontsize=10)
    fig.tight_layout()
    _footer(fig, context[3])
    return fig


def throughput_data(rows):
    return _sweep_points(rows, "tokens_per_s", "tokens_per_s_std", "scattered")


def draw_throughput(data, *, title, context):
    plt = png.pyplot()
    tp_txt, _, n_seeds, note, sim = context
    fig, ax = plt.subplots(figsize=(10, 5.5))
    labels, marks = _draw_sweep(ax, data, text_of=lambda p, name: f"{name}: baseline" if p[4] else name)
    scattered = [p for s in data for p in s["points"] if p[3]]
    for p in scattered:
        ax.plot([p[0]], [p[1]], "x", color="black", ms=12, mew=2, zorder=6)
    if scattered:
        ax.plot([], [], "x", color="black", ms=10, mew=2, label=f"scattered: p90/median step > "
                f"{SCATTER_LIMIT}")
    top = max(p[1] + (p[2] or 0) for s in data for p in s["points"])
    ax.set_ylim(0, 1.15 * top)  # room inside the axes for the labels of the fastest points
    ax.set_xlabel("forward all-reduces per forward pass (measured)")
    ax.set_ylabel("training throughput (tokens/s per model replica)")
    sim_note = ("simulated: one process computes every shard (the block types' compute, not communication "
                "saved)" if sim else "real TP: all-reduces cross process boundaries")
    seeds_txt = f"{n_seeds} seeds, error bars: std" if n_seeds > 1 else "1 seed"
    ax.set_title(f"{title}: throughput vs communication ({tp_txt}), median step time, "
                 f"{seeds_txt}\n{sim_note}", fontsize=9)
    ax.grid(alpha=0.3)
    # outside the axes: never over a point
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    _footer(fig, note)
    _place(fig, ax, labels, marks)
    return fig


def sweep_plots(rows, *, title="Communication sweep", note=""):
    """{file name: (data, draw)} of the three sweep plots; draw() returns the figure."""
    rows = [r for r in rows if r["fwd_allreduces"] is not None]
    if not rows:
        return {}
    context = _context(rows, title, note)
    specs = {PLOTS[0]: (loss_vs_allreduces_data, draw_loss_vs_allreduces),
             PLOTS[1]: (curves_data, draw_curves), PLOTS[2]: (throughput_data, draw_throughput)}
    out = {}
    for name, (data_fn, draw_fn) in specs.items():
        data = data_fn(rows)
        out[name] = (data, lambda data=data, draw_fn=draw_fn: draw_fn(data, title=title, context=context))
    return out


def write_plots(rows, out_dir, *, title="Communication sweep", note=""):
    """The three PNGs in out_dir; returns their paths. `note` (e.g. the overrides) goes under each title."""
    return [png.save_png(draw(), os.path.join(out_dir, name), data)
            for name, (data, draw) in sweep_plots(rows, title=title, note=note).items()]


def paired_plot_data(rows):
    """A panel a config: its label, style key, seeds, where its sign changes (pairing.over_training) and the
    points [M tokens, mean, half-width] of its paired difference at each evaluation after step 0."""
    pairs = paired(rows)
    order = {w.key: k for k, w in enumerate(ways.WAYS)}  # the answer table's order, then the other patterns
    others = sorted((r for r in rows if r["config"] != r["baseline"] and r["config"] in pairs),
                    key=lambda r: (str(group_key(r)), order.get(pattern_name(r), len(order)),
                                   -r["fwd_allreduces"]))
    return [dict(label=way_styles.label(pattern_name(r), fwd_allreduces=r["fwd_allreduces"])
                 + (f" tp{r['tp_size']}" if varies(rows, "tp_size") else "")
                 + (f" {size_label(r)}" if sizes_vary(rows) else ""), seeds=len(pairs[r["config"]]["seeds"]),
                 key=pattern_name(r), fwd=r["fwd_allreduces"], planned=planned_seeds(pattern_name(r)),
                 trend=over_training(pairs[r["config"]]["curve"], r["tokens_per_iter"]),
                 points=[[i * r["tokens_per_iter"] / 1e6, m, c or 0.0] for i, m,
                         c in pairs[r["config"]]["curve"] if i > 0]) for r in others]


PANEL_COLUMNS = 4


def draw_paired(data, *, title, n_seeds):
    """Small multiples: a panel a way, one shared y axis, the baseline at 0, the mean and its
    95% band; each panel says its seeds and where its sign changes. A way short of its planned
    paired seeds (readings.planned_seeds) is drawn without a band (its interval is not read)
    and the y axis spans the read ones."""
    plt = png.pyplot()
    cols = min(PANEL_COLUMNS, max(1, len(data)))
    rows = -(-max(1, len(data)) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(3.2 * cols, 10), 2.3 * rows + 0.9), sharex=True,
                             sharey=True, squeeze=False)
    for ax, s in zip(axes.flat, data):
        x, mean = [p[0] for p in s["points"]], [p[1] for p in s["points"]]
        st = way_styles.style(s["key"], fwd_allreduces=s["fwd"])
        read = s["seeds"] >= s["planned"]
        ax.axhline(0, color="black", lw=1)
        if read:
            ax.fill_between(x, [m - c for _, m, c in s["points"]], [m + c for _, m, c in s["points"]],
                            color=st.color, alpha=0.25, lw=0)
        ax.plot(x, mean, "-" if read else ":", color=st.color, lw=1.6)
        seeds = f"{s['seeds']} seed{'s' * (s['seeds'] != 1)}"
        ax.set_title("\n".join(textwrap.wrap(f"{s['label']} ({seeds})", 38)[:2]), fontsize=8.5)
        ax.text(0.03, 0.04, s["trend"] if read else f"pending: {s['seeds']} of {s['planned']} seeds",
                transform=ax.transAxes,
                fontsize=7.5, va="bottom")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(data):]:
        ax.set_visible(False)
    spans = [v for s in data if s["seeds"] >= s["planned"] for _, m, c in s["points"] for v in (m - c, m + c)]
    spans = spans or [m for s in data for _, m, _ in s["points"]]
    if spans:
        pad = 0.08 * (max(spans) - min(spans) or 0.01)
        axes[0, 0].set_ylim(min(spans) - pad, max(spans) + pad)
    for k, ax in enumerate(list(axes.flat)[:len(data)]):
        if k + cols >= len(data):  # the lowest panel of its column: its x axis is read there
            ax.set_xlabel("training tokens (M)", fontsize=8.5)
            ax.xaxis.set_tick_params(labelbottom=True)
    for ax in axes[:, 0]:
        ax.set_ylabel("val loss - baseline's", fontsize=8.5)
    fig.suptitle(f"{title}: each way's val loss minus all tp's, paired by seed (up to {n_seeds}), during "
                 "training\nline: mean, band: 95% interval at each evaluation; below 0: better than all "
                 "tp", fontsize=10)
    fig.tight_layout()
    return fig


def paired_plot(rows, *, title):
    """(data, draw) of the paired difference plot."""
    data = paired_plot_data(rows)
    n_seeds = max((len(p["seeds"]) for p in paired(rows).values()), default=0)
    return data, lambda: draw_paired(data, title=title, n_seeds=n_seeds)


def draw_penalty(data, *, xlabel, title, xticks, xticklabels=None):
    """Each pattern's final paired difference at each x, no line between them (no trend is claimed), side by
    side so the error bars do not hide each other; each point says its seeds."""
    plt = png.pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    ax.axhline(0, color="black", lw=1.2, label="all tp, the baseline (same seed)")
    labels = []
    for k, s in enumerate(data):
        st = way_styles.style(s["label"])
        shift = 1.06 ** (k - (len(data) - 1) / 2)
        ax.errorbar([p[0] * shift for p in s["points"]], [p[1] for p in s["points"]], yerr=[p[2] for p in
                    s["points"]], fmt=st.marker, ms=7, capsize=4, color=st.color, label=st.name)
        labels += [ax.annotate(f"{p[3]}", (p[0] * shift, p[1] + p[2]), xytext=(0, 3), textcoords="offset "
                               "points", ha="center", va="bottom", fontsize=8, color=st.color)
                   for p in s["points"]]
    ax.set_xscale("log")
    ax.set_xticks(xticks, xticklabels or [f"{x:,}" for x in xticks])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("final val loss minus all tp's (nats/token)")
    ax.set_title(f"{title}\nmean over paired seeds (the number over each bar), error bars: 95% interval; "
                 "above 0: worse than all tp", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    fig.tight_layout()
    plot_labels.separate(fig, labels, step=3, tries=6)
    return fig


def write_paired(rows, out_dir, *, title="Communication sweep"):
    """paired.md and paired_difference_vs_tokens.png when the baseline and another config have 2+ common
    seeds; returns their paths ([] otherwise)."""
    if not has_pairs(rows):
        return []
    os.makedirs(out_dir, exist_ok=True)
    md, png_path = os.path.join(out_dir, "paired.md"), os.path.join(out_dir,
                                                                    "paired_difference_vs_tokens.png")
    with open(md, "w") as f:
        f.write(f"# {title}: paired differences to the baseline\n\n{paired_markdown(rows)}\n")
    data, draw = paired_plot(rows, title=title)
    png.save_png(draw(), png_path, data)
    return [md, png_path]
