"""
One name, one colour and one marker per way of giving up a sync, for every figure (tpcomm/experiments/plots.py and the
answer's figure). Keyed by the sweeps' pattern names (readings.pattern_name: 'all-spd', 'all-tp-int8') and the cost
model's GPU variants ('tp_overlap=2'); a name is the answer table's `what` (tpcomm/experiments/report/answer.WAYS) without its backticks
(tests/figures/test_figures.py holds the two together). A pattern that is no way (a sweep's other budgets, e.g.
"['tp','spd']*6") is named by its block pattern and coloured by its forward all-reduces on a grey ramp, the same in
every figure.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Style:
    name: str  # as the answer table writes the way
    color: str
    marker: str


# colours by family: drop red/orange/brown, hide green/olive, delay blue, shrink purple/pink, drop + shrink grey
STYLES = {
    "all-tp": Style("all tp", "black", "o"),  # the baseline: GPT, every sync
    "all-spd": Style("all spd", "#d62728", "o"),
    "parallel-spd": Style("['parallel','spd']*6", "#ff7f0e", "s"),
    "all-parallel": Style("all parallel", "#8c564b", "^"),
    "parallel3-spd": Style("(['parallel']*3+['spd'])*3", "#fd8d3c", ">"),  # tracks syncing every 4 blocks
    "all-caat": Style("all caat: half of each sync's channels", "#ad494a", "8"),  # partial-channel sync
    "tp_overlap=2": Style("tp_overlap=2", "#2ca02c", "D"),
    "sequence_parallel": Style("sequence parallelism", "#9a9a00", "d"),
    "collective_matmul": Style("collective matmul (tp_collective_matmul)", "#006d2c", "H"),
    "all-ladder": Style("all ladder", "#1f77b4", "v"),
    "ladder-upper": Style("ladder in the upper half", "#17becf", "<"),
    "all-tp-bf16": Style("bf16", "#9467bd", "P"),
    "all-tp-fp8": Style("fp8", "#e377c2", "X"),
    "all-tp-int8": Style("int8", "#7b4173", "p"),
    "all-tp-int8-2shot": Style("int8 two-shot", "#c51b8a", "h"),
    "all-spd-int8": Style("all spd + int8", "#7f7f7f", "*"),
}
OTHER_MARKER = "."


def is_way(key):
    return key in STYLES


def style(key, *, fwd_allreduces=None):
    """The Style of a pattern name; a pattern that is no way gets its block pattern as name and a grey by its
    forward all-reduces (darker: more), so it looks the same wherever it is drawn."""
    if key in STYLES:
        return STYLES[key]
    shade = 0.75 if fwd_allreduces is None else 0.7 - 0.5 * min(fwd_allreduces, 24) / 24
    return Style(key, f"{shade:.2f}", OTHER_MARKER)


def label(key, *, fwd_allreduces=None):
    """The legend text of a pattern: the way's name, or the block pattern with its forward all-reduces."""
    if key in STYLES or fwd_allreduces is None:
        return style(key).name
    return f"{key} ({fwd_allreduces} all-reduces)"
