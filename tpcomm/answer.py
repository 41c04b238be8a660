"""
The README's answer (tpcomm/report.py writes it): each way of giving up a sync, its quality cost at 95% from the
cpu-long result files, and its predicted GPU step speedup from the cost model (gpu_speedups: the only place the
answer calls tpcomm/cost_model.py); the trade-off figure docs/answer_tradeoff.png draws the same.
"""

from tpcomm import answer_figure, pairing
from tpcomm.readings import bound, claim, data_warning, no_results, penalties, side_of


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
        ("delay", "all `ladder`", "all-ladder", "all-ladder"),
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
               "all-reduce behind its weight-gradient GEMM (docs/cost_model.md); `ladder` is priced as the repo runs it "
               "with `tp_async_grad=True` (the setting Megatron's baseline assumes): each module's forward all-reduce "
               "behind the next module's compute, and its backward one behind the previous module's backward "
               "(docs/overlap.md)")
    checks = [(what, end, cm.error(m, p)) for what, published, model in cm.published_checks(cfg, cm.options(cfg))
              for end, m, p in (zip(("low ", "high "), model, published) if isinstance(published, tuple)
                                else [("", model, published)])]
    return out, [link.name for link in cm.LINKS], assumes, checks


def _short(p):
    """'+0.020 [-0.005, +0.044] (2)': a paired difference, its 95% interval and its seeds, in 3 decimals."""
    return f"{pairing.fmt_ci(p[0], p[1], 3)} ({p[2]})"


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
        (lo, lo_pct), (hi, hi_pct) = bound(bounded[0][0], loss), bound(bounded[-1][0], loss)
        first = (f"After {base['tokens'] / 1e6:.2f}M tokens the 95% intervals rule out costs above "
                 f"{lo} nats ({ANSWER_LABELS[bounded[0][1]]}) to {hi} ({ANSWER_LABELS[bounded[-1][1]]}), "
                 f"{lo_pct} to {hi_pct} of all `tp`'s {loss:.3f}"
                 + (f", so a cost under 1% is not yet shown for {', '.join(wide)}" if wide else "")
                 + (f"; {costs}" if costs else "") + ".")
    else:
        first = (f"After {base['tokens'] / 1e6:.2f}M tokens, at 95%: {costs}." if costs else
                 "No pattern has 2 paired seeds yet.")
    out = [first]
    hide, delay, half = gpu["tp_overlap=2"], gpu["all-ladder"], gpu["all-spd"]
    out.append(f"On GPUs (predicted, {GPU_SHAPE} at tp {GPU_TP}), hiding the syncs (`tp_overlap=2`, same math) "
               f"recovers {_share(hide[nv], half[nv])} of what dropping half of them (all `spd`) saves on "
               f"{nv.split(' (')[0]} ({hide[nv]:.2f}x against {half[nv]:.2f}x) and {_share(hide[ib], half[ib])} over "
               f"{ib.split(' (')[0]} ({hide[ib]:.2f}x against {half[ib]:.2f}x); delaying them (all `ladder`) "
               f"{_share(delay[nv], half[nv])} and {_share(delay[ib], half[ib])} ({delay[nv]:.2f}x and "
               f"{delay[ib]:.2f}x).")
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
        points.append(dict(way=way, label=what.replace("`", ""), key=run or variant, status=status, mean=mean,
                           ci=ci, seeds=n, speedup=[gpu[variant][name] for name in links]))
    data = dict(points=points, links=[n.split(" (")[0] for n in links], base_loss=base["val_loss_mean"],
                left_out=[what.replace("`", "") for _, what, _, variant in WAYS if variant is None])
    title = (f"Each way of giving up a sync: its quality cost, measured on CPU (y; cpu-long: a "
             f"{base['params_total'] / 1e6:.1f}M-parameter character model, {base['tokens'] / 1e6:.2f}M tokens, tp "
             f"{base['tp_size']}), against its training-step speedup, predicted for GPUs by the cost model "
             f"(x; {GPU_SHAPE} at tp {GPU_TP}, H100; the assumptions: the README, under the answer's table)")
    return data, lambda: answer_figure.draw_tradeoff(data, title=title)
