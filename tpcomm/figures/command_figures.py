"""
The figures a measuring command draws (`bench.py --plot=PNG`, decode or training under real TP, `spd.py`,
`python -m tpcomm.bench.trace plot`), each as plain data and a
drawing of it: the command writes the PNG (png.save_png: the data's digest inside) and the data beside it
(<name>.data.json, atomically), so `python experiment.py report` redraws and `report --check` compares a committed
docs/ PNG (COMMAND_PNGS) against its data file without rerunning the measurement. Reading a data file is json.load:
nothing in it executes.
"""

import errno
import json
import os

from tpcomm.figures import png

DATA_SUFFIX = ".data.json"
COMMAND_PNGS = ("docs/decode_latency_cpu_real.png", "docs/spd_shakespeare_tp4.png", "docs/trace_timeline.png",
                "docs/real_tp_step_breakdown.png")  # report checks these


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
    png.save_png(fig, path + ".tmp.png", data)
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


def decode_data(rows, *, cfg, device, prompt_len):
    """rows: bench.decode_bench's; cfg: bench's options."""
    return dict(kind="decode", model=f"{cfg['n_layer']} layers x {cfg['n_embd']} wide, {cfg['n_head']} heads, vocab "
                f"{cfg['vocab_size']}", tp=f"tp {cfg['tp_size']} {cfg['tp_mode']}", device=str(device),
                prompt_len=prompt_len, new_tokens=cfg["new_tokens"],
                rows=[[r["pattern"], r["fwd_allreduces"], r["batch"], r["decode_ms"], r["collectives_ms"]]
                      for r in rows])


def draw_decode(data):
    plt = png.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for b in sorted({r[2] for r in data["rows"]}):
        pts = sorted((r[1], r[3], r[4]) for r in data["rows"] if r[2] == b)
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"batch {b}: decode ms/token")
        ax.plot([p[0] for p in pts], [p[2] for p in pts], "x--", color=line.get_color(),
                label=f"batch {b}: of it in collectives")
    ax.set_xlabel("forward all-reduces per generated token (measured)")
    ax.set_ylabel("ms per generated token (best of 3 rounds)")
    ax.set_title(f"Decode latency, {data['tp']} on {data['device']}: a {data['model']} model\n(random weights), "
                 f"greedy with a KV cache, a {data['prompt_len']}-token prompt then {data['new_tokens']} new tokens",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def spd_data(result):
    """result: sync_point_drop's spd.json content."""
    c = result["conversion"]
    kl = next((s["loss"] for s in c["stages"] if s["stage"].startswith("+ KL")), None)
    return dict(kind="spd", tp_size=result["tp_size"], base_loss=result["base_loss"], tau_isb=result["tau_isb"],
                tau_esb=result["tau_esb"], kl=None if kl is None else [c["fwd_allreduces"], kl],
                kl_steps=result.get("settings", {}).get("kl_steps"),
                curve=[[r["fwd_allreduces"], r["zero_shot_loss"], r["recovered_loss"]] for r in result["curve"]],
                blocks=[[b["block"], b["class"], b["single"], b["paper"]] for b in result["blocks"]])


def _spd_curve(ax, data):
    xs, zero, rec = ([r[k] for r in data["curve"]] for k in range(3))
    ax.plot(xs, rec, "s-", color="#1f77b4", label="recovered: head grouping + block-to-block (B2B) distillation")
    top = max(rec + [data["base_loss"]]) + 2 * (max(rec) - data["base_loss"] or 0.01)
    ax.plot(xs, [min(z, top) for z in zero], "o-", color="#d62728", label="zero-shot (no training)")
    for x, z in zip(xs, zero):
        if z > top:  # off the axis: its value said instead of squashing the others
            ax.plot([x], [top], "^", ms=10, color="#d62728")
            ax.annotate(f"zero-shot {z:.3f}\n(off the axis)", (x, top), xytext=(-10, 0), textcoords="offset points",
                        ha="right", va="top", fontsize=8, color="#d62728")
    if data["kl"]:
        ax.plot([data["kl"][0]], [data["kl"][1]], "*", ms=14, color="#2ca02c",
                label=f"+ {data['kl_steps']} steps of KL distillation from the original's logits")
    ax.axhline(data["base_loss"], color="gray", ls="--", label="original (all 'tp')")
    ax.set_ylim(top=top + 0.1 * (top - min(rec + [data["base_loss"]])))
    ax.set_xlabel("forward all-reduces kept")
    ax.set_ylabel("validation loss (nats/token)")
    ax.invert_xaxis()
    ax.set_title(f"tp_size {data['tp_size']}: syncs dropped block by block, most tolerant first", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def draw_spd(data):
    import numpy as np

    plt = png.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    _spd_curve(a, data)
    xs = np.arange(len(data["blocks"]))
    b.bar(xs - 0.2, [bl[2] for bl in data["blocks"]], 0.4, label="only this block 'spd'")
    b.bar(xs + 0.2, [bl[3] for bl in data["blocks"]], 0.4, label="this block 'spd', later blocks already 'spd'")
    for tau, name, what in ((data["tau_isb"], "τ ISB", "below: insensitive block"),
                            (data["tau_esb"], "τ ESB", "above: extremely sensitive block")):
        b.axhline(tau, color="gray", ls=":" if name == "τ ISB" else "--", label=f"{name} = {tau:g} nats ({what})")
    b.set_xticks(xs, [f"block {bl[0]}\n{bl[1]}" for bl in data["blocks"]])
    b.set_yscale("symlog", linthresh=max(data["tau_isb"], 1e-3))
    b.set_ylabel("validation loss increase (nats, symlog scale)")
    b.set_title("per-block sensitivity (class: ISB insensitive, SB sensitive, ESB extremely sensitive)", fontsize=9)
    b.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def step_data(rows, *, cfg, device):
    """rows: bench.py's communication table (real TP): [name, ms/iter, in collectives, exposed] each."""
    return dict(kind="steps", model=f"{cfg['n_layer']} layers x {cfg['n_embd']} wide, {cfg['n_head']} heads, "
                f"batch {cfg['batch_size']} x {cfg['block_size']} tokens", tp=f"tp {cfg['tp_size']} real",
                device=str(device), rows=[[r["name"], r["ms"], r["busy_ms"], r["exposed_ms"]] for r in rows])


def draw_steps(data):
    """One bar per pattern and variant: compute (the step less the exposed communication), the exposed
    communication, and beside it the communication that ran hidden behind compute (in collectives less exposed)."""
    plt = png.pyplot()
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(10, 2.2 + 0.38 * len(rows)))
    ys = range(len(rows))[::-1]
    compute = [ms - exposed for _, ms, _, exposed in rows]
    ax.barh(ys, compute, color="0.75", label="compute (step time less exposed communication)")
    ax.barh(ys, [r[3] for r in rows], left=compute, color="#d62728", label="exposed communication (step waits)")
    ax.barh(ys, [r[2] - r[3] for r in rows], left=[r[1] for r in rows], color="#2ca02c", alpha=0.5,
            label="communication hidden behind compute (not in the step time)")
    for y, (_, ms, busy, exposed) in zip(ys, rows):
        ax.text(ms + max(0.0, busy - exposed), y, f" {ms:.1f} ms a step", va="center", fontsize=8)
    ax.set_yticks(list(ys), [r[0] for r in rows], fontsize=8)
    ax.set_xlabel("ms per training step (best of 3 rounds)")
    lo, hi = ax.get_xlim()
    ax.set_xlim(0, hi * 1.12)
    ax.set_title(f"Where a training step's time goes, {data['tp']} on {data['device']} (measured): {data['model']}",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


TRACE_COLOURS = {"fwd": "tab:blue", "bwd": "tab:orange", "grad": "tab:green"}


def draw_trace(data):
    """tpcomm/bench/trace.plot_timeline's figure: a row per trace (step µs, compute intervals, collectives [ts, dur,
    fwd/bwd/grad]), the compute grey, the collectives coloured."""
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
