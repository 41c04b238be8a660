"""
One name, one colour and one marker per way of giving up a sync, for every figure (tpcomm/experiments/plots.py
and the answer's figure), all from the table of ways (tpcomm/experiments/ways.py: Way.name, Way.style). Keyed
by a way's key: the sweeps' pattern names (readings.pattern_name: 'all-spd', 'all-tp-int8') and the ways that
only the cost model prices ('tp_overlap=2'). A pattern that is no way (a sweep's other budgets, e.g.
"['tp','spd']*6") is named by its block pattern, coloured by its forward all-reduces on a grey ramp and given
a marker by its name, the same in every figure.
"""

import zlib
from dataclasses import dataclass

from tpcomm.experiments import ways


@dataclass(frozen=True)
class Style:
    name: str  # as the answer table writes the way, without backticks
    color: str
    marker: str


def styles():
    """{way key: Style} of every way the table gives a style (read when called: a
    way added is drawn at once)."""
    return {w.key: Style(w.name, *w.style) for w in ways.WAYS if w.style}


# a pattern that is no way: a marker chosen from its name (the same in every figure and run), so two such
# patterns with the same forward all-reduces (the same grey) are still told apart
OTHER_MARKERS = "x+1234"


def is_way(key):
    return key in styles()


def style(key, *, fwd_allreduces=None):
    """The Style of a pattern name; a pattern that is no way gets its block pattern as name and a grey by its
    forward all-reduces (darker: more), so it looks the same wherever it is drawn."""
    if key in styles():
        return styles()[key]
    shade = 0.75 if fwd_allreduces is None else 0.7 - 0.5 * min(fwd_allreduces, 24) / 24
    return Style(key, f"{shade:.2f}", OTHER_MARKERS[zlib.crc32(key.encode()) % len(OTHER_MARKERS)])


def label(key, *, fwd_allreduces=None):
    """The legend text of a pattern: the way's name, or the block pattern with its forward all-reduces."""
    if key in styles() or fwd_allreduces is None:
        return style(key).name
    return f"{key} ({fwd_allreduces} all-reduces)"
