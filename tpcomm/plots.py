"""
The sweeps' plots. Each is the numbers it shows (plain JSON-able data, computed from summarized rows) and a function
drawing them; save_png stores the sha256 of those numbers (rounded) in the PNG's metadata, so `python experiment.py
report --check` (tpcomm/report.py) tells a stale plot without drawing it.

    write_plots(rows, out_dir)   # val_loss_vs_allreduces.png, val_loss_curves.png, tokens_per_s_vs_allreduces.png
"""

import hashlib
import json
import os
import statistics
import textwrap

from tpcomm.pairing import has_pairs, paired, paired_markdown
from tpcomm.results import SCATTER_LIMIT, group_key, size_label, sizes_vary, varies

PLOTS = ("val_loss_vs_allreduces.png", "val_loss_curves.png", "tokens_per_s_vs_allreduces.png")


def _rounded(x):
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _rounded(v) for k, v in x.items()}
    return x


def data_digest(data):
    """sha256 of the plotted numbers, rounded to 6 significant digits (so float noise in the last bits of a mean
    does not count as a change)."""
    return hashlib.sha256(json.dumps(_rounded(data), sort_keys=True).encode()).hexdigest()


DIGEST_PREFIX = "report-data-sha256:"


def save_png(fig, path, data):
    """Save fig with the digest of its data in the PNG's Description text chunk; closes fig."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Description": DIGEST_PREFIX + data_digest(data)})
    plt.close(fig)
    return path


def png_digest(path):
    """The data digest stored in a PNG by save_png, or None (no file, not a PNG, no digest)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            text = im.info.get("Description", "")
    except (OSError, ValueError):
        return None
    return text[len(DIGEST_PREFIX):] if text.startswith(DIGEST_PREFIX) else None


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(rows):
    """Rows split into lines of one model size, tp degree and token budget (a sweep of block patterns is one line);
    (label, rows sorted by decreasing fwd all-reduces) each; the label is empty when there is one line."""
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
    note = "\n".join(textwrap.wrap(note, 110))
    return tp_txt, tok_txt, n_seeds, f"\n{note}" if note else "", sim


def loss_vs_allreduces_data(rows):
    return [dict(series=label, points=[[r["fwd_allreduces"], r["val_loss_mean"], r["val_loss_std"],
                                        r["gap_to_baseline"], r["config"] == r["baseline"]] for r in members])
            for label, members in _series(rows)]


def draw_loss_vs_allreduces(data, *, title, context):
    plt = pyplot()
    tp_txt, tok_txt, n_seeds, note, _ = context
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for k, s in enumerate(data):
        pts = s["points"]
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], fmt="o-", capsize=4,
                    color=plt.get_cmap("tab10")(k), label=s["series"] or "final val loss")
        for x, y, _, gap, is_base in pts:
            if is_base:
                ax.plot([x], [y], "*", color="tab:red", ms=16, zorder=5)
            else:
                ax.annotate(f"{gap:+.3f}", (x, y), textcoords="offset points", xytext=(0, 9), ha="center",
                            fontsize=8, color="0.3")
    ax.set_xticks(sorted({p[0] for s in data for p in s["points"]}))
    ax.margins(y=0.12)
    ax.set_xlabel("forward all-reduces per forward pass (measured)")
    ax.set_ylabel("final validation loss (nats/token)")
    seeds_txt = f"{n_seeds} seeds, error bars: std" if n_seeds > 1 else "1 seed"
    ax.set_title(f"{title}: final val loss vs communication\n{tp_txt}, {tok_txt}, {seeds_txt}\n"
                 f"red star: baseline; labels: gap to it{note}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def curves_data(rows):
    out = []
    for r in sorted(rows, key=lambda r: -r["fwd_allreduces"]):
        iters = sorted({i for c in r["curves"] for i, _ in c})
        per_iter = {i: [v for c in r["curves"] for j, v in c if j == i] for i in iters}
        tp = f" tp{r['tp_size']}" if varies(rows, "tp_size") else ""
        size = f" {size_label(r)}" if sizes_vary(rows) else ""
        out.append(dict(label=f"{r['fwd_allreduces']:>2} all-reduces  {r['block_pattern']}{tp}{size}",
                        base=r["config"] == r["baseline"], iters=iters,
                        mean=[statistics.fmean(per_iter[i]) for i in iters]))
    return out


def draw_curves(data, *, title, context):
    plt = pyplot()
    tp_txt, tok_txt, n_seeds, note, _ = context
    fig, ax = plt.subplots(figsize=(12, 5.5))
    cmap = plt.get_cmap("plasma")  # spaced by rank, so neighbouring counts stay distinguishable
    for rank, c in enumerate(data):
        ax.plot(c["iters"], c["mean"], "o-" if len(c["iters"]) < 30 else "-", ms=3, lw=2.2 if c["base"] else 1.3,
                color="black" if c["base"] else cmap(0.9 * rank / max(1, len(data) - 1)), label=c["label"])
    lows = [min(c["mean"]) for c in data]
    highs = [v for c in data for v in (c["mean"][1:2] or c["mean"])]  # zoom past iter 0: ~ln(vocab) for every run
    ax.set_ylim(min(lows) - 0.05, max(highs) + 0.1)
    first = min(c["iters"][:2] for c in data)
    if len(first) == 2:
        ax.set_xlim(left=first[1] - 0.25 * (first[1] - first[0]))
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation loss (nats/token)" + (" (mean over seeds)" if n_seeds > 1 else ""))
    curve_seeds = f"mean over {n_seeds} seeds" if n_seeds > 1 else "1 seed"
    ax.set_title(f"{title}: validation loss during training\n{tp_txt}, {tok_txt}, {curve_seeds}\n"
                 f"(zoomed past iter 0, where every run is at ~ln(vocab)){note}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="forward all-reduces, block pattern", title_fontsize=9, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), prop={"family": "monospace", "size": 8})
    fig.tight_layout()
    return fig


def throughput_data(rows):
    return [dict(series=label, points=[[r["fwd_allreduces"], r["tokens_per_s"], r["tokens_per_s_std"],
                                        r["scattered"], r["config"] == r["baseline"]]
                                       for r in members if r["tokens_per_s"] is not None])
            for label, members in _series(rows)]


def draw_throughput(data, *, title, context):
    plt = pyplot()
    tp_txt, _, _, note, sim = context
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for k, s in enumerate(data):
        pts = s["points"]
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], fmt="o-", capsize=4,
                    color=plt.get_cmap("Dark2")(k), label=s["series"] or "tokens/s (median step)")
        for x, y, _, scattered, is_base in pts:
            if is_base:
                ax.plot([x], [y], "*", color="tab:red", ms=16, zorder=5)
            if scattered:
                ax.plot([x], [y], "x", color="black", ms=12, mew=2, zorder=6)
    ax.plot([], [], "*", color="tab:red", ms=12, label="baseline")
    ax.plot([], [], "x", color="black", ms=10, mew=2, label=f"scattered: p90/median step > {SCATTER_LIMIT}")
    ax.set_xticks(sorted({p[0] for s in data for p in s["points"]}))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("forward all-reduces per forward pass (measured)")
    ax.set_ylabel("training throughput (tokens/s per model replica)")
    sim_note = ("simulated TP: one process computes every shard, the all-reduces are in-memory sums,\n"
                "so this shows compute differences between block types, not communication savings") if sim else \
        "real TP: all-reduces cross process boundaries"
    ax.set_title(f"{title}: throughput vs communication ({tp_txt}), median step time\n{sim_note}{note}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # outside the axes: never over a point
    fig.tight_layout()
    return fig


def sweep_plots(rows, *, title="Communication sweep", note=""):
    """{file name: (data, draw)} of the three sweep plots; draw() returns the figure."""
    rows = [r for r in rows if r["fwd_allreduces"] is not None]
    if not rows:
        return {}
    context = _context(rows, title, note)
    specs = {PLOTS[0]: (loss_vs_allreduces_data, draw_loss_vs_allreduces), PLOTS[1]: (curves_data, draw_curves),
             PLOTS[2]: (throughput_data, draw_throughput)}
    out = {}
    for name, (data_fn, draw_fn) in specs.items():
        data = data_fn(rows)
        out[name] = (data, lambda data=data, draw_fn=draw_fn: draw_fn(data, title=title, context=context))
    return out


def write_plots(rows, out_dir, *, title="Communication sweep", note=""):
    """The three PNGs in out_dir; returns their paths. `note` (e.g. the overrides) goes under each title."""
    return [save_png(draw(), os.path.join(out_dir, name), data)
            for name, (data, draw) in sweep_plots(rows, title=title, note=note).items()]


def paired_plot_data(rows):
    pairs = paired(rows)
    others = sorted((r for r in rows if r["config"] != r["baseline"] and r["config"] in pairs),
                    key=lambda r: (str(group_key(r)), -r["fwd_allreduces"]))
    return [dict(label=f"{r['fwd_allreduces']} all-reduces {r['block_pattern']}"
                 + (f" tp{r['tp_size']}" if varies(rows, "tp_size") else "")
                 + (f" {size_label(r)}" if sizes_vary(rows) else ""),
                 points=[[i * r["tokens_per_iter"] / 1e6, m, c or 0.0] for i, m, c in pairs[r["config"]]["curve"]
                         if i > 0]) for r in others]


def draw_paired(data, *, title, n_seeds):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, 5.5))
    ax.axhline(0, color="black", lw=1.5, label="baseline (all-tp, same seed)")
    cmap = plt.get_cmap("plasma")
    for k, s in enumerate(data):
        x, mean = [p[0] for p in s["points"]], [p[1] for p in s["points"]]
        color = cmap(0.85 * k / max(1, len(data) - 1))
        ax.plot(x, mean, "o-", ms=3, color=color, label=s["label"])
        ax.fill_between(x, [m - c for _, m, c in s["points"]], [m + c for _, m, c in s["points"]], color=color,
                        alpha=0.2)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("val loss minus the baseline's, same seed (nats/token)")
    ax.set_title(f"{title}: paired difference to the baseline during training\nmean over up to {n_seeds} seeds, "
                 f"band: 95% confidence interval; below 0 = better than the baseline", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), prop={"family": "monospace", "size": 8})
    fig.tight_layout()
    return fig


def paired_plot(rows, *, title):
    """(data, draw) of the paired difference plot."""
    data = paired_plot_data(rows)
    n_seeds = max((len(p["seeds"]) for p in paired(rows).values()), default=0)
    return data, lambda: draw_paired(data, title=title, n_seeds=n_seeds)


def draw_penalty(data, *, xlabel, title, xticks):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.5))
    ax.axhline(0, color="black", lw=1.2, label="all-tp baseline (same seed)")
    for k, s in enumerate(data):
        shift = 1.04 ** (k - (len(data) - 1) / 2)  # side by side, so the error bars do not hide each other
        ax.errorbar([p[0] * shift for p in s["points"]], [p[1] for p in s["points"]], yerr=[p[2] for p in
                    s["points"]], fmt="o-", capsize=4, color=plt.get_cmap("tab10")(k + 1), label=s["label"])
    ax.set_xscale("log")
    ax.set_xticks(xticks, [f"{x:,}" for x in xticks])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("final val loss minus all-tp's (nats/token)")
    ax.set_title(title + "\nmean over seeds, error bars: 95% confidence interval (Student's t); above 0 = worse "
                 "than all-tp", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    fig.tight_layout()
    return fig


def write_paired(rows, out_dir, *, title="Communication sweep"):
    """paired.md and paired_difference_vs_tokens.png when the baseline and another config have 2+ common seeds;
    returns their paths ([] otherwise)."""
    if not has_pairs(rows):
        return []
    os.makedirs(out_dir, exist_ok=True)
    md, png = os.path.join(out_dir, "paired.md"), os.path.join(out_dir, "paired_difference_vs_tokens.png")
    with open(md, "w") as f:
        f.write(f"# {title}: paired differences to the baseline\n\n{paired_markdown(rows)}\n")
    data, draw = paired_plot(rows, title=title)
    save_png(draw(), png, data)
    return [md, png]


WAY_COLORS = {"drop": "tab:red", "hide": "tab:green", "delay": "tab:blue", "shrink": "tab:purple",
              "drop + shrink": "black"}


def _dodge(xs, *, near=1.1, step=1.035):
    """(x factors, label offsets in points) that set points within `near` of each other (as a ratio) side by side
    on a log axis, their labels stacked, so no two hide each other."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    groups, shift, offset = [], [1.0] * len(xs), [8] * len(xs)
    for i in order:
        if groups and xs[i] / xs[groups[-1][0]] < near:
            groups[-1].append(i)
        else:
            groups.append([i])
    for g in groups:
        for k, i in enumerate(g):
            shift[i] = step ** (k - (len(g) - 1) / 2)
            offset[i] = (6, -10, 18, -22, 30, -34)[k % 6]
    return shift, offset


def draw_tradeoff(data, *, title):
    """The answer's figure: one panel per network; x the predicted step speedup, y the paired quality cost with
    its 95% interval; the ways that keep the math at 0 (hollow diamonds), patterns without 2 paired seeds yet on the
    floor (crosses). Points at about the same speedup are set side by side."""
    from matplotlib.ticker import FixedLocator, NullLocator

    plt = pyplot()
    points, links = data["points"], data["links"]
    measured = [p for p in points if p["status"] == "measured"]
    top = max([p["mean"] + p["ci"] for p in measured] + [0.01]) * 1.15
    floor = min([p["mean"] - p["ci"] for p in measured] + [0.0]) - 0.012
    fig, axes = plt.subplots(1, len(links), figsize=(13, 7.5), sharey=True)
    for k, (ax, link) in enumerate(zip(axes, links)):
        ax.axhline(0, color="black", lw=1)
        ax.axvline(1, color="grey", lw=1, ls=":")
        one = 0.01 * data["base_loss"]
        ax.axhline(one, color="grey", lw=1, ls="--")
        ax.text(0.01, one, "1% of all tp's loss", va="bottom", fontsize=7, color="grey",
                transform=ax.get_yaxis_transform())
        xs = [p["speedup"][k] for p in points]
        shift, offset = _dodge(xs)
        for j, p in enumerate(points):
            x, color = xs[j] * shift[j], WAY_COLORS[p["way"]]
            if p["status"] == "measured":
                ax.errorbar([x], [p["mean"]], yerr=[p["ci"]], fmt="o", capsize=4, color=color)
                y = p["mean"]
            elif p["status"] == "same math":
                ax.plot([x], [0], "D", mfc="white", color=color, ms=8)
                y = 0.0
            else:
                y = floor + 0.004
                ax.plot([x], [y], "x", color=color, ms=8)
            ax.annotate(str(j + 1), (x, y), xytext=(4, offset[j]), textcoords="offset points", fontsize=8,
                        color=color, weight="bold")
        ax.set_xscale("log")
        lo, hi = min(xs) / 1.1, max(xs) * 1.35
        ax.set_xlim(lo, hi)
        ticks = [t for t in ((0.6, 0.8, 1, 1.25, 1.5, 2) if hi < 2.5 else (0.6, 0.8, 1, 1.5, 2, 3, 4, 6, 8))
                 if lo <= t <= hi]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{t:g}x" for t in ticks])
        ax.set_title(f"{link} (predicted)", fontsize=10)
        ax.set_xlabel("predicted step speedup over Megatron-LM's all-tp step")
        ax.grid(alpha=0.3)
        ax.set_ylim(floor, top)
    axes[0].set_ylabel("final val loss minus all tp's, same seed (nats/token)\nmean and 95% interval (seeds)")
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=w) for w, c in WAY_COLORS.items()] + [
        plt.Line2D([], [], color="grey", marker="o", ls="", label="measured (seeds)"),
        plt.Line2D([], [], color="grey", marker="D", mfc="white", ls="", label="0 by construction (same math)"),
        plt.Line2D([], [], color="grey", marker="x", ls="", label="quality pending (< 2 seeds)")]
    axes[-1].legend(handles=handles, loc="lower right", fontsize=7.5)
    fig.suptitle("\n".join(textwrap.wrap(title, 140)), fontsize=9)
    key = [f"{j + 1} {p['way']}: {p['label']}" + (f" ({p['seeds']} seeds)" if p["status"] == "measured" else
                                                  " (same math)" if p["status"] == "same math" else " (pending)")
           + ": " + ", ".join(f"{x:.2f}x {link}" for x, link in zip(p["speedup"], links)) for j, p in enumerate(points)]
    half = (len(key) + 1) // 2
    for col, part in enumerate((key[:half], key[half:])):
        fig.text(0.08 + 0.46 * col, 0.01, "\n".join(part), fontsize=8, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.022 * half + 0.01, 1, 1))
    return fig
