"""Every figure reads at a glance: each way has one name (the answer table's), one colour and one marker in
every figure (tpcomm/figures/way_styles.py); no two legend entries read the same; no two texts overprint
(their drawn boxes, plot_labels.overlapping); the headline figure keeps every point at its true x and its text
readable at the README's width. The figures are the report's (report.plot_specs), drawn from the committed
result files, as committed."""

import os

import pytest
from matplotlib.colors import to_hex

from tpcomm import ROOT
from tpcomm.experiments.report import answer, answer_figure, report
from tpcomm.figures import plot_labels, png, way_styles

NAMES = sorted((s.name for s in way_styles.styles().values()), key=len, reverse=True)


def way_of(text):
    """The way a legend entry or label names (it starts with the way's name), or None."""
    return next((n for n in NAMES if text == n or text.startswith((n + " ", n + ":"))), None)


def colour_of(handle):
    """A legend handle's colour: a line's, else the first face colour (a patch or a collection)."""
    import numpy as np

    color = handle.get_color() if hasattr(handle, "get_color") else handle.get_facecolor()
    color = np.asarray(color) if not isinstance(color, str) else color
    return to_hex(color if isinstance(color, str) else tuple(color.reshape(-1, color.shape[-1])[0]))


def legend_entries(fig):
    """[(text, colour)] of every legend of the figure."""
    out = []
    for leg in [ax.get_legend() for ax in fig.axes] + fig.legends:
        if leg is None:
            continue
        for text, handle in zip(leg.get_texts(), leg.legend_handles):
            out.append((text.get_text(), colour_of(handle)))
    return out


def way_colours(figs):
    """{way name: {colour}} over the legends and the direct labels of the figures."""
    seen = {}
    for fig in figs.values():
        labels = [(t.get_text(), to_hex(t.get_color())) for ax in fig.axes for t in ax.texts]  # direct labels
        for text, color in legend_entries(fig) + labels:
            if way_of(text) is not None:
                seen.setdefault(way_of(text), set()).add(color)
    return seen


def duplicates(fig):
    texts = [t for t, _ in legend_entries(fig)]
    return sorted({t for t in texts if texts.count(t) > 1})


@pytest.fixture(scope="module")
def figures():
    """{PNG path: (data, figure)} of every report figure the committed result files give."""
    plt = png.pyplot()
    ctx = report.Results(say=lambda *a: None)
    out = {}
    for rel, (_, spec) in report.plot_specs().items():
        made = spec(ctx)
        if made is not None:
            out[rel] = (made[0], made[1]())
    yield out
    for _, fig in out.values():
        plt.close(fig)


def titles(fig):
    """Every title text of a figure: its suptitle and each axes' three title slots."""
    texts = [fig._suptitle] + [t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
    return [t.get_text() for t in texts if t is not None and t.get_text()]


def test_every_title_is_at_most_two_lines(figures):
    """A figure carries its message at a glance: no title (figure or panel) over 2
    lines; the rest is in the docs."""
    long = {rel: t for rel, (_, fig) in figures.items() for t in titles(fig) if t.count("\n") > 1}
    assert long == {}, long
    plt = png.pyplot()
    fig, ax = plt.subplots()
    ax.set_title("one\ntwo\nthree")
    assert titles(fig) == ["one\ntwo\nthree"]  # the check can fail
    plt.close(fig)


def test_a_loss_curve_panel_has_at_most_six_lines(figures):
    _, fig = figures["docs/val_loss_curves.png"]
    assert len(fig.axes) > 1 and all(len(ax.lines) <= 6 for ax in fig.axes), [len(ax.lines)
                                                                              for ax in fig.axes]


def test_the_ways_are_named_as_the_answer_table_names_them():
    for _, what, run, variant in answer.way_rows():
        assert way_styles.style(run or variant).name == what.replace("`", ""), what
    for run, text in answer.answer_labels().items():
        assert way_styles.style(run).name == text.replace("`", ""), run
    styles = list(way_styles.styles().values())
    assert len({s.color for s in styles}) == len({s.name for s in styles}) == len(styles)  # one colour each


def test_one_colour_per_way_and_no_repeated_legend_entry(figures):
    figs = {rel: fig for rel, (_, fig) in figures.items()}
    assert len(figs) >= 8, sorted(figs)
    for rel, fig in figs.items():
        assert duplicates(fig) == [], rel
    seen = way_colours(figs)
    assert {"all spd", "all parallel", "int8", "tp_overlap=2", "all ladder"} <= set(seen), sorted(seen)
    for name, colors in seen.items():
        assert colors == {to_hex(way_styles.styles()[k].color) for k in way_styles.styles()
                          if way_styles.styles()[k].name == name}, name


def test_the_checks_can_fail():
    """A way drawn in two colours, a repeated legend entry and two texts on one spot are each caught."""
    plt = png.pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], color="tab:red", label="all spd")
    ax.plot([0, 1], [1, 0], color="tab:blue", label="all spd")
    ax.annotate("all spd -0.011", (0.5, 0.5), color="tab:green")
    ax.annotate("+0.001", (0.5, 0.5))
    ax.legend()
    assert duplicates(fig) == ["all spd"]
    assert len(way_colours({"x": fig})["all spd"]) == 3
    assert ("all spd -0.011", "+0.001") in plot_labels.overlapping(fig)
    plt.close(fig)


def test_no_two_texts_overprint(figures):
    for rel, (_, fig) in figures.items():
        assert plot_labels.overlapping(fig) == [], rel


def test_no_text_is_cut_off(figures):
    """Every text inside the figure's edges (a label moved past the left edge was cut in half, found in
    docs/answer_tradeoff.png), and the check can fail."""
    for rel, (_, fig) in figures.items():
        assert plot_labels.cut_off(fig) == [], rel
    plt = png.pyplot()
    fig, ax = plt.subplots()
    ax.annotate("past the edge", (0.0, 0.5), xytext=(-200, 0), textcoords="offset points", ha="right")
    assert plot_labels.cut_off(fig) == ["past the edge"]
    plt.close(fig)


def test_separate_moves_labels_off_each_other():
    plt = png.pyplot()
    fig, ax = plt.subplots()
    labels = [ax.annotate(f"label {k}", (0.5, 0.5), xytext=(5, 0), textcoords="offset points")
              for k in range(4)]
    assert len(plot_labels.overlapping(fig)) == 6
    plot_labels.separate(fig, labels)
    assert plot_labels.overlapping(fig) == []
    assert all(a.xy == (0.5, 0.5) for a in labels)  # the points stay where they are
    plt.close(fig)


def test_the_headline_figure_reads_at_the_readme_width(figures):
    """Labelled directly at each point's true x (no footer key), log scale said, only drawn legend entries,
    the ways left out named, the 1% line labelled, every text at least 11 px at the README's width."""
    data, fig = figures["docs/answer_tradeoff.png"]
    axes = fig.axes
    assert len(axes) == len(data["links"]) == 2
    for k, ax in enumerate(axes):
        named = {t.get_text(): t.xy for t in ax.texts if hasattr(t, "xy") and way_of(t.get_text())}
        for p in data["points"]:
            name = way_styles.style(p["key"]).name
            assert named[name][0] == p["speedup"][k], name  # at its true x
        assert ax.get_xscale() == "log"
        assert "1% of all tp's validation loss" in [t.get_text() for t in ax.texts]
    assert "(log scale)" in axes[-1].get_xlabel()
    texts = [t.get_text() for t in plot_labels.texts(fig)]
    assert any("ladder in the upper half" in t and "Not drawn" in t for t in texts)
    assert not any(t.startswith(("1 drop", "2 drop")) for t in texts)  # no numbered key
    legend = [t for t, _ in legend_entries(fig)]
    pending = any(p["status"] == "pending" for p in data["points"])  # a legend entry only for what is drawn
    assert any("pending" in t for t in legend) == pending
    assert any("range" in t for t in legend) == any(p.get("speedup_band") for p in data["points"])
    smallest = min(t.get_fontsize() for t in plot_labels.texts(fig))
    assert answer_figure.text_px_at_readme_width(smallest, fig_width_in=fig.get_figwidth()) >= 11
    assert answer_figure.text_px_at_readme_width(7, fig_width_in=13) < 11  # the old figure's size fails


def test_the_headline_figure_draws_a_speedup_band_where_the_data_has_one(figures):
    data, _ = figures["docs/answer_tradeoff.png"]
    banded = dict(data, points=[dict(p, speedup_band=[[0.9 * s, 1.1 * s] for s in p["speedup"]])
                                for p in data["points"]])
    fig = answer_figure.draw_tradeoff(banded, title="t")
    ax = fig.axes[0]
    first = banded["points"][0]["speedup_band"][0]
    assert any(list(line.get_xdata()) == first for line in ax.lines)
    assert "range of the predicted speedup" in [t for t, _ in legend_entries(fig)]
    assert png.data_digest(banded) != png.data_digest(data)
    png.pyplot().close(fig)


def test_the_budget_sweep_is_one_line_and_its_variants_markers(figures):
    """No vertical segment joins unrelated configs at one x; the early-training
    figure says so, with its seeds."""
    data, fig = figures["docs/val_loss_vs_allreduces.png"]
    ax = fig.axes[0]
    (line,) = [ln for ln in ax.lines if len(ln.get_xdata()) > 1]
    xs = list(line.get_xdata())
    assert xs == sorted(set(xs)) and 24 in xs and 1 in xs
    variants = [p for s in data for p in s["points"] if p[6]]
    assert len(variants) >= 5 and all(way_styles.is_way(p[5]) for p in variants)
    # the title and the footer
    said = lambda fig: fig.axes[0].get_title() + " ".join(t.get_text() for t in fig.texts)  # noqa: E731
    assert "early training" in said(fig) and "1 seed" in said(fig)
    throughput = figures["docs/tokens_per_s_vs_allreduces.png"][1]  # the same runs' throughput
    assert "early training" in said(throughput) and "1 seed" in said(throughput)


def test_patterns_that_are_no_way_are_told_apart(figures):
    """Two budget patterns with the same forward all-reduces share a grey; their markers differ, in the curves
    figure as everywhere (chosen from the pattern's name)."""
    lines = [ln for ax in figures["docs/val_loss_curves.png"][1].axes for ln in ax.lines
             if ln.get_label().endswith("all-reduces)")]  # way_styles.label of a pattern that is no way
    looks = [(ln.get_color(), ln.get_marker()) for ln in lines]
    assert len(lines) >= 3 and len(set(looks)) == len(looks), looks
    a, b = (way_styles.style(k, fwd_allreduces=18) for k in ("['tp','spd']*6", "['tp','spd','spd']*4"))
    assert a.color == b.color and a.marker != b.marker


def test_the_axes_figures_draw_no_trend_and_say_seeds_and_tokens(figures):
    for rel in ("docs/axes_penalty_vs_tp.png", "docs/axes_penalty_vs_size.png"):
        data, fig = figures[rel]
        ax = fig.axes[0]
        joined = [ln for ln in ax.lines if len(ln.get_xdata()) > 1 and ln.get_linestyle() not in ("None", "")
                  and list(ln.get_xdata()) != [0, 1]]
        assert joined == [], rel
        seeds = {t.get_text() for t in ax.texts}
        assert {str(p[3]) for s in data for p in s["points"]} <= seeds, rel
    size_ticks = [t.get_text() for t in figures["docs/axes_penalty_vs_size.png"][1].axes[0].get_xticklabels()]
    assert all("M tokens" in t for t in size_ticks), size_ticks


def test_the_missing_figures_are_drawn_from_their_data_and_linked(figures):
    """The cost model beside each published figure (every check, its error as cost_model.error gives it) and
    all parallel's paired difference during training in each sweep that ran it, ending at the sweep's final
    paired difference; both registered with the report (digest-checked) and linked from their docs page."""
    from tpcomm.costmodel import cost_model as cm
    from tpcomm.experiments import pairing

    checks, _ = figures["docs/cost_model_checks.png"]
    cfg = cm.PREDICT_DEFAULTS
    published = cm.published_checks(cfg, cm.options(cfg))
    assert [c[0] for c in checks] == [p[0] for p in published]
    for (_, pub, model, err), (_, p, m) in zip(checks, published):
        p, m = (p if isinstance(p, tuple) else (p, p)), (m if isinstance(m, tuple) else (m, m))
        assert err == pytest.approx([cm.error(m[0], p[0]), cm.error(m[1], p[1])])
    reversal, _ = figures["docs/parallel_reversal.png"]
    ctx = report.Results(say=lambda *a: None)
    assert [s["sweep"] for s in reversal] == ["cpu", "cpu-long", "convergence"]
    for s in reversal:
        rows = ctx.rows(s["sweep"])
        (row,) = [r for r in rows if r["block_pattern"] == "['parallel']*12" and not r.get("tp_comm_dtype")]
        assert s["points"][-1][1] == pytest.approx(pairing.paired(rows)[row["config"]]["final"][0], abs=1e-12)
    moved = [dict(s, points=[[x, m + 0.001, c] for x, m, c in s["points"]]) for s in reversal]
    assert png.data_digest(moved) != png.data_digest(reversal)  # a changed result changes the digest
    for name, page in (("cost_model_checks.png", "cost_model.md"), ("parallel_reversal.png", "axes.md")):
        assert f"docs/{name}" in report.plot_specs()
        with open(f"{ROOT}/docs/{page}", encoding="utf-8") as f:
            assert f"]({name})" in f.read(), page


SPD = dict(kind="spd", tp_size=4, base_loss=1.87, tau_isb=0.01, tau_esb=0.1, kl=[6, 1.88], kl_steps=200,
           curve=[[12, 1.87, 1.87], [11, 1.876, 1.876], [10, 1.885, 1.885], [9, 1.89, 1.89],
                  [8, 1.897, 1.897],
                  [7, 1.91, 1.90], [6, 2.52, 1.907]],
           blocks=[[0, "ESB", 0.6, 0.6], [1, "ISB", 0.005, 0.004], [2, "ISB", 0.007, 0.006],
                   [3, "SB", 0.02, 0.019],
                   # made-up, the shape of docs/spd.md's
                   [4, "ISB", 0.003, 0.0025], [5, "ISB", 0.004, 0.004]])
DECODE = dict(kind="decode", model="12 layers x 128 wide, 8 heads, vocab 65", tp="tp 2 real", device="cpu",
              prompt_len=32, new_tokens=32, rows=[[p, f, b, 2.0 + f + b / 8, 1.0 + f / 2] for p,
                                                  f in (("tp", 24), ("spd", 12), ("parallel", 1))
                                                  for b in (1, 4, 16)])


def test_the_command_figures_carry_their_data_and_report_check_sees_a_stale_one(tmp_path, capsys):
    """The decode and SPD figures: the zero-shot point off the axis is named, not squashing the
    rest; the KL-recovered point drawn; the thresholds and B2B named; the decode title names the
    model, prompt and tokens. Written with their data file, a committed copy is compared by `report
    --check`: a changed number fails it."""
    from tpcomm.figures import command_figures as cf

    def texts_of(fig):
        return [t.get_text() for t in plot_labels.texts(fig)]

    for data in (SPD, DECODE):
        fig = cf.DRAW[data["kind"]](data)
        assert plot_labels.overlapping(fig) == [], data["kind"]
        texts = " ".join(texts_of(fig))
        if data is SPD:  # the far zero-shot point in its own panel: the lower panel's range is the rest's
            lower = [ax for ax in fig.axes if ax.get_ylabel().startswith("validation loss (nats/token)")][0]
            assert lower.get_ylim()[1] < 2.0 and max(r[1] for r in SPD["curve"]) > 2.5
        if data is SPD:
            assert ("zero-shot 2.5200 (+0.650)" in texts and "y axis broken" in texts and "KL "
                    "distillation" in texts)
            assert "+ KL 1.8800 (+0.010)" in texts and "recovered 1.9070 (+0.037)" in texts
            assert ("τ ISB = 0.01 nats" in texts and "block-to-block distillation" in texts
                    and "B2B" not in texts)
        else:
            assert "12 layers x 128 wide" in texts and "32-token prompt then 32 new tokens" in texts
            assert {"all tp", "all spd", "all parallel"} <= set(texts_of(fig))  # each x named as its way
        png.pyplot().close(fig)
    (tmp_path / "docs").mkdir()
    spd_png = str(tmp_path / "docs" / "spd_shakespeare_tp4.png")
    cf.write(cf.DRAW["spd"](SPD), spd_png, SPD)
    def check():  # the command figures' lines (the report's own figures have no result files here)
        lines = report.update_plots(report.Results(root=str(tmp_path)), lambda deps: True, check=True,
                                    root=str(tmp_path), say=print)
        return [line for line in lines if any(rel in line for rel in cf.COMMAND_PNGS)]

    assert check() == []
    import json

    with open(cf.data_path(spd_png), "w") as f:
        json.dump(dict(SPD, base_loss=1.9), f)
    assert check() == ["docs/spd_shakespeare_tp4.png: its data digest differs from the result files'"]


def test_report_check_fails_on_a_figure_without_its_data(tmp_path):
    """A committed docs/ PNG that carries no checkable digest fails `report --check`: a command's figure
    without its data file, a figure nothing registers, a data file that no longer draws; the same files pass
    once written by command_figures.write (anti-vacuity: the check is not failing on everything)."""
    from tpcomm.figures import command_figures as cf

    (tmp_path / "docs").mkdir()

    def check():  # less the report's own figures that need no result files (missing here)
        return [line for line in report.update_plots(report.Results(root=str(tmp_path)), lambda deps: True,
                                                     check=True, root=str(tmp_path), say=print)
                if not line.endswith(": missing")]

    decode = str(tmp_path / "docs" / "decode_latency_cpu_real.png")
    png.save_png(cf.DRAW["decode"](DECODE), decode, DECODE)  # a digest, but no data file beside it
    assert check() == ["docs/decode_latency_cpu_real.png: has no data file "
                       "(decode_latency_cpu_real.data.json) beside it: draw it with the command its docs "
                       "page shows"]
    cf.write(cf.DRAW["decode"](DECODE), decode, DECODE)
    assert check() == []
    stray = tmp_path / "docs" / "hand_drawn.png"
    stray.write_bytes(open(decode, "rb").read())
    assert [line.split(":")[0] for line in check()] == ["docs/hand_drawn.png"]
    stray.unlink()
    import json

    with open(cf.data_path(decode), "w") as f:
        json.dump(dict(DECODE, rows=[["tp", 24, 1]]), f)  # hand-edited: a row too short to draw
    (line,) = check()
    assert line.startswith("docs/decode_latency_cpu_real.png: its data file does not draw"), line


def test_every_committed_figure_carries_its_data_digest():
    """Each docs/*.png is registered with the report and carries a digest; a command's figure has its data
    file, whose digest is the one in the PNG (what `report --check` compares, without the result files)."""
    from tpcomm.figures import command_figures as cf

    assert report.unregistered_pngs(ROOT) == []
    for rel in report.plot_specs():
        path = f"{ROOT}/{rel}"
        if not os.path.exists(path):
            continue
        assert png.png_digest(path) is not None, rel
        if rel in cf.COMMAND_PNGS:
            data, _ = cf.load(path)
            assert png.png_digest(path) == png.data_digest(data), rel


def test_the_step_breakdown_names_each_row_as_a_way_with_its_family():
    """bench.py's rows ('spd +int8/32') read as the answer table's ways, with drop / hide / delay / shrink."""
    from tpcomm.figures import command_figures as cf

    names = {row: (name, families) for row in ("tp", "tp +overlap2", "tp +sp", "tp +int8/32", "spd", "spd "
                                               "+int8/32", "['parallel','spd']*6 +overlap2", "ladder",
                                               "ladder +int8/32") for name, _,
             families in [cf.step_label(row)]}
    assert names == {"tp": ("all tp", []), "tp +overlap2": ("tp_overlap=2", ["hide"]), "tp "
                     "+sp": ("sequence parallelism", ["hide"]), "tp +int8/32": ("int8", ["shrink"]),
                     "spd": ("all spd", ["drop"]), "spd +int8/32": ("all spd + int8", ["drop", "shrink"]),
                     "['parallel','spd']*6 +overlap2": ("tracks D=2 ['parallel','spd']*6 + tp_overlap=2",
                                                        ["drop", "hide"]), "ladder": ("all ladder",
                                                                                      ["delay"]), "ladder "
                     "+int8/32": ("all ladder + int8", ["delay", "shrink"])}
    assert cf.step_label("spd +int8/32")[1] == way_styles.styles()["all-spd-int8"].color
    # no way's
    assert cf.step_label("spd +overlap2")[1] not in {s.color for s in way_styles.styles().values()}
