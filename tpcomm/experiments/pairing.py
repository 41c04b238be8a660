"""
The paired comparison of a sweep's rows with their baseline: same seed, same initial weights and
batches, so the difference config - baseline of the val loss, seed by seed, cancels most of the seed
noise. Its mean and 95% confidence interval (Student's t over the seeds), over training and at the
end; the ordering over training; whether the baseline is flat; the markdown tables of it
(results.md's companion paired.md, docs/axes.md).

    pairs = paired(rows)                 # rows: results.summarize's
    pairs["all-spd"]["final"]            # (mean, half-width, per-seed differences)
    paired_markdown(rows)
"""

import functools
import math
import statistics

from tpcomm.experiments.results import baseline_of, fmt, size_label

# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (standard tables); beyond, t_975()
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
CORRELATION_MIN_SEEDS = 10  # shared_baseline_correlation: r over fewer common seeds says little
FLAT_FRACTION, FLAT_THRESHOLD = 0.2, 0.01  # flat: the val loss improved < 1% over the last fifth of training


def t_975(df):
    """Student's t two-sided 95% quantile: the table to 30 degrees of freedom, then the normal's 1.95996 with
    Cornish-Fisher's first two corrections (within 2e-4 of the exact value from 31 on)."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def _central_mass(t, df):
    """P(|T| <= t) for Student's t with an integer df >= 1, in closed form
    (Abramowitz and Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd: 2/pi (theta + sin(theta) (c + 2/3 c^3 + 2*4/(3*5) c^5 + ... up to c^(df-2)))
        term, total = c, 0.0
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + s * total)
    term, total = 1.0, 0.0  # even: sin(theta) (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))
    for k in range(1, df // 2 + 1):
        total += term
        term *= c * c * (2 * k - 1) / (2 * k)
    return s * total


@functools.lru_cache(maxsize=None)
def t_quantile(alpha, df):
    """The two-sided 1 - alpha quantile of Student's t (df an integer >= 1): t with P(|T| <= t) = 1 - alpha,
    by bisection on the closed-form distribution (t_quantile(0.05, df) is t_975(df))."""
    lo, hi = 0.0, 1.0
    while _central_mass(hi, df) < 1 - alpha:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _central_mass(mid, df) < 1 - alpha else (lo, mid)
    return (lo + hi) / 2


def familywise(diffs, *, alpha=0.05):
    """Bonferroni's simultaneous intervals over the rows with 2+ paired seeds: {row: (mean, half-width)} at 1
    - alpha/m each (m the number of such rows), so all m hold at once with probability >= 1 - alpha; and m."""
    rows = {k: d for k, d in diffs.items() if len(d) > 1}
    m = len(rows)
    half = {k: t_quantile(alpha / m, len(d) - 1) * statistics.stdev(d) / len(d) ** 0.5 for k,
            d in rows.items()}
    return {k: (statistics.fmean(d), half[k]) for k, d in rows.items()}, m


def shared_baseline_correlation(pairs, *, min_seeds=CORRELATION_MIN_SEEDS):
    """Pearson r between two rows' per-seed differences to their shared baseline, over the seeds both ran (at
    least min_seeds), for every pair of rows in pairs ({row: {'seeds': [...], 'final': (mean, ci, per-seed)}}:
    paired()'s), as a sorted list. A noisy baseline seed moves every row's difference on that seed alike."""
    per = {k: dict(zip(p["seeds"], p["final"][2])) for k, p in pairs.items()}
    names, out = sorted(per), []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            seeds = sorted(set(per[a]) & set(per[b]))
            xs, ys = [per[a][s] for s in seeds], [per[b][s] for s in seeds]
            # r of a constant is undefined
            if len(seeds) >= min_seeds and len(set(xs)) > 1 and len(set(ys)) > 1:
                out.append(statistics.correlation(xs, ys))
    return sorted(out)


def mean_ci(xs):
    """(mean, half-width of its 95% confidence interval by Student's t); half-width None for one value."""
    if len(xs) < 2:
        return statistics.fmean(xs), None
    return statistics.fmean(xs), t_975(len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5


def _by_seed(row):
    """{seed: {iter: val_loss}} of a summarized row."""
    return {seed: dict(curve) for seed, curve in zip(row["seeds"], row["curves"])}


def paired(rows):
    """Per config: the differences config - its baseline of the val loss on the seeds both ran, at
    every eval iteration they share: {'final': (mean, ci, per-seed list), 'curve': [(iter, mean,
    ci)]}. A baseline's own is zero."""
    out = {}
    for r in rows:
        base = baseline_of(r, rows)
        if base is None:
            continue
        mine, ref = _by_seed(r), _by_seed(base)
        seeds = sorted(set(mine) & set(ref))
        iters = sorted(set.intersection(*(set(mine[s]) & set(ref[s]) for s in seeds))) if seeds else []
        if not iters:
            continue
        diff = {i: [mine[s][i] - ref[s][i] for s in seeds] for i in iters}
        final = diff[iters[-1]]
        out[r["config"]] = dict(seeds=seeds, final=(*mean_ci(final), final),
                                curve=[(i, *mean_ci(diff[i])) for i in iters])
    return out


def verdict(mean, ci):
    """'lower', 'higher' or 'tied': where an evaluation's 95% interval lies against 0 (one seed: the sign)."""
    if ci is None:
        return "lower" if mean < 0 else "higher" if mean > 0 else "tied"
    return "lower" if mean + ci < 0 else "higher" if mean - ci > 0 else "tied"


def _verdicts(curve):
    """[(iter, verdict)] after step 0 (every run starts at ~ln(vocab))."""
    return [(i, verdict(mean, ci)) for i, mean, ci in curve if i > 0]


def ordering(curve, tokens_per_iter):
    """Where a config's paired difference is below the baseline's (CI entirely < 0), above (> 0) or tied (the
    CI holds 0), as segments over training: 'lower 250-2000 (0.19M-1.5M tokens); tied 2250-5000 (...)'."""
    segments = []
    for i, v in _verdicts(curve):
        if segments and segments[-1][0] == v:
            segments[-1][2] = i
        else:
            segments.append([v, i, i])
    return "; ".join(f"{v} {a}-{b} ({a * tokens_per_iter / 1e6:.2f}M-{b * tokens_per_iter / 1e6:.2f}M tokens)"
                     for v, a, b in segments)


# a side counts once it holds at this many evaluations in a row: one of 20 pointwise intervals
PHASE_MIN_EVALS = 2


def over_training(curve, tokens_per_iter):
    """Where the sign of a paired difference changes over training, read from each evaluation's own 95%
    interval: 'leads until 1.15M tokens', 'leads until 0.38M tokens, costs from 0.77M', 'costs from 2.11M
    tokens', 'leads from ...', or one side throughout ('tied throughout'). The end is the last evaluation's
    side; an earlier side counts only where it holds at PHASE_MIN_EVALS evaluations in a row (a lone interval
    off 0 among 20 is what pointwise 95% gives by chance)."""
    marks = _verdicts(curve)
    if not marks:
        return "n/a"
    held = set()
    for k in range(len(marks) - PHASE_MIN_EVALS + 1):
        window = {v for _, v in marks[k:k + PHASE_MIN_EVALS]}
        if len(window) == 1:
            held |= {(i, v) for i, v in marks[k:k + PHASE_MIN_EVALS]}
    lower, higher = ([i for i, v in marks if (i, v) in held and v == s] for s in ("lower", "higher"))
    tokens = lambda i: f"{i * tokens_per_iter / 1e6:.2f}M"  # noqa: E731
    first, (last, end) = marks[0][0], marks[-1]

    def start_of_end():  # the end's side from its first evaluation after the last held run of another side
        others = [i for i, v in marks if (i, v) in held and v != end]
        return min((i for i, v in marks if v == end and i > max(others, default=0)), default=last)

    if end == "lower":
        return ("leads throughout" if start_of_end() == first else f"leads from {tokens(start_of_end())} "
                "tokens")
    if lower:
        said = f"leads until {tokens(max(i for i, v in marks if v == 'lower'))} tokens"
        return said + (f", costs from {tokens(start_of_end())}" if end == "higher" else "")
    if end == "higher":
        return ("costs throughout" if start_of_end() == first else f"costs from {tokens(start_of_end())} "
                "tokens")
    return f"costs until {tokens(max(higher))} tokens" if higher else "tied throughout"


def flatness(row):
    """(relative improvement of the mean val loss over the last FLAT_FRACTION of training, iters compared)."""
    curves = row["curves"]
    iters = sorted(set.intersection(*(set(i for i, _ in c) for c in curves)))
    last = iters[-1]
    start = min((i for i in iters if i >= (1 - FLAT_FRACTION) * last), default=last)
    at = {i: statistics.fmean(dict(c)[i] for c in curves) for i in (start, last)}
    return (at[start] - at[last]) / at[start], (start, last)


def fmt_ci(mean, ci, digits=4):
    return f"{mean:+.{digits}f}" + (f" [{mean - ci:+.{digits}f}, {mean + ci:+.{digits}f}]" if ci is not None
                                    else "")


def _paired_group(base, members, pairs, early_iter):
    """The flatness line and the paired table of one baseline's group."""
    improvement, (a, b) = flatness(base)
    shared = sorted({i for r in members for i, _, _ in pairs[r["config"]]["curve"]})
    early = min((i for i in shared if i >= early_iter), default=early_iter)
    lines = [f"Baseline flatness: its mean val loss fell {100 * improvement:.2f}% over the last fifth of "
             "training " f"(iter {a} -> {b}); criterion for flat: under {100 * FLAT_THRESHOLD:.0f}%: "
             f"{'met' if improvement < FLAT_THRESHOLD else 'NOT met'}.", "", f"| config | block pattern | "
             "fwd all-reduces | final val loss | final difference [95% CI] | per seed | " f"difference at "
             f"iter {early} [95% CI] | ordering over training (vs baseline) |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    for r in members:
        p = pairs[r["config"]]
        at_early = next(((m, c) for i, m, c in p["curve"] if i == early), None)
        loss = f"{r['val_loss_mean']:.4f}" + (f" ± {r['val_loss_std']:.4f}" if r["n_seeds"] > 1 else "")
        lines.append(f"| {r['config']} | `{r['block_pattern']}` | {fmt(r['fwd_allreduces'], 'd')} | {loss} | "
                     f"{fmt_ci(*p['final'][:2])} | {', '.join(f'{d:+.4f}' for d in p['final'][2])} | "
                     f"{fmt_ci(*at_early) if at_early else 'n/a'} | "
                     f"{ordering(p['curve'], base['tokens_per_iter'])} |")
    return lines


def paired_markdown(rows, *, early_iter=500):
    """The paired tables (one per baseline), each with the baseline's flatness and the ordering over training,
    as markdown. The early column is the first eval at or after early_iter."""
    pairs = paired(rows)
    bases = [r for r in rows if r["config"] == r["baseline"] and r["config"] in pairs]
    n_seeds = max((len(pairs[b["config"]]["seeds"]) for b in bases), default=0)
    lines = [f"Paired with the baseline seed by seed (same seed: same initial weights, same batches); "
             "differences " f"config - baseline in validation loss (nats/token), mean and 95% confidence "
             "interval (Student's t over " f"the seeds, up to {n_seeds})."]
    for base in bases:
        members = [r for r in rows if r["baseline"] == base["config"] and r is not base
                   and r["config"] in pairs]
        if not members:
            continue
        lines += ["", f"Baseline `{base['block_pattern']}` ({base['config']}" +
                  (f", {size_label(base)}, {base['tokens']:,} tokens)" if len(bases) > 1 else ")") + ".", ""]
        lines += _paired_group(base, members, pairs, early_iter)
    return "\n".join(lines)


def has_pairs(rows):
    """The baseline and another config have 2+ common seeds: a paired comparison says something."""
    return any(len(p["seeds"]) > 1 for c, p in paired(rows).items()
               if c not in {r["baseline"] for r in rows})
