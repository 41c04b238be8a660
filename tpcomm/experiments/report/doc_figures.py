"""
Two figures for messages the docs state in words (`python experiment.py report` draws them,
tpcomm/experiments/report/report.py plot_specs()): the cost model beside every published figure it is
checked on (docs/cost_model_checks.png, for docs/cost_model.md), and all `parallel`'s early-training
reversal across the cpu, cpu-long and convergence sweeps (docs/parallel_reversal.png, for docs/axes.md).
Each is (data, draw) as tpcomm/experiments/plots.py's: save_png stores the data's digest, so `report
--check` tells when one is stale.
"""

import textwrap

from tpcomm.experiments import pairing
from tpcomm.figures import plot_labels, way_styles
from tpcomm.figures.png import pyplot
from tpcomm.experiments.readings import pattern_name


def cost_checks_data():
    """[[what, published [low, high], model [low, high], error of each end in %]]: cost_model.published_checks
    at the prediction's defaults (a single figure has low = high)."""
    from tpcomm.costmodel import cost_model as cm

    cfg = cm.PREDICT_DEFAULTS
    span = lambda v: list(v) if isinstance(v, tuple) else [v, v]  # noqa: E731
    return [[what, span(pub), span(model), [cm.error(m, p) for m, p in zip(span(model), span(pub))]]
            for what, pub, model in cm.published_checks(cfg, cm.options(cfg))]


def draw_cost_checks(data):
    """One row per check: the published figure (grey, a bar for a range) and the model's (blue), the error
    beside; shares and speedups in their own panels."""
    plt = pyplot()
    groups = [("share of a training step", [d for d in data if "share" in d[0]]),
              ("speedup", [d for d in data if "share" not in d[0]])]
    fig, axes = plt.subplots(2, 1, figsize=(10, 7.5), gridspec_kw=dict(height_ratios=[len(g[1]) + 1
                                                                                      for g in groups]))
    for ax, (unit, rows) in zip(axes, groups):
        for y, (what, pub, model, err) in enumerate(rows):
            ax.plot(pub, [y + 0.12] * 2, color="0.55", lw=7, solid_capstyle="butt")
            ax.plot(pub, [y + 0.12] * 2, "|", color="0.3", ms=12, mew=2)
            ax.plot(model, [y - 0.12] * 2, "o-", color="#1f77b4", lw=2, ms=7)
            ax.annotate(", ".join(f"{e:+.1f}%" for e in (err if pub[0] != pub[1] else err[:1])),
                        (max(model + pub), y), xytext=(8, 0), textcoords="offset points", va="center",
                        fontsize=9)
        ax.set_yticks(range(len(rows)), ["\n".join(textwrap.wrap(r[0], 48)) for r in rows], fontsize=8)
        ax.invert_yaxis()
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi + 0.18 * (hi - lo))
        ax.set_xlabel(unit, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].plot([], [], color="0.55", lw=7, label="published (a bar: a range)")
    axes[0].plot([], [], "o-", color="#1f77b4", label="cost model (a line: over the shapes checked)")
    fig.legend(loc="upper center", ncol=2, bbox_to_anchor=(0.5, 0.955), fontsize=8, frameon=False)
    fig.suptitle("The cost model beside every published figure it is checked on (H100, NVLink; "
                 "docs/cost_model.md), with its error", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def cost_checks_plot(ctx):
    data = cost_checks_data()
    return data, lambda: draw_cost_checks(data)


REVERSAL_SWEEPS = ("cpu", "cpu-long", "convergence")


def reversal_data(ctx, *, way="all-parallel"):
    """[{sweep, seeds, points: [[tokens in millions, mean, ci or None]]}]: the way's paired difference to all
    tp during training, in each sweep that ran it."""
    out = []
    for sweep in REVERSAL_SWEEPS:
        rows = ctx.rows(sweep)
        pairs = pairing.paired(rows)
        row = next((r for r in rows if pattern_name(r) == way and r["config"] in pairs), None)
        if row is None:
            continue
        p = pairs[row["config"]]
        out.append(dict(sweep=sweep, seeds=len(p["seeds"]), tokens=row["tokens"],
                        points=[[i * row["tokens_per_iter"] / 1e6, m, c] for i, m, c in p["curve"] if i > 0]))
    return out


def draw_reversal(data, *, way="all-parallel"):
    plt = pyplot()
    st = way_styles.style(way)
    fig, ax = plt.subplots(figsize=(10, 5.5))
    ax.axhline(0, color="black", lw=1.2, label="all tp, same seed")
    labels = []
    for k, s in enumerate(data):
        x, y = [p[0] for p in s["points"]], [p[1] for p in s["points"]]
        ls = ("-", "--", ":")[k % 3]
        ax.plot(x, y, ls=ls, marker=st.marker, ms=4, color=st.color, label=f"{s['sweep']}: {s['seeds']} "
                "paired seed" + ("s" if s["seeds"] != 1 else "") + f", {s['tokens'] / 1e6:.2f}M tokens")
        if all(p[2] is not None for p in s["points"]):
            ax.fill_between(x, [p[1] - p[2] for p in s["points"]], [p[1] + p[2] for p in s["points"]],
                            color=st.color, alpha=0.12)
        labels.append(ax.annotate(f"{s['sweep']} final {y[-1]:+.3f}", (x[-1], y[-1]), xytext=(6, 0),
                                  textcoords="offset points", va="center", fontsize=9, color=st.color))
    ax.set_xscale("log")
    ax.set_xlabel("training tokens (millions, log scale)")
    ax.set_ylabel(f"{st.name} minus all tp, same seed (nats/token)")
    ax.set_title(f"{st.name}: ahead of all tp early in training, behind it later (below 0: lower loss than "
                 "all tp)\neach sweep its own run: the learning rate decays to each one's last step; "
                 "band: 95% interval over the paired seeds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, hi * 2.2)
    fig.tight_layout()
    marks = [(p[0], p[1], p[1]) for s in data for p in s["points"]]
    plot_labels.separate(fig, labels, obstacles=lambda: plot_labels.mark_boxes(ax, marks, pad=3))
    return fig


def reversal_plot(ctx):
    data = reversal_data(ctx)
    return (data, lambda: draw_reversal(data)) if data else None
