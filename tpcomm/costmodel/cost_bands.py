"""
Every predicted speedup as a band [low, high] over declared ranges of the cost model's assumptions, not
one point (docs/cost_model.md, "Bands"). The point prediction (tpcomm/costmodel/cost_model.py's
constants) sits inside its band.

    overlap efficiency   0.5 - 1            the share of concurrent compute that hides communication
    GEMM efficiency      0.25 - 0.5         the compute's share of peak (mfu), thin tp shards to good GEMMs; a
                                            measured range (docs/gpu.json's cost_calibration) widens it
    link bus bandwidth   NVLink 360 - 480   ring all-reduce vs NVLink SHARP (NVLS) busbw on 8x H100, GB/s
                         IB NDR 40 - 48     80-96% of 50 GB/s a port
    latency              2 - 35 us          per collective (or ring step), across NCCL versions and set-ups
    codec kernels        2 - 8 us launch, 50 - 100% of HBM bandwidth   quantize and dequantize (compression)

speedup_bands(link) evaluates the model at every combination of each range's ends, middle and the point
prediction's value (up to 4^6 points) and keeps the smallest and largest speedup per variant; always() says
whether a comparison holds at every point.
"""

import functools
import itertools
import json
import os
from typing import NamedTuple

from tpcomm import ROOT
from tpcomm.costmodel import cost_model as cm

GPU_JSON = os.path.join(ROOT, "docs", "gpu.json")


class Range(NamedTuple):
    low: float
    high: float
    source: str

    def points(self, point=None):
        """The low end, the middle, the high end and the point prediction's value (when given and inside)."""
        ends = [self.low, (self.low + self.high) / 2, self.high]
        return tuple(sorted(set(ends + ([point] if point is not None and self.low <= point <= self.high
                                        else []))))


RANGES = {"efficiency": Range(0.5, 1.0, "assumed: NCCL's kernels take SMs and memory bandwidth from the "
                              "compute they overlap; 1 is ideal"), "mfu": Range(0.25, 0.5, "assumed: GEMM "
                                                                                   "efficiency of tp-8 "
                                                                                   "shards of 1.3B-70B "
                                                                                   "models on H100, "
                                                                                   "unmeasured here"),
          "nvlink_busbw": Range(360e9, 480e9, "nccl-tests all_reduce_perf busbw on 8x H100 SXM: ~360 GB/s "
                                "ring, ~480 GB/s with NVLink SHARP (NVLS)"),
          "ib_busbw": Range(40e9, 48e9, "InfiniBand NDR 400 Gb/s (50 GB/s) a port: 80-96% of line rate as "
                            "busbw"), "latency": Range(2e-6, 35e-6, "NCCL small-message latency, 2 us (NVLS, "
                                                       "tuned) to 35 us (across nodes, older NCCL)"),
          "launch": Range(2e-6, 8e-6, "assumed: launch and tail of a quantize or dequantize kernel"),
          "hbm_share": Range(0.5, 1.0, "assumed: the codec kernels' share of the datasheet HBM bandwidth"),}
LINK_RANGE = {cm.LINKS[0].name: "nvlink_busbw", cm.LINKS[1].name: "ib_busbw"}


def measured_mfu_range(path=GPU_JSON):
    """(low, high) GEMM efficiency that docs/gpu.json's cost_calibration section measured on a GPU, or None
    where no GPU has run it (the file, the section or its numbers absent)."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    if not str(report.get("device", "")).startswith("cuda"):  # a CPU rehearsal's numbers calibrate nothing
        return None
    section = (report.get("sections") or {}).get("cost_calibration") or {}
    effs = [row["gemm_efficiency"] for row in section.get("blocks", [])
            if isinstance(row, dict) and isinstance(row.get("gemm_efficiency"), (int, float))]
    return (min(effs), max(effs)) if effs else None


def ranges(path=GPU_JSON):
    """RANGES, the GEMM efficiency widened to take in the measured one where docs/gpu.json has it.
    Widened, not replaced: the measurement is this repository's shard block at one shape (1.3B, tp 8:
    unfused LayerNorm, GELU and attention around GEMMs that alone reach ~50%), while the bands also
    price 8B and 70B, whose larger shards run closer to the GEMMs' efficiency, and kernels fused as
    production stacks fuse them."""
    measured = measured_mfu_range(path)
    if measured is None:
        return dict(RANGES)
    assumed = RANGES["mfu"]
    low, high = min(assumed.low, measured[0]), max(assumed.high, measured[1])
    return dict(RANGES, mfu=Range(low, high, f"{100 * measured[0]:.0f}%-{100 * measured[1]:.0f}% measured "
                                  "(make " f"gpu-check's cost_calibration, {os.path.relpath(path, ROOT)}: "
                                  "the 1.3B tp-8 shard " f"block) and "
                                  f"{100 * assumed.low:.0f}%-{100 * assumed.high:.0f}% assumed for larger "
                                  f"shapes and fused kernels"))


def _speedups(link, *, mfu, efficiency, busbw, latency, launch, hbm_share, baseline):
    """({variant: speedup over the baseline}, {variant: ms per micro-step saved})
    at one set of assumptions."""
    cfg = cm.PREDICT_DEFAULTS
    opts = cm.Options(chunks=cfg["tp_overlap"], efficiency=efficiency, launch=launch,
                      hbm_bw=hbm_share * cm.const("h100_hbm_bw"))
    v = cm.train_variants(cm.FIGURE_SHAPE, tp=8, link=link._replace(alpha=latency, busbw=busbw),
                          tokens=cfg["batch_size"] * cfg["seq_len"], seq_len=cfg["seq_len"], mfu=mfu,
                          opts=opts, async_grad=baseline == "megatron")
    base = sum(v["all tp"])
    return ({name: cm.speedup(v, key) for name, key in cm.figure_variants(cfg["tp_overlap"]).items()},
            {name: 1e3 * (base - sum(v[key])) for name, key in cm.figure_variants(cfg["tp_overlap"]).items()})


@functools.lru_cache(maxsize=8)
def grid(link_name, *, baseline="megatron", path=GPU_JSON):
    """[(assumptions dict, {variant: speedup}, {variant: ms saved a micro-step})] at every combination of
    each range's low, middle and high, for the figure's case (cost_model.FIGURE_SHAPE at tp 8) on
    link_name ('nvlink' or 'ib')."""
    link = cm.LINK_ALIASES[link_name.lower()]
    r = ranges(path)
    cfg = cm.PREDICT_DEFAULTS
    axes = {"mfu": (r["mfu"], cfg["mfu"]), "efficiency": (r["efficiency"], cfg["efficiency"]),
            "busbw": (r[LINK_RANGE[link.name]], link.busbw), "latency": (r["latency"], link.alpha),
            "launch": (r["launch"], cm.const("kernel_launch")), "hbm_share": (r["hbm_share"], 1.0)}
    out = []  # a tuple, below: cached, so never changed in place
    for values in itertools.product(*(a.points(point) for a, point in axes.values())):
        at = dict(zip(axes, values))
        out.append((at, *_speedups(link, baseline=baseline, **at)))
    return tuple(out)


def speedup_bands(link_name, *, baseline="megatron", path=GPU_JSON):
    """{variant: (low, high)} predicted speedup over the baseline across the declared ranges (the
    figure's variant names, cost_model.figure_variants). The data the figure's horizontal bands and the
    answer's [low, high] use."""
    points = grid(link_name, baseline=baseline, path=path)
    key = (link_name, baseline, path)
    # computed once per grid (a cleared grid is a new one)
    if key not in _BANDS or _BANDS[key][0] is not points:
        _BANDS[key] = (points, {name: (min(s[name] for _, s, _ in points), max(s[name] for _, s, _ in points))
                                for name in cm.figure_variants(cm.PREDICT_DEFAULTS["tp_overlap"])})
    return dict(_BANDS[key][1])


_BANDS = {}  # (link, baseline, path) -> (the grid, its bands)


def always(points, test):
    """'always', 'never' or 'sometimes': whether test(speedups) holds at every point of the grid."""
    held = [test(s) for _, s, _ in points]
    return "always" if all(held) else "never" if not any(held) else "sometimes"


AXIS_WORDS = {"mfu": "GEMM efficiency", "efficiency": "overlap efficiency", "busbw": "link bandwidth",
              "latency": "latency", "launch": "the codec kernels' launch", "hbm_share": "the codec kernels' "
              "bandwidth"}


def condition(points, test):
    """Where test(speedups) holds, in words: 'at every assumption', 'at no assumption', or what it
    depends on (the assumption whose value alone decides it, with the values where it holds; else the
    assumptions that move it)."""
    verdict = always(points, test)
    if verdict != "sometimes":
        return "at every assumption" if verdict == "always" else "at no assumption"
    movers = []
    for axis in points[0][0]:
        by_value = {}
        for at, s, _ in points:
            by_value.setdefault(at[axis], set()).add(test(s))
        if all(len(v) == 1 for v in by_value.values()):
            held = sorted(value for value, v in by_value.items() if True in v)
            span = _fmt(axis, held[0]) + ("" if len(held) == 1 else f" to {_fmt(axis, held[-1])}")
            return f"only at {AXIS_WORDS[axis]} {span}"
        if any(len(v) == 1 for v in by_value.values()):
            movers.append(AXIS_WORDS[axis])
    return "at some assumptions (it depends on " + (", ".join(movers) or "them together") + ")"


def _fmt(axis, value):
    return {"mfu": f"{value:.0%}", "efficiency": f"{value:g}", "busbw": f"{value / 1e9:.0f} GB/s",
            "latency": f"{value * 1e6:g} us", "launch": f"{value * 1e6:g} us",
            "hbm_share": f"{value:.0%}"}[axis]


def step_saved_ms(link_name, variant, *, baseline="megatron", path=GPU_JSON):
    """(low, high) milliseconds per training micro-step the variant saves against the baseline across the
    ranges (negative: it costs time): the ratio sentences restated as time."""
    points = grid(link_name, baseline=baseline, path=path)
    return min(ms[variant] for _, _, ms in points), max(ms[variant] for _, _, ms in points)
