"""
Labels that never overprint: separate() moves each point's annotation (its offset, in points) up or down until
its drawn box lies inside the figure and meets no other text of it; overlapping() lists the pairs of texts
whose drawn boxes still intersect, cut_off() the texts past the figure's edges (tests/figures/test_figures.py
asserts none of either, in every figure). Both measure matplotlib's text extents after a draw.
"""

from itertools import combinations


def _shown_ticks(axis):
    lo, hi = sorted(axis.get_view_interval())
    return [t.label1 for t in axis.get_major_ticks() if lo <= t.get_loc() <= hi]


def texts(fig):
    """Every drawn, non-empty text of the figure (titles, axis labels, the tick labels inside the axes'
    limits, legends, annotations)."""
    from matplotlib.axis import Tick
    from matplotlib.text import Text

    in_ticks = {id(t) for tick in fig.findobj(Tick) for t in (tick.label1, tick.label2)}
    shown = [t for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in _shown_ticks(axis)]
    return [t for t in [t for t in fig.findobj(Text) if id(t) not in in_ticks] + shown
            if t.get_visible() and t.get_text().strip()]


def _box(t, renderer):
    """The text's own box (an annotation's without its arrow)."""
    from matplotlib.text import Annotation, Text

    if isinstance(t, Annotation):
        t.update_positions(renderer)
    return Text.get_window_extent(t, renderer)


def _boxes(fig, items):
    renderer = fig.canvas.get_renderer()
    return [(t, _box(t, renderer)) for t in items]


def overlapping(fig):
    """[(text, text)] of the figure's texts whose boxes intersect, after a draw."""
    fig.canvas.draw()
    return [(a.get_text(), b.get_text()) for (a, ba), (b, bb) in combinations(_boxes(fig, texts(fig)), 2)
            if ba.overlaps(bb)]


def _inside(fig, box):
    return fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1


def cut_off(fig):
    """[text] of the figure's texts that reach past its edges (the saved image
    would cut them), after a draw."""
    fig.canvas.draw()
    return [t.get_text() for t, box in _boxes(fig, texts(fig)) if not _inside(fig, box)]


def mark_boxes(ax, marks, *, pad=6):
    """Display boxes (pixels) of marks drawn in ax: (x, y low, y high) in data coordinates (a
    marker: low = high; an error bar: its ends), padded by `pad` pixels; obstacles for separate().
    Call after the layout is final."""
    from matplotlib.transforms import Bbox

    out = []
    for x, lo, hi in marks:
        (x0, y0), (x1, y1) = ax.transData.transform([(x, lo), (x, hi)])
        out.append(Bbox([[min(x0, x1) - pad, min(y0, y1) - pad], [max(x0, x1) + pad, max(y0, y1) + pad]]))
    return out


def _candidates(dx, dy, *, step, tries):
    """Offsets to try: beside the point on its side, then farther up or down
    alternately, then the other side."""
    shifts = [step * ((k + 1) // 2) * (1 if k % 2 else -1) for k in range(tries + 1)]
    return [(x, dy + s) for x in (dx, -dx) for s in shifts]


def separate(fig, annotations, *, obstacles=None, step=4, tries=40):
    """Move each annotation, in the order given, until its box lies inside the figure and overlaps none
    of the figure's other texts, none of the obstacles (boxes in display pixels: markers, error bars) and
    no annotation already placed: first up and down on its side of the point (farther each try, `step`
    points at a time), then on the other side. A label that finds no free place goes where it overlaps
    the fewest boxes, inside the figure if any place there is. Draws the figure first, then calls
    `obstacles` (a function returning the boxes; mark_boxes needs the final layout), so no caller draws
    the figure once more to measure them."""
    fig.canvas.draw()
    obstacles = obstacles() if obstacles else []
    movable = set(map(id, annotations))
    placed = [b for t, b in _boxes(fig, texts(fig)) if id(t) not in movable] + list(obstacles)
    renderer = fig.canvas.get_renderer()
    for a in annotations:
        first, ha = a.xyann, a.get_ha()
        flipped = {"left": "right", "right": "left"}.get(ha, ha)
        best = None
        for dx, dy in _candidates(*first, step=step, tries=tries):
            a.xyann = (dx, dy)
            a.set_ha(ha if (dx >= 0) == (first[0] >= 0) else flipped)
            box = _box(a, renderer)
            hits = sum(box.overlaps(b) for b in placed) + (0 if _inside(fig, box) else len(placed) + 1)
            if best is None or hits < best[0]:
                best = (hits, (dx, dy), a.get_ha(), box)
            if not hits:
                break
        _, a.xyann, side, box = best
        a.set_ha(side)
        placed.append(box)
