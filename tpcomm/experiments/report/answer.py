"""
The README's answer (tpcomm/experiments/report/report.py writes it): each way of giving up a sync, its quality
cost at 95% from the cpu-long result files, and its predicted GPU step speedup from the cost model
(gpu_speedups: the only place the answer calls tpcomm/costmodel/cost_model.py); the trade-off figure
docs/answer_tradeoff.png draws the same.
"""

import re

from tpcomm.experiments.report import answer_figure
from tpcomm.costmodel import cost_bands
from tpcomm.experiments import pairing, provenance
from tpcomm.experiments.readings import (MIN_SEEDS, bound, claim, data_warning, decimals, host_cell,
                                         no_results, interval_text, penalties, planned_seeds, side_of)
from tpcomm.experiments import ways


def way_rows():
    """The README table's rows, one per way of giving up a sync (tpcomm/experiments/ways.py,
    Way.answer): (category, what, cpu-long run name or None (not trained: the math is all tp's, 0 by
    construction), the GPU variant or None (not modelled)); the GPU variants are
    cost_model.predicted_speedups' names. Read when called."""
    return [(w.category, w.what, w.key if w.seeds else None, w.key if w.price else None)
            for w in ways.WAYS if w.answer]


def answer_labels():
    """{run: what} of the measured ways, as the table writes them."""
    return {run: what for _, what, run, _ in way_rows() if run}


# the answer's GPU case (cost_model.predicted_speedups)
GPU_SHAPE, GPU_TP, GPU_BASELINE = "1.3B", 8, "megatron"


def gpu_speedups():
    """{variant: {network: predicted training-step speedup over Megatron-LM's all-'tp' step}} for the answer's
    GPU case (the 1.3B shape at tp 8), the networks' names, a line saying what it assumes, and every
    published-figure check with its error. The only place the answer calls tpcomm/costmodel/cost_model.py."""
    from tpcomm.costmodel import cost_model as cm

    cfg = cm.PREDICT_DEFAULTS
    shape = cm.FIGURE_SHAPE
    by_link = {link.name: cm.predicted_speedups(link.name, GPU_BASELINE) for link in cm.LINKS}
    out = {}
    for name, speedups in by_link.items():
        for variant, x in speedups.items():
            out.setdefault(variant, {})[name] = x
    assumes = (f"{shape.name} at tp {GPU_TP} on H100 SXM, bf16 at MFU {cfg['mfu']:.0%}, {cfg['batch_size']} "
               "x " f"{cfg['seq_len']} tokens per tp group; links by assumed constants (" + ", "
               "".join(f"{link.name.split(' (')[0]} {link.busbw / 1e9:.0f} GB/s, {link.alpha * 1e6:.0f} "
                       "us" for link in cm.LINKS) + f"); overlap at efficiency {cfg['efficiency']:g} (the "
               "compute beside a collective hides it one for one); the baseline is Megatron-LM's all-`tp` "
               "step, whose backward hides each input-gradient all-reduce behind its weight-gradient GEMM "
               "(docs/cost_model.md); `ladder` is priced as the repo runs it with `tp_async_grad=True` (the "
               "setting Megatron's baseline assumes): each module's forward all-reduce behind the next "
               "module's compute, and its backward one behind the previous module's backward "
               "(docs/overlap.md)")
    checks = [(what, end, cm.error(m, p)) for what, published, model in cm.published_checks(cfg,
                                                                                            cm.options(cfg))
              for end, m, p in (zip(("low ", "high "), model, published) if isinstance(published, tuple)
                                else [("", model, published)])]
    return out, [link.name for link in cm.LINKS], assumes, checks


def _short(p):
    """'+0.020 [-0.005, +0.044] (3)': a paired difference, its 95% interval and its seeds; the interval's
    ends as readings.interval_text prints them (where it holds 0, its upper end is claim()'s bound); no
    interval: the difference alone."""
    mean, ci, n = p
    return f"{mean:+.3f} ({n})" if ci is None else f"{interval_text(mean, ci)} ({n})"


def _cost_cell(p, run):
    """The table's quality cell: the interval with its seeds, or a pending row's mean
    and its seeds of the plan."""
    if p is not None and p[1] is None and p[2] < planned_seeds(run):
        return f"{p[0]:+.3f} ({p[2]} of {planned_seeds(run)})"
    return _short(p)


def _familywise(ctx):
    """cpu-long's Bonferroni intervals over its measured rows ({run: (mean,
    half-width)}, m): pairing.familywise."""
    pairs = {k: p for k, p in pairing.paired(ctx.rows("cpu-long")).items() if k in answer_labels()}
    return pairing.familywise({k: p["final"][2] for k, p in pairs.items()
                               if len(p["final"][2]) >= planned_seeds(k)})


def _correlation_line(ctx):
    """The rows share all `tp`'s seeds as their baseline: how correlated their
    differences are, from the data."""
    pairs = {k: p for k, p in pairing.paired(ctx.rows("cpu-long")).items() if k in answer_labels()}
    r = pairing.shared_baseline_correlation(pairs)
    if not r:
        return "the rows share one baseline"
    return (f"the rows share one baseline (all `tp`'s seeds), so they are correlated, not independent "
            "confirmations: " f"Pearson r between two rows' per-seed differences from {r[0]:.2f} to "
            f"{r[-1]:.2f} (median {r[len(r) // 2]:.2f}, over the {len(r)} pairs of rows sharing "
            f"{pairing.CORRELATION_MIN_SEEDS} or more " "seeds)")


def _familywise_clause(ctx, loss):
    """'; read together (Bonferroni over the 10 measured rows), also for fp8': the rows whose family-wise
    upper end passes 1% of all `tp`'s validation loss, beyond those whose own interval does."""
    family, m = _familywise(ctx)
    over = [answer_labels()[k] for k, (mean, hw) in family.items() if mean + hw > 0.01 * loss and mean
            - hw <= 0]
    return (f"; read together (Bonferroni over the {m} measured rows), not for "
            f"{', '.join(over)}" if over else "")


def _long_penalties(ctx):
    """(cpu-long's {run name: (mean, ci, seeds)}, its baseline row or None); a row short of its planned paired
    seeds (planned_seeds) has no interval (ci None: pending), its runs still being trained."""
    rows = ctx.rows("cpu-long")
    base = next((r for r in rows if r["config"] == r["baseline"]), None)
    return {k[0]: v if v[2] >= planned_seeds(k[0]) else (v[0], None, v[2]) for k,
            v in penalties(rows).items()}, base


def _pending(p, run):
    """'pending (6 of 10 paired seeds)': a row short of its planned seeds, or claim()'s reading."""
    return f"pending ({p[2]} of {planned_seeds(run)} paired seeds)" if p[2] < planned_seeds(run) else None


def _along(ctx):
    """{cpu-long run: where its paired difference changes sign over training (pairing.over_training)}, for the
    rows with all their planned paired seeds (planned_seeds)."""
    rows = ctx.rows("cpu-long")
    pairs, tokens = pairing.paired(rows), {r["config"]: r["tokens_per_iter"] for r in rows}
    return {k: pairing.over_training(p["curve"], tokens[k]) for k, p in pairs.items()
            if len(p["seeds"]) >= planned_seeds(k)}


def _speed_cells(variant, gpu, links, bands):
    return [f"{gpu[variant][n]:.2f}x [{bands[n][variant][0]:.2f}, {bands[n][variant][1]:.2f}]" if variant
            else "not modelled" for n in links]


def answer_table(ctx):
    """The README's table: every way of giving up a sync, its measured quality cost with its 95%
    interval, where that changes sign over training, and its predicted GPU speedups; the fine
    print is docs/answer.md's."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return no_results("cpu-long")
    gpu, links, _, _ = gpu_speedups()
    bands = {n: cost_bands.speedup_bands(n) for n in links}
    along = _along(ctx)
    lines = [f"Quality: final val loss minus all `tp`'s after {base['tokens'] / 1e6:.2f}M tokens, paired by "
             "seed, mean [95% interval] (seeds); measured. Time: training-step speedup over Megatron-LM "
             "on " f"GPUs, {GPU_SHAPE} at tp {GPU_TP} [over the assumptions' ranges]; predicted. Definitions "
             "and fine print: [docs/answer.md](docs/answer.md).", "", "| way | what | quality cost [95%] "
             "(seeds) | over training | NVLink | InfiniBand |", "|---|---|---:|---|---:|---:|"]
    for way, what, run, variant in way_rows():
        p = pen.get(run)
        cost = "0 (same math)" if run is None else "pending" if p is None else _cost_cell(p, run)
        trend = "same math" if run is None else along.get(run, "pending")
        lines.append(f"| {way} | {what} | {cost} | {trend} | " +
                     " | ".join(_speed_cells(variant, gpu, links, bands)) + " |")
    return data_warning(ctx.rows("cpu-long")) + "\n".join(lines)


def answer_details(ctx):
    """docs/answer.md's table: every way of giving up a sync, its quality cost at 95% in cpu-long (its own and
    the family-wise interval, what it says, over training) and its predicted GPU speedup, with the
    definitions, the prediction's assumptions and the published checks."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return no_results("cpu-long")
    gpu, links, assumes, checks = gpu_speedups()
    family, m = _familywise(ctx)
    bands = {n: cost_bands.speedup_bands(n) for n in links}
    along = _along(ctx)
    rows = {r["config"]: r for r in ctx.rows("cpu-long")}
    hosts = {k: host_cell(rows[k], base, p["seeds"]) for k, p in pairing.paired(list(rows.values())).items()
             if k != base["config"]}
    lines = [f"Quality: final val loss minus all `tp`'s ({base['val_loss_mean']:.3f}, exactly GPT), paired "
             "seed by " f"seed, mean [95% interval] (seeds), after {base['tokens'] / 1e6:.2f}M tokens "
             "(`cpu-long`, " f"{sum(r['n_seeds'] for r in ctx.rows('cpu-long'))} result files); each row's "
             "own 95% interval, and " + (f"beside it the family-wise one: Bonferroni over the {m} measured "
                                         f"rows (each at {100 - 5 / m:.2f}%), so all {m} hold at once "
                                         "with 95%" if m else "beside it the family-wise one once a row is "
                                         "measured") + f"; \"at 95% it\" reads the row's own, once the row "
             "has its planned paired seeds (at least " f"{MIN_SEEDS}; before: pending); "
             f"{_correlation_line(ctx)}; {provenance.summary(ctx, 'cpu-long')}; time: predicted step "
             "speedup over " f"Megatron-LM's all-`tp` step (its backward all-reduces hidden behind the "
             "weight-gradient GEMMs), " f"{GPU_SHAPE} at tp {GPU_TP}, and in brackets [low, high] over the "
             "declared ranges of its assumptions " f"(docs/cost_model.md, Bands). Generated by `python "
             "experiment.py report`.", "", f"| way | what | quality cost [95%] (seeds) | family-wise "
             f"[95%, Bonferroni over {m}] | at 95% it | over " "training (pointwise 95%) | CPU (its runs and "
             "all `tp`'s) | NVLink | InfiniBand |", "|---|---|---:|---:|---|---|---|---:|---:|"]
    for way, what, run, variant in way_rows():
        p = pen.get(run)
        cost = "0 (same math)" if run is None else "pending" if p is None else _cost_cell(p, run)
        said = ("costs nothing: the math is all `tp`'s" if run is None else
                (p is not None and _pending(p, run)) or claim(p, base["val_loss_mean"]))
        trend = "same math" if run is None else along.get(run, "pending")
        fw = ("—" if run not in family
              else pairing.fmt_ci(*family[run], decimals(family[run][1])).split(" ", 1)[1])
        lines.append(f"| {way} | {what} | {cost} | {fw} | {said} | {trend} | {hosts.get(run, '—')} | " +
                     " | ".join(_speed_cells(variant, gpu, links, bands)) + " |")
    errors = {}
    for what, end, err in checks:
        errors.setdefault(what.replace(" (range)", ""), []).append(f"{end}{err:+.1f}%")
    lines += ["", f"The prediction assumes {assumes}. Before it, the cost model is checked against every "
              "published figure it can be (docs/cost_model.md), each with its error: " + "; "
              "".join(f"{what} {', '.join(e)}" for what, e in errors.items()) + "."]
    return data_warning(ctx.rows("cpu-long")) + "\n".join(lines)


def _pace(band):
    """A predicted speedup band (low, high) in words, true at both ends: within 2% of 1 is about even."""
    lo, hi = band
    span = f"{lo:.2f}-{hi:.2f}x"
    if lo >= 1.02:
        return f"gains {span}"
    if hi <= 0.98:
        return f"is slower ({span})"
    if lo > 0.98 and hi < 1.02:
        return f"is about even ({span})"
    return f"gains or loses by the assumptions ({span})"


def _time_sentence(links):
    """Hiding, collective matmul and delaying against dropping, as milliseconds saved per micro-step over the
    declared ranges, and where each comparison holds (tpcomm/costmodel/cost_bands.py)."""
    ways = (("all-spd", "dropping half of them (all `spd`)"), ("tp_overlap=2", "hiding them "
                                                               "(`tp_overlap=2`)"), ("collective_matmul",
                                                                                     "collective matmul"),
            ("all-ladder", "delaying them (all `ladder`)"))
    parts = []
    for n in links:
        saved = "; ".join(f"{what} {_ms(cost_bands.step_saved_ms(n, v))}" for v, what in ways)
        points = cost_bands.grid(n)
        beats = "; ".join(f"dropping beats {what.split(' (')[0]} "
                          f"{cost_bands.condition(points, lambda s, v=v: s['all-spd'] > s[v])}" for v,
                          what in ways[1:])
        parts.append(f"on {n.split(' (')[0]}, {saved} ({beats})")
    return (f"On GPUs (predicted, {GPU_SHAPE} at tp {GPU_TP}, ms a micro-step saved against Megatron's all "
            "`tp` over the declared ranges; negative: it costs time), " + "; ".join(parts) + ".")


def _ms(band):
    def one(x):  # a tenth of a ms, finer where that reads as zero ('-0.0': a cost of 0.02 ms)
        text = f"{x:+.1f}"
        return f"{x:+.2f}" if x and float(text) == 0 else text
    lo, hi = band
    return f"{one(lo)} to {one(hi)} ms"


def answer_long(ctx):
    """docs/answer.md's answer in four sentences (quality at 95%; hiding and delaying against
    dropping on each link; shrinking; 4x the training), every number from the result files (claim())
    and the cost model (gpu_speedups())."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return no_results("cpu-long")
    loss = base["val_loss_mean"]
    gpu, links, _, _ = gpu_speedups()
    nv, ib = links
    measured = {n: p for n, p in pen.items() if p[1] is not None and n in answer_labels()}
    worse = [n for n, p in measured.items() if side_of(*p[:2]) is not None]  # a cost (or a gain) at 95%
    bounded = sorted((p[0] + p[1], n, p[1]) for n, p in measured.items() if side_of(*p[:2]) is None)
    wide = [answer_labels()[n] for b, n, _ in bounded if b > 0.01 * loss]
    costs = "; ".join(f"{answer_labels()[n]} {claim(measured[n], loss)}" for n in worse)
    if bounded:
        (lo, lo_pct), (hi, hi_pct) = (bound(b, loss, half_width=ci) for b, _, ci in (bounded[0], bounded[-1]))
        first = (f"After {base['tokens'] / 1e6:.2f}M tokens the per-row 95% intervals rule out costs above "
                 f"{lo} nats ({answer_labels()[bounded[0][1]]}) to {hi} ({answer_labels()[bounded[-1][1]]}), "
                 f"{lo_pct} to {hi_pct} of all `tp`'s validation loss ({loss:.3f})"
                 + (f", so a cost under 1% is not yet shown for {', '.join(wide)}" if wide else "")
                 + _familywise_clause(ctx, loss)
                 + (f"; {costs}" if costs else "") + ".")
    else:
        first = (f"After {base['tokens'] / 1e6:.2f}M tokens, at 95%: {costs}." if costs else
                 "No pattern has 2 paired seeds yet.")
    out = [first]
    out.append(_time_sentence(links))
    band = {n: cost_bands.speedup_bands(n) for n in links}
    one, two, bf16 = ({n: band[n][v] for n in links} for v in ("all-tp-int8", "all-tp-int8-2shot",
                                                               "all-tp-bf16"))
    out.append(f"Shrinking them to int8 with the one-shot all-gather {_pace(one[nv])} on {nv.split(' (')[0]} "
               "and " f"{_pace(one[ib])} over {ib.split(' (')[0]} at tp {GPU_TP}; the two-shot exchange "
               f"{_pace(two[nv])} and {_pace(two[ib])} (its quality: "
               f"{claim(pen.get('all-tp-int8-2shot'), loss)}); bf16 sums, already the autocast dtype, "
               "gain nothing from compression and the one-shot all-gather of them " f"{_pace(bf16[nv])} on "
               f"{nv.split(' (')[0]} (each over the declared ranges).")
    longer = ctx.rows("convergence")
    cpen = {k[0]: v for k, v in penalties(longer).items()}
    cbase = next((r for r in longer if r["config"] == r["baseline"]), None)
    if cbase is not None and cpen:
        out.append(f"After {cbase['tokens'] / base['tokens']:g}x the training ({cbase['tokens'] / 1e6:.2f}M "
                   "tokens, `convergence`): " + ", ".join(f"{answer_labels()[n]} "
                                                             f"{claim(p, cbase['val_loss_mean'])}" for n,
                                                             p in cpen.items()) + ".")
    return " ".join(out)


def _name(run):
    """A way's short name: its 'what' without a track's pattern ('tracks D=2')."""
    return re.sub(r" (`[(\[]|\().*$", "", answer_labels()[run])


def _and(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _band(lo_hi):
    return f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}x"


def answer_summary(ctx):
    """The README's answer in plain sentences, each number from the result files or the cost model: what
    the measured ways cost at 95%, which lead only early, what dropping and hiding save on GPUs
    (predicted), and after 4x the training."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return no_results("cpu-long")
    loss, along = base["val_loss_mean"], _along(ctx)
    measured = {n: p for n, p in pen.items() if p[1] is not None and n in answer_labels()}  # none pending
    costs = [n for n, p in measured.items() if side_of(*p[:2]) == "worse"]
    gains = [n for n, p in measured.items() if side_of(*p[:2]) == "better"]
    held = sorted((p[0] + p[1], n, p[1]) for n, p in measured.items() if n not in costs + gains)
    scale = (f"a {base['params_total'] / 1e6:.1f}M-parameter character model (tp {base['tp_size']}, "
             f"{base['tokens'] / 1e6:.2f}M tokens, CPU)")
    out = []
    if held:
        (lo, lo_pct), (hi, hi_pct) = (bound(b, loss, half_width=ci) for b, _, ci in (held[0], held[-1]))
        first = (f"On {scale}, {len(held)} of {len(measured)} measured ways cost at most {lo} to {hi} nats "
                 f"({lo_pct[:-1]}-{hi_pct} of the loss) at 95%")
    else:
        first = f"On {scale}, {len(measured)} ways are measured"
    paid = [f"{_name(n)} {'costs ' if not k else ''}{measured[n][0]:+.3f} "
            f"({100 * measured[n][0] / loss:.1f}%)" for k, n in enumerate(costs)]
    paid += [f"{_name(n)} gains {-measured[n][0]:.3f} ({-100 * measured[n][0] / loss:.1f}%)" for n in gains]
    out.append(first + (f"; {', '.join(paid)}." if paid else "."))
    early = [n for n in measured if along.get(n, "").startswith("leads until")]
    if early:
        until = sorted(float(re.search(r"until ([\d.]+)M", along[n]).group(1)) for n in early)
        turned = [_name(n) + (" costs" if not k else "") + " from " + along[n].split("costs from ")[1]
                  for k, n in enumerate(n for n in early if "costs from" in along[n])]
        names = _and([_name(n) for n in early])
        ahead = [f"{_name(n)} {along[n]}" for n in measured if along.get(n, "").startswith("leads ")
                 and n not in early]  # those that lead at the end too
        out.append(f"{names[0].upper()}{names[1:]} lead all `tp` early, until "
                   f"{until[0]:.2f}M-{until[-1]:.2f}M " "tokens, and not at the "
                   "end" + (f"; {_and(turned)}" if turned else "") + (f"; {_and(ahead)}" if ahead else "")
                   + ".")
    gpu, links, _, _ = gpu_speedups()
    bands = {n: cost_bands.speedup_bands(n) for n in links}
    nv, ib = (n.split(" (")[0] for n in links)
    out.append(f"Predicted for GPUs ({GPU_SHAPE} at tp {GPU_TP}), dropping half the syncs (all `spd`) speeds "
               "a " f"training step {_band(bands[links[0]]['all-spd'])} on {nv} and "
               f"{_band(bands[links[1]]['all-spd'])} over {ib}; hiding them (`tp_overlap=2`) "
               f"{_band(bands[links[0]]['tp_overlap=2'])} and {_band(bands[links[1]]['tp_overlap=2'])}.")
    longer = ctx.rows("convergence")
    cpen = {k[0]: v for k, v in penalties(longer).items() if k[0] in answer_labels()}
    cbase = next((r for r in longer if r["config"] == r["baseline"]), None)
    if cbase is not None and cpen:
        out.append(f"After {cbase['tokens'] / base['tokens']:g}x the training: " +
                   ", ".join(f"{_name(n)} {claim(p, cbase['val_loss_mean'])}" for n, p in cpen.items()) + ".")
    out.append("The costs are measured; the speedups are the cost model's predictions, not GPU timings.")
    return " ".join(out)


def tradeoff_plot(ctx):
    """(data, draw) of the answer's figure: each way's quality cost (paired, 95%)
    against its predicted speedup."""
    pen, base = _long_penalties(ctx)
    if base is None:
        return None
    gpu, links, _, _ = gpu_speedups()
    points = []
    for way, what, run, variant in way_rows():
        if variant is None:
            continue
        p = (0.0, 0.0, 0) if run is None else pen.get(run)
        status = "same math" if run is None else "pending" if p is None or p[1] is None else "measured"
        mean, ci, n = (None, None, 0 if p is None else p[2]) if status == "pending" else p
        points.append(dict(way=way, label=what.replace("`", ""), key=run or variant, status=status, mean=mean,
                           ci=ci, seeds=n, speedup=[gpu[variant][name] for name in links],
                           # [low, high]
                           speedup_band=[cost_bands.speedup_bands(name)[variant] for name in links]))
    data = dict(points=points, links=[n.split(" (")[0] for n in links], base_loss=base["val_loss_mean"],
                left_out=[what.replace("`", "") for _, what, _, variant in way_rows() if variant is None])
    title = (f"Each way's quality cost, measured on CPU (y: {base['params_total'] / 1e6:.1f}M parameters, "
             f"{base['tokens'] / 1e6:.2f}M tokens, tp {base['tp_size']}), against its training-step speedup "
             f"predicted for GPUs (x: {GPU_SHAPE} at tp {GPU_TP}, H100; assumptions: docs/answer.md)")
    return data, lambda: answer_figure.draw_tradeoff(data, title=title)
