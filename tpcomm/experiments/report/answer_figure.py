"""
The answer's figure, docs/answer_tradeoff.png (data: tpcomm/experiments/report/answer.tradeoff_plot): one
panel per network, each way of giving up a sync at its predicted step speedup (true x, log scale) against its
paired quality cost with its 95% interval, named beside its point in its way_styles colour and marker. Drawn
to be read at the README's width.

A point may carry "speedup_band": one [low, high] per network (the range of the predicted speedup); where it
does, a horizontal band is drawn through the point.
"""

import textwrap

from tpcomm.figures import plot_labels, way_styles

# assumed: the README's column on GitHub beside the repository's sidebar, 1280-px window
README_WIDTH_PX = 830
MIN_TEXT_PX = 11  # the smallest text at that width
FIG_WIDTH_IN = 9.0
MIN_FONT_PT = 9  # 9 pt at 120 dpi is 15 px; scaled by 830 / (9 in x 120 dpi) it is 11.5 px
TICKS = (0.4, 0.5, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 6, 8)


def text_px_at_readme_width(points, *, fig_width_in=FIG_WIDTH_IN):
    """The height in README pixels of text of `points` size in a figure `fig_width_in` wide shown
    README_WIDTH_PX wide (independent of the dpi it is saved at)."""
    return points / 72 * README_WIDTH_PX / fig_width_in


def _point(ax, p, x, k, *, floor):
    """Draw one way at (x, its cost); returns the y its label points at."""
    st = way_styles.style(p["key"])
    band = (p.get("speedup_band") or [None] * (k + 1))[k]
    y = p["mean"] if p["status"] == "measured" else 0.0 if p["status"] == "same math" else floor
    if band is not None:
        ax.plot(band, [y, y], color=st.color, lw=6, alpha=0.25, solid_capstyle="butt")
    if p["status"] == "measured":
        ax.errorbar([x], [y], yerr=[p["ci"]], fmt=st.marker, ms=8, capsize=4, color=st.color)
    elif p["status"] == "same math":
        ax.plot([x], [y], st.marker, mfc="white", mew=1.8, ms=9, color=st.color)
    else:
        ax.plot([x], [y], st.marker, mfc="none", ms=9, color=st.color, ls="")
    return y


def _panel(ax, data, k, *, floor, top):
    """One network's panel; returns its labels (for plot_labels.separate)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    link = data["links"][k]
    ax.axhline(0, color="black", lw=1)
    ax.axvline(1, color="grey", lw=1, ls=":")
    one = 0.01 * data["base_loss"]
    ax.axhline(one, color="grey", lw=1, ls="--")
    ax.annotate("1% of all tp's validation loss", (0.005, one), xycoords=("axes fraction", "data"),
                xytext=(0, 2), textcoords="offset points", va="bottom", fontsize=MIN_FONT_PT, color="0.35")
    labels = []
    xs = [p["speedup"][k] for p in data["points"]]
    for p, x in zip(data["points"], xs):
        y = _point(ax, p, x, k, floor=floor)
        st = way_styles.style(p["key"])
        labels.append(ax.annotate(st.name, (x, y), xytext=(9, 0), textcoords="offset points", va="center",
                                  ha="left", fontsize=MIN_FONT_PT + 1, color=st.color, weight="bold",
                                  arrowprops=dict(arrowstyle="-", color=st.color, lw=0.6, shrinkA=0,
                                                  shrinkB=5)))
    ax.set_xscale("log")
    lo, hi = min(xs) / 1.12, max(xs) * 1.6  # room on the right for the labels
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(FixedLocator([t for t in TICKS if lo <= t <= hi]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(lambda t, _: f"{t:g}x")
    ax.tick_params(labelsize=MIN_FONT_PT + 1)
    ax.set_ylim(floor - 0.003, top)
    ax.grid(alpha=0.3)
    ax.set_title(f"{link} (predicted speedup, x from {lo:.2g} to {hi:.2g})", fontsize=MIN_FONT_PT + 2,
                 loc="left")
    ax.annotate("better: faster, no costlier", xy=(1, 0), xycoords="axes fraction", xytext=(-6, 26),
                textcoords="offset points", ha="right", va="bottom", fontsize=MIN_FONT_PT, color="0.3",
                arrowprops=dict(arrowstyle="->", color="0.3", lw=1))  # the corner to be in: lower right
    return labels


def _legend(ax, points):
    """Only the encodings drawn: an error bar, a hollow marker (same math), a marker on the floor (pending);
    under the figure's lower panel (ax)."""
    from matplotlib.lines import Line2D

    drawn = {p["status"] for p in points}
    handles = [Line2D([], [], color="0.3", marker="o", ls="", label="measured: mean, 95% interval (seeds)")] \
        if "measured" in drawn else []
    if "same math" in drawn:
        handles.append(Line2D([], [], color="0.3", marker="D", mfc="white", ls="", label="0 by construction: "
                              "same math"))
    if "pending" in drawn:
        handles.append(Line2D([], [], color="0.3", marker="o", mfc="none", ls="", label="on the floor: cost "
                              "pending"))
    if any(p.get("speedup_band") for p in points):
        handles.append(Line2D([], [], color="0.3", lw=6, alpha=0.25, label="range of the predicted speedup"))
    # under the lower panel's x label, outside both panels: no point, interval or label of the data can reach
    # it
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=MIN_FONT_PT,
              frameon=False)


def draw_tradeoff(data, *, title):
    """The figure (two panels stacked, each its own x range); ways in data["left_out"] are named under it."""
    from tpcomm.figures.png import pyplot

    plt = pyplot()
    points = data["points"]
    measured = [p for p in points if p["status"] == "measured"]
    top = max([p["mean"] + p["ci"] for p in measured] + [0.01]) * 1.12
    pending = any(p["status"] == "pending" for p in points)
    floor = min([p["mean"] - p["ci"] for p in measured] + [0.0]) - (0.006 if pending else 0.0)
    n = len(data["links"])
    fig, axes = plt.subplots(n, 1, figsize=(FIG_WIDTH_IN, 4.6 * n + 1.6), sharey=True)
    axes = list(axes) if n > 1 else [axes]
    labels = [lab for k, ax in enumerate(axes) for lab in _panel(ax, data, k, floor=floor, top=top)]
    for ax in axes:
        ax.set_ylabel("val loss minus all tp's\n(nats/token, same seed)", fontsize=MIN_FONT_PT + 1)
    axes[-1].set_xlabel("predicted training-step speedup over Megatron-LM's all-tp step (log scale)",
                        fontsize=MIN_FONT_PT + 1)
    _legend(axes[-1], points)
    fig.suptitle("\n".join(textwrap.wrap(title, 95)[:2]), fontsize=MIN_FONT_PT, x=0.01, ha="left")
    left_out = data.get("left_out") or []
    if left_out:
        fig.text(0.01, 0.005, "Not drawn (no GPU prediction, the cost model does not price it): " +
                 ", ".join(left_out) + ".", fontsize=MIN_FONT_PT, va="bottom")
    fig.tight_layout(rect=(0, 0.03 if left_out else 0, 1, 1))
    plot_labels.separate(fig, labels, obstacles=lambda: [b for k, ax in enumerate(axes)
                                                         for b in plot_labels.mark_boxes(ax,
                                                                                         _marks(points, k,
                                                                                                floor=floor),
                                                                                         pad=7)])
    return fig



def _marks(points, k, *, floor):
    """(x, y low, y high) of each drawn point's marker and error bar, a pending one's on the floor
    (the labels keep off them)."""
    return [(p["speedup"][k], p["mean"] - p["ci"], p["mean"] + p["ci"]) if p["status"] == "measured" else
            (p["speedup"][k], floor, floor) if p["status"] == "pending" else (p["speedup"][k], 0.0, 0.0)
            for p in points]
