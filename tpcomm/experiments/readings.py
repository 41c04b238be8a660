"""
How the reports read paired differences (tpcomm/experiments/report/report.py,
tpcomm/experiments/report/answer.py): the pattern a result row ran, its paired difference to the
all-tp baseline, and what that says at 95% (claim: a bound where the interval holds 0, else the cost
or gain with its interval).
"""

import math

from tpcomm.model.block_types.registry import option_fields
from tpcomm.model.options import compact_list
from tpcomm.experiments import pairing, results
from tpcomm.experiments import ways


def no_results(*names):
    return "_No result files yet for " + ", ".join(f"`{n}` (experiments/{n}/runs/)" for n in names) + \
        f": `python experiment.py {names[0]}` writes them, then `python experiment.py report`._"


def side_of(mean, ci):
    """'worse' / 'better' than the baseline when the 95% interval mean ± ci excludes 0, else None."""
    if ci is None or abs(mean) <= ci:
        return None
    return "worse" if mean > 0 else "better"


def data_warning(rows):
    """A line when the runs of a table trained on different data (prepare.py's source sha256 differs)."""
    shas = {s for r in rows for s in r["data_sha256"]}
    return f"**Warning: these runs trained on {len(shas)} different datasets (source.json sha256).**\n\n" \
        if len(shas) > 1 else ""


def pattern_name(row):
    """The way's key of a row's block pattern (ways.patterns(), e.g. 'all-spd'), or the pattern itself;
    '-int8' etc. after it when its syncs were compressed."""
    name = next((p for p, f in ways.patterns().items() if compact_list(f(row["n_layer"])) ==
                 row["block_pattern"]), row["block_pattern"])
    for key, value in row.get("type_options", {}).items():  # an option off its default: '-p0.25' ('caat')
        f = option_fields()[key][1]
        name += f"-{f.metadata.get('short', key)}{value:g}" if value != f.default else ""
    return name + (f"-{comm_dtype_label(row).replace(' ', '-')}" if row.get("tp_comm_dtype") else "")


def comm_dtype_label(row):
    """'int8', or 'int8 2shot' for a row whose compressed reductions used the two_shot exchange."""
    return row["tp_comm_dtype"] + (" 2shot" if row.get("tp_comm_exchange") == "two_shot" else "")


def penalties(rows):
    """{(pattern name, tp, size key): (mean, ci, n seeds)} of the final paired
    difference to the all-tp baseline."""
    pairs = pairing.paired(rows)
    return {(pattern_name(r), r["tp_size"], results.group_key(r)): (*pairs[r["config"]]["final"][:2],
                                                                    len(pairs[r["config"]]["seeds"]))
            for r in rows if r["config"] in pairs and r["config"] != r["baseline"]}


def interval_cell(p, *, empty="—"):
    return empty if p is None else f"{pairing.fmt_ci(p[0], p[1])} ({p[2]})"


def decimals(half_width):
    """Decimals that print a number no finer than a tenth of its interval's half-width (0.0064: 3 decimals),
    so a digit that one more seed would move is not shown."""
    return max(0, math.floor(-math.log10(half_width / 10))) if half_width > 0 else 4


def round_up(x, d):
    """x rounded up at d decimals: a printed upper bound never understates (the 1e-9 absorbs float noise)."""
    return math.ceil(x * 10 ** d - 1e-9) / 10 ** d


def interval_text(mean, ci):
    """'+0.006 [+0.000, +0.012]': a difference and its 95% interval at decimals() of the half-width; where the
    interval holds 0 its upper end is rounded up, so it is the bound claim() states."""
    d = decimals(ci)
    # a bound only where 0 is inside
    upper = round_up(mean + ci, d) if mean - ci <= 0 <= mean + ci else mean + ci
    return f"{mean:+.{d}f} [{mean - ci:+.{d}f}, {upper:+.{d}f}]"


def bound(b, base_loss, *, half_width):
    """An upper bound in nats and as a share of the baseline's loss, rounded up, each no finer than a
    tenth of the interval's half-width (decimals()): +0.0006 with a half-width of 0.0064 prints +0.001
    (0.1%). The share is the printed bound's, so the pair agree: +0.003 with a half-width of 0.013 prints
    +0.01 nats (0.6%), not (0.2%)."""
    d, dp = decimals(half_width), decimals(100 * half_width / base_loss)
    nats = round_up(b, d)
    return f"{nats:+.{d}f}", f"{round_up(100 * nats / base_loss, dp):.{dp}f}%"


# a row is read once it has 3 paired seeds: a Student-t interval from 2 rests on one degree of freedom, so its
# width is itself a guess (two nearly equal differences once gave all `caat` [-0.013, -0.012])
MIN_SEEDS = 3


def planned_seeds(key):
    """The paired seeds a way's row is read at: its planned seeds (tpcomm/experiments/ways.py), at least
    MIN_SEEDS; before, the row is pending (its runs still being trained)."""
    return max(MIN_SEEDS, next((w.seeds for w in ways.WAYS if w.key == key), 0))


def claim(p, base_loss):
    """What a paired difference (mean, ci, seeds) says at 95%: where the interval holds 0, the largest
    cost it rules out ("costs at most +0.008 nats (0.5%)", bound(): no finer than a tenth of the
    half-width); where it does not, the cost (or gain) with its interval; with fewer than MIN_SEEDS
    paired seeds, that it is pending."""
    if p is None or p[1] is None or p[2] < MIN_SEEDS:
        return f"pending ({0 if p is None else p[2]} paired seed{'' if p and p[2] == 1 else 's'})"
    mean, ci, _ = p
    side = side_of(mean, ci)
    pct = lambda x: f"{100 * x / base_loss:.1f}%"  # noqa: E731
    if side is None:
        nats, share = bound(mean + ci, base_loss, half_width=ci)
        return f"costs at most {nats} nats ({share})"
    if side == "worse":
        return f"costs {interval_text(mean, ci)} nats ({pct(mean)})"
    return f"gains {-mean:.{decimals(ci)}f} {interval_text(mean, ci).split(' ', 1)[1]} nats ({pct(-mean)})"


def host_cell(row, base, seeds):
    """Whether a row's runs and its baseline's on the paired seeds came from one kind of CPU (the vector
    extension level torch dispatched its kernels by): 'one kind (AVX512)', 'mixed (AVX2, AVX512)', or how many
    files do not record it (written before result files named their CPU)."""
    kinds = [dict(zip(r["seeds"], r["cpus"]))[s] for r in (row, base) for s in seeds]
    missing = sum(k is None for k in kinds)
    if missing:
        return f"not recorded in {missing} of {len(kinds)} files"
    known = sorted(set(kinds))
    return f"one kind ({known[0]})" if len(known) == 1 else f"mixed ({', '.join(known)})"
