"""
The figures a measuring command draws (`bench.py --plot=PNG`, decode or training under real TP, `spd.py`,
`python -m tpcomm.bench.trace plot`), each as plain data and a drawing of it: the command writes the PNG
(png.save_png: the data's digest inside) and the data beside it (<name>.data.json, atomically), so `python
experiment.py report` redraws and `report --check` compares a committed docs/ PNG (COMMAND_PNGS) against its
data file without rerunning the measurement. Reading a data file is json.load: nothing in it executes.
"""

import errno
import json
import os
import textwrap

from tpcomm.figures import plot_labels, png, way_styles
from tpcomm.experiments import ways
from tpcomm.model.options import compact_list

DATA_SUFFIX = ".data.json"
COMMAND_PNGS = ("docs/decode_latency_cpu_real.png", "docs/spd_shakespeare_tp4.png", "docs/trace_timeline.png",
                "docs/real_tp_step_breakdown.png")  # report checks these


def measured_on(ax, data, *, caveat=""):
    """The host a measuring command ran on, under the x axis's label (the title stays at two lines)."""
    if data.get("host"):
        note = "\n".join(textwrap.wrap(f"measured on {data['host']}{caveat}", 70))
        ax.set_xlabel(f"{ax.get_xlabel()}\n{note}")


def data_path(path):
    return os.path.splitext(path)[0] + DATA_SUFFIX


def write(fig, path, data):
    """The PNG (with the data's digest) and its data file beside it, each written whole or not at all, into a
    folder that exists (OSError otherwise)."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, "no such folder", folder)
    tmp = data_path(path) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    png.save_png(fig, path + ".tmp.png", data, made_by=f"figure {data['kind']}")
    os.replace(path + ".tmp.png", path)
    os.replace(tmp, data_path(path))
    return path


def load(path):
    """(data, draw) from a PNG's data file, or None when it has none."""
    try:
        with open(data_path(path)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    return data, lambda: DRAW[data["kind"]](data)


def host_note():
    """The host a timing ran on, for its figure: CPU cores and the load average when the figure was drawn (the
    measuring processes included), so a reader sees how loaded the host was."""
    one, _, fifteen = os.getloadavg()
    return (f"{os.cpu_count()} CPU cores, load average {one:.1f} (1 min) / {fifteen:.1f} (15 min) at the end "
            "of the run")


def decode_data(rows, *, cfg, device, prompt_len, host=None):
    """rows: bench.decode_bench's; cfg: bench's options; host: host_note()'s."""
    return dict(kind="decode", host=host,
                model=f"{cfg['n_layer']} layers x {cfg['n_embd']} wide, {cfg['n_head']} heads, "
                f"vocab {cfg['vocab_size']}",
                tp=f"tp {cfg['tp_size']} {cfg['tp_mode']}", device=str(device),
                prompt_len=prompt_len, new_tokens=cfg["new_tokens"],
                rows=[[r["pattern"], r["fwd_allreduces"], r["batch"], r["decode_ms"], r["collectives_ms"]]
                      for r in rows])


def way_of_pattern(label):
    """The key of the way (tpcomm/experiments/ways.py; one with a figure style and no sync option) whose
    block pattern a bench.py row's label names ('spd' for every layer, "['parallel','spd']*6" at any
    depth), else the label itself."""
    for w in ways.WAYS:
        if w.sync or not w.style:
            continue
        patterns = [w.blocks(n) for n in range(1, 97)]
        # 'spd' names all 'spd', not a track's start
        one_type = len({k for blocks in patterns for k in blocks}) == 1
        for blocks in patterns:
            if blocks and label == compact_list(blocks) or (one_type and label == blocks[0]):
                return w.key
    return label


def draw_decode(data):
    """ms per generated token against the forward all-reduces, one line per batch size; each x is one block
    pattern, named on the axis as the answer table names it."""
    plt = png.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.4))
    batches = sorted({r[2] for r in data["rows"]})
    # greys and markers: the ways' colours are for the ways (tpcomm/figures/way_styles.py)
    for k, b in enumerate(batches):
        grey, marker = f"{0.15 + 0.5 * k / max(1, len(batches) - 1):.2f}", "osD^v"[k % 5]
        pts = sorted((r[1], r[3], r[4]) for r in data["rows"] if r[2] == b)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ls="-", color=grey,
                label=f"batch {b}: decode ms/token")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], marker=marker, ls="--", mfc="none", color=grey,
                label=f"batch {b}: of it in collectives")
    names = {r[1]: r[0] for r in data["rows"]}
    labels = []
    for x, n in sorted(names.items()):  # each x is one block pattern: named above its highest point
        key = way_of_pattern(n)
        top = max(r[3] for r in data["rows"] if r[1] == x)
        labels.append(ax.annotate(way_styles.label(key), (x, top), xytext=(0, 9), textcoords="offset points",
                                  ha="center", fontsize=8, color=way_styles.style(key).color))
    ax.set_xticks(sorted(names))
    ax.set_xlim(-1, max(names) * 1.08)
    ax.set_ylim(0, max(r[3] for r in data["rows"]) * 1.15)
    ax.set_xlabel("forward all-reduces per generated token (measured), one block pattern each")
    fig.tight_layout()
    plot_labels.separate(fig, labels)
    ax.set_ylabel("ms per generated token (best of 3 rounds)")
    ax.set_title(f"Decode latency, {data['tp']} (gloo) on {data['device']}: a {data['model']} model (random "
                 f"weights),\ngreedy with a KV cache, a {data['prompt_len']}-token prompt then "
                 f"{data['new_tokens']} new tokens", fontsize=9)
    measured_on(ax, data)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def spd_data(result):
    """result: sync_point_drop's spd.json content."""
    c = result["conversion"]
    kl = next((s["loss"] for s in c["stages"] if s["stage"].startswith("+ KL")), None)
    return dict(kind="spd", tp_size=result["tp_size"], base_loss=result["base_loss"],
                tau_isb=result["tau_isb"], tau_esb=result["tau_esb"], kl=None if kl is None
                else [c["fwd_allreduces"], kl], kl_steps=result.get("settings", {}).get("kl_steps"),
                curve=[[r["fwd_allreduces"], r["zero_shot_loss"], r["recovered_loss"]]
                       for r in result["curve"]], blocks=[[b["block"], b["class"], b["single"], b["paper"]]
                                                          for b in result["blocks"]])


ZERO, RECOVERED, KL = "#b2182b", "#2166ac", "#1b7837"  # the SPD figure's three stages (no way's colour)


def _spd_curve(ax, hi, data, *, top):
    """The loss against the syncs kept in ax (up to top) and, when a zero-shot loss is above top, in hi: the
    same lines over the range of those losses (a broken y axis, so the one far point squashes nothing)."""
    xs, zero, rec = ([r[k] for r in data["curve"]] for k in range(3))
    base = data["base_loss"]
    for a in [ax] + ([hi] if hi else []):
        a.axhline(base, color="gray", ls="--", label="original (all tp)")
        a.plot(xs, zero, "o-", color=ZERO, label="zero-shot: blocks made 'spd', no training")
        a.plot(xs, rec, "s-", color=RECOVERED, label="recovered: head grouping + block-to-block "
               "distillation\n(each block trained to match the original block's output)")
        if data["kl"]:
            a.plot([data["kl"][0]], [data["kl"][1]], "*", ms=15, color=KL, ls="none", label=f"recovered, "
                   f"then {data['kl_steps']} steps of KL distillation from the original's logits")
    # the end points' values to their right, in room kept free of lines (the x axis runs right to fewer syncs)
    marks = [ax.annotate(f"recovered {rec[-1]:.4f} ({rec[-1] - base:+.3f})", (xs[-1], rec[-1]), xytext=(9, 0),
                         textcoords="offset points", ha="left", va="center", fontsize=8, color=RECOVERED)]
    if data["kl"]:
        kx, ky = data["kl"]
        marks.append(ax.annotate(f"+ KL {ky:.4f} ({ky - base:+.3f})", (kx, ky), xytext=(11, 0),
                                 textcoords="offset points", ha="left", va="center", fontsize=8, color=KL))
    far = [(x, z) for x, z in zip(xs, zero) if z > top]
    lows = [v for v in rec + zero + [base] + ([data["kl"][1]] if data["kl"] else []) if v <= top]
    ax.set_ylim(min(lows) - 0.08 * (top - min(lows)), top)
    if hi:
        lo_far, hi_far = min(z for _, z in far), max(z for _, z in far)
        pad = max(0.05, 0.3 * (hi_far - lo_far))
        hi.set_ylim(lo_far - pad, hi_far + pad)
        for x, z in far:
            marks.append(hi.annotate(f"zero-shot {z:.4f} ({z - base:+.3f})", (x, z), xytext=(9, 0),
                                     textcoords="offset points", ha="left", va="center", fontsize=8,
                                     color=ZERO))
        # the break: the two panels' facing spines hidden, a diagonal cut on each
        hi.spines.bottom.set_visible(False)
        ax.spines.top.set_visible(False)
        hi.tick_params(bottom=False, labelbottom=False)
        cut = dict(marker=[(-1, -0.5), (1, 0.5)], markersize=10, ls="none", color="k", mec="k", mew=1,
                   clip_on=False)
        hi.plot([0, 1], [0, 0], transform=hi.transAxes, **cut)
        ax.plot([0, 1], [1, 1], transform=ax.transAxes, **cut)
        hi.text(0.02, 0.92, "y axis broken: the upper panel\nshows the far zero-shot loss",
                transform=hi.transAxes, va="top", fontsize=8, color="0.3")
    ax.set_xlabel("forward all-reduces kept (blocks made 'spd', most tolerant first)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_xticks(xs)
    ax.set_xlim(max(xs) + 0.4, min(xs) - 0.35 * (max(xs) - min(xs)))  # reversed: fewer syncs to the right
    (hi or ax).set_title(f"tp_size {data['tp_size']}: syncs dropped block by block", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    return marks


def draw_spd(data):
    import numpy as np

    plt = png.pyplot()
    rec, zero, base = [r[2] for r in data["curve"]], [r[1] for r in data["curve"]], data["base_loss"]
    top = max(rec + [base]) + 1.5 * (max(rec) - base or 0.01)  # a zero-shot loss above this breaks the axis
    fig = plt.figure(figsize=(13, 6.6), layout="constrained")
    if max(zero) > top:
        grid = fig.add_gridspec(2, 2, height_ratios=[1, 3.5])
        hi = fig.add_subplot(grid[0, 0])
        a = fig.add_subplot(grid[1, 0], sharex=hi)
        b = fig.add_subplot(grid[:, 1])
    else:
        hi, (a, b) = None, fig.subplots(1, 2)
    marks = _spd_curve(a, hi, data, top=top)
    xs = np.arange(len(data["blocks"]))
    b.bar(xs - 0.2, [bl[2] for bl in data["blocks"]], 0.4, color="0.35", label="only this block 'spd'")
    b.bar(xs + 0.2, [bl[3] for bl in data["blocks"]], 0.4, color="0.7",
          label="this block 'spd', later blocks already 'spd'")
    for tau, name, what, ls in ((data["tau_isb"], "τ ISB", "below: insensitive block, dropped zero-shot",
                                 ":"), (data["tau_esb"], "τ ESB", "from here: extremely sensitive block",
                                        "--")):
        b.axhline(tau, color="k", ls=ls, lw=1, label=f"{name} = {tau:g} nats ({what})")
        b.annotate(f"{name} = {tau:g}", (1.0, tau), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                   textcoords="offset points", ha="right", va="bottom", fontsize=8)
    b.set_xticks(xs, [f"block {bl[0]}\n{bl[1]}" for bl in data["blocks"]])
    b.set_yscale("symlog", linthresh=max(data["tau_isb"], 1e-3))
    b.set_ylabel("validation loss increase (nats, symlog scale)")
    b.set_title("per-block sensitivity (ISB insensitive, SB sensitive, ESB extremely sensitive)", fontsize=9)
    b.legend(fontsize=8, loc="upper right")
    plot_labels.separate(fig, marks)
    return fig


def step_data(rows, *, cfg, device, host=None):
    """rows: bench.py's communication table (real TP): [name, ms/iter, in collectives, exposed] each; host:
    host_note()'s."""
    return dict(kind="steps", host=host,
                model=f"{cfg['n_layer']} layers x {cfg['n_embd']} wide, {cfg['n_head']} heads, "
                f"batch {cfg['batch_size']} x {cfg['block_size']} tokens", tp=f"tp {cfg['tp_size']} real",
                device=str(device), rows=[[r["name"], r["ms"], r["busy_ms"], r["exposed_ms"]] for r in rows])


STEP_VARIANTS = {"overlap2": ("tp_overlap=2", "hide"), "sp": ("sequence_parallel", "hide"),
                 "int8/32": ("all-tp-int8", "shrink")}  # bench.py's variant names -> (way_styles key, family)


def step_label(name):
    """(the answer table's name of a bench.py row such as 'spd +int8/32', its colour, its
    families): 'all spd + int8', 'drop + shrink'; a combination the table has no row for is
    named by both ways and drawn dark grey."""
    pattern, _, variant = name.partition(" +")
    key = way_of_pattern(pattern)
    families = [] if key == "all-tp" else ["delay" if key == "all-ladder" else "drop"]
    if not variant:
        return way_styles.label(key), way_styles.style(key).color, families
    vkey, family = STEP_VARIANTS.get(variant, (variant, "?"))
    both = f"{key}-int8" if vkey == "all-tp-int8" else None
    if key == "all-tp" or (both and way_styles.is_way(both)):
        key = vkey if key == "all-tp" else both
        return way_styles.label(key), way_styles.style(key).color, families + [family]
    return (f"{way_styles.label(key)} + {way_styles.label(vkey)}", "0.3",  # two ways at once: no way's colour
            families + [family])


def draw_steps(data):
    """One bar per pattern and variant: compute (the step less the exposed communication), the
    exposed communication, and beside it the communication that ran hidden behind compute (in
    collectives less exposed). Each row named as the answer table names the way, with its family
    (drop, hide, delay, shrink)."""
    plt = png.pyplot()
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(10, 2.6 + 0.38 * len(rows)), layout="constrained")
    ys = range(len(rows))[::-1]
    compute = [ms - exposed for _, ms, _, exposed in rows]
    ax.barh(ys, compute, color="0.75", label="compute (step time less exposed communication)")
    # greys and a hatch: the colours are the ways' (the row labels), as in every figure
    ax.barh(ys, [r[3] for r in rows], left=compute, color="0.3", label="exposed communication (step waits)")
    ax.barh(ys, [r[2] - r[3] for r in rows], left=[r[1] for r in rows], facecolor="none", edgecolor="0.45",
            hatch="///", lw=0.6, label="communication hidden behind compute (not in the step time)")
    for y, (_, ms, busy, exposed) in zip(ys, rows):
        ax.text(ms + max(0.0, busy - exposed), y, f" {ms:.1f} ms", va="center", fontsize=8)
    labels = [step_label(r[0]) for r in rows]
    ax.set_yticks(list(ys), [f"{name} ({' + '.join(fam) or 'baseline'})" for name, _, fam in labels],
                  fontsize=8)
    for tick, (_, colour, _) in zip(ax.get_yticklabels(), labels):
        tick.set_color(colour)
    ax.set_xlabel("ms per training step (best of 3 rounds)")
    lo, hi = ax.get_xlim()
    ax.set_xlim(0, hi * 1.12)
    ax.set_title(f"Where a training step's time goes (measured), {data['tp']} (gloo) on {data['device']}:\n"
                 f"{data['model']}", fontsize=9)
    measured_on(ax, data, caveat="; the small differences (int8's sign among them) move with the host's "
                "load: docs/benchmarks.md times them on a quiet one")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncol=2, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


TRACE_COLOURS = {"fwd": "tab:blue", "bwd": "tab:orange", "grad": "tab:green"}


def draw_trace(data):
    """tpcomm/bench/trace.plot_timeline's figure: a row per trace (step µs, compute intervals, collectives
    [ts, dur, fwd/bwd/grad]), the compute grey, the collectives coloured."""
    from matplotlib.patches import Patch

    plt = png.pyplot()
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(11, 1.3 + 0.75 * len(rows)))
    longest = max(r[0] for r in rows) / 1e3
    for i, (step_us, compute, events) in enumerate(rows):
        y = len(rows) - 1 - i
        ax.broken_barh([(a / 1e3, (b - a) / 1e3) for a, b in compute], (y - 0.3, 0.6), color="0.75", lw=0)
        for ts, dur, kind in events:
            ax.broken_barh([(ts / 1e3, dur / 1e3)], (y - 0.38, 0.76), facecolor=TRACE_COLOURS[kind],
                           edgecolor=TRACE_COLOURS[kind], lw=0.6)  # the edge keeps a short collective visible
        ax.text(step_us / 1e3 + 0.01 * longest, y, f"{step_us / 1e3:.1f} ms, {len(events)} collectives, "
                f"{sum(e[1] for e in events) / 1e3:.1f} ms in them", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), data["labels"][::-1], fontsize=9)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0, longest * 1.45)
    ax.set_xlabel("time within the training step (ms)")
    ax.set_title(data["title"] or "one training step (forward, backward, AdamW) of one rank", fontsize=10,
                 loc="left", pad=20)  # room for the legend between the title and the axes
    ax.legend(handles=[Patch(color="0.75", label="compute (ops)"),
                       Patch(color=TRACE_COLOURS["fwd"], label="forward all-reduce"),
                       Patch(color=TRACE_COLOURS["bwd"], label="backward all-reduce"),
                       Patch(color=TRACE_COLOURS["grad"], label="gradient sync")],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, ncol=4, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


DRAW = {"decode": draw_decode, "spd": draw_spd, "trace": draw_trace, "steps": draw_steps}
