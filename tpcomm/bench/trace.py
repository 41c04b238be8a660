"""
A trace of every tensor-parallel collective, with the compute around it: torch.profiler's Chrome trace (open
it in https://ui.perfetto.dev or chrome://tracing), in which each collective that f and g run (and the
vocab-parallel ones, and real TP's per-step gradient sync) is a span named for where it ran (tp_comm.traced):

    allreduce g fwd L3 spd mlp 24576B real        allreduce f bwd L0 tp attn 24576B sim

An asynchronous all-reduce (op g_async: the ladder block's) is a span where it is issued, and the wait for its
result a span of its own, the same label after 'wait ' (collective_events(..., waits=True) returns those too).

    with trace_steps("trace.json") as tracer:     # profiles, and writes the file on exit
        for _ in range(2):
            with tracer.step():                   # one "ProfilerStep#k" span per training step
                train_step()
    events = collective_events("trace.json")      # [{'op': 'g', 'direction': 'fwd', 'layer': 3, ...}, ...]

`bench.py --trace=FILE` writes such a trace after its timed steps. From the command line:

    python -m tpcomm.bench.trace plot OUT.png A.json [B.json ...] [--labels=a,b] [--step=0] [--title=T]
        one step of each trace, a row each on one time axis (labels with commas: --labels="['a, b', 'c']")
    python -m tpcomm.bench.trace summary A.json [B.json ...]
        the collectives of each step, and the time in them; per direction, how much of it ran beside compute

Bad input (a missing or corrupt trace, a step the trace lacks, labels that do not match) is one line, exit 2.
Under real TP each of these spans holds torch's own span of the collective (gloo:all_reduce, nccl:all_reduce).
Inside torch.compile'd code the collectives are not labelled (their ops still appear in the trace).
"""

import ast
import contextlib
import gzip
import json
import os
import re
import sys

import torch

from tpcomm.configuration import exit_in_one_line, exit_on_config_error
from tpcomm.train.output_path import MARK, check_output_file, replace_atomically, written_by

STEP_PREFIX = "ProfilerStep#"  # the span of one training step (torch.profiler's own name for it)
# tp_comm.traced's label, parsed back the last three: sequence parallelism's, ring_p2p one transfer of
# collective matmul's rings (tp_collective_matmul)
COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather", "ring_p2p")
LABEL = re.compile(r"^(?P<collective>allreduce|reduce_scatter|all_gather|ring_p2p) (?P<op>\w+) "
                   r"(?P<direction>fwd|bwd)(?: L(?P<layer>\d+) (?P<block>\S+))? (?P<site>\w+) "
                   r"(?P<bytes>\d+)B (?P<mode>sim|real)$")
# tp_comm.traced(waiting=True): the wait for an asynchronous all-reduce, before its label
WAIT_PREFIX = "wait "
COMPUTE_CATEGORIES = ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset")  # drawn grey by plot_timeline


class TraceError(ValueError):
    """A trace file that cannot be read or used as asked: one line naming it, exit status 2."""


class Tracer:
    """What trace_steps yields: step() marks one training step (a no-op when tracing is disabled)."""

    def __init__(self, enabled):
        self.enabled, self.steps = enabled, 0

    def step(self):
        if not self.enabled:
            return contextlib.nullcontext()
        self.steps += 1
        return torch.profiler.record_function(f"{STEP_PREFIX}{self.steps - 1}")


def split_extension(path):
    """'a/trace.json' -> ('a/trace', '.json'); a torch-gzipped '.json.gz' stays one extension."""
    if path.endswith(".json.gz"):
        return path[:-len(".json.gz")], ".json.gz"
    return os.path.splitext(path)


def rank_path(path, rank):
    """The trace file of a rank: `path` on rank 0, `.rank<r>` before the extension on rank r > 0."""
    if rank == 0:
        return path
    root, ext = split_extension(path)
    return f"{root}.rank{rank}{ext}"


@contextlib.contextmanager
def trace_steps(path, *, enabled=True):
    """Profile the enclosed steps (CPU, plus CUDA when available) and write a Chrome trace to
    `path` on exit (not after an exception). Yields a Tracer: wrap each training step in
    `tracer.step()`. enabled=False: nothing is profiled or written, and tracer.step() does
    nothing, so a training loop can keep the same code."""
    tracer = Tracer(enabled)
    if not enabled:
        yield tracer
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield tracer
    replace_atomically(lambda tmp: mark_trace(prof, tmp), str(path))


def mark_trace(prof, path):
    """The profiler's Chrome trace at path, with this project's mark (output_path.written_by('trace'))."""
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    trace["written_by"] = MARK + "trace"
    with open(path, "w") as f:
        json.dump(trace, f)


def load_trace(source):
    """A trace: the dict itself, or read from a path (.json, or .json.gz as torch may write)."""
    if isinstance(source, dict):
        trace = source
    else:
        try:
            opener = gzip.open if str(source).endswith(".gz") else open
            with opener(source, "rt") as f:
                trace = json.load(f)
        except FileNotFoundError:
            raise TraceError(f"no trace file {str(source)!r}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, EOFError) as e:
            raise TraceError(f"trace file {str(source)!r} is not readable JSON "
                             f"({type(e).__name__})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceError(f"{_name(source)} is not a Chrome trace (no 'traceEvents' list)")
    check_events(trace, source)
    return trace


def check_events(trace, source):
    """Every event a dict with a string 'ph' (its phase); a complete event ('X'), and any event named as a
    collective or a training step, with a string name and numeric ts and dur. Otherwise a TraceError naming
    the first bad event: a malformed trace would read as one with no collectives."""
    def timed(e):
        return all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool)
                   for k in ("ts", "dur"))

    for i, e in enumerate(trace["traceEvents"]):
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str):
            raise TraceError(f"{_name(source)}: traceEvents[{i}] is not a trace event (a dict with a 'ph' "
                             f"string), got {str(e)[:80]}")
        name = e.get("name")
        named = isinstance(name, str) and (name.startswith((STEP_PREFIX, WAIT_PREFIX + "allreduce "))
                                           or LABEL.match(name) is not None
                                           or name.startswith(tuple(f"{c} " for c in COLLECTIVES)))
        if (e["ph"] == "X" and not isinstance(name, str)) or ((e["ph"] == "X" or named) and not timed(e)):
            raise TraceError(f"{_name(source)}: traceEvents[{i}] ({str(name)[:60]!r}, ph {e['ph']!r}) lacks "
                             "a " f"string name and numeric ts and dur")


def _name(source):
    return "the trace" if isinstance(source, dict) else f"trace file {str(source)!r}"


def _spans(trace):
    """Complete events ('ph': 'X') with a name, numeric ts and dur."""
    return [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
            and isinstance(e.get("name"), str) and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur"), (int, float))]


def step_spans(source):
    """[(start, end)] in µs of the trace's training steps (its ProfilerStep#k spans), in time order."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in _spans(load_trace(source))
                  if e["name"].startswith(STEP_PREFIX))


def parse_label(name):
    """A collective's span name -> dict(op, direction, layer, block, site, bytes, mode, category), or None for
    any other span. category: 'stream' (the residual-stream syncs comm_report counts as fwd/bwd_allreduces),
    'vocab' (loss_parallel's embedding, head and loss), 'grad' (real TP's gradient sync and clipping norm),
    'sp' (sequence parallelism's reduce-scatters and all-gathers; collective says which), or 'wait' (the wait
    for an asynchronous all-reduce: the fields are those of the all-reduce waited for)."""
    waiting = name.startswith(WAIT_PREFIX)
    m = LABEL.match(name[len(WAIT_PREFIX):] if waiting else name)
    if m is None:
        return None
    site = m["site"]
    category = "vocab" if site.startswith("vocab") else "grad" if site.startswith("grad") else "stream"
    if m["collective"] != "allreduce":
        category = "sp"
    if waiting:
        category = "wait"
    return {"collective": m["collective"], "op": m["op"], "direction": m["direction"],
            "layer": None if m["layer"] is None else int(m["layer"]), "block": m["block"], "site": site,
            "bytes": int(m["bytes"]), "mode": m["mode"], "category": category}


def collective_events(source, *, waits=False):
    """The collectives of a trace (a path or a loaded trace), in time order: dicts of parse_label's
    fields plus name, ts and dur (µs, the trace's clock), pid, tid and step (the index of the training
    step whose span holds it, None outside every step). waits=True: also the waits for asynchronous
    all-reduces (category 'wait')."""
    trace = load_trace(source)
    steps = step_spans(trace)
    events = []
    for e in _spans(trace):
        parsed = parse_label(e["name"])
        if parsed is None or (parsed["category"] == "wait" and not waits):
            continue
        step = next((i for i, (a, b) in enumerate(steps) if a <= e["ts"] <= b), None)
        events.append(dict(parsed, name=e["name"], ts=e["ts"], dur=e["dur"], pid=e.get("pid"),
                           tid=e.get("tid"), step=step))
    return sorted(events, key=lambda ev: ev["ts"])


def tally_events(events):
    """How many collectives of each kind among `events`: fwd and bwd (residual-stream all-reduces, comparable
    with comm_report's fwd_allreduces / bwd_allreduces), grad_sync, grad_norm, vocab, reduce_scatter and
    all_gather (sequence parallelism, both directions), and all of them."""
    out = {"fwd": 0, "bwd": 0, "grad_sync": 0, "grad_norm": 0, "vocab": 0, "reduce_scatter": 0,
           "all_gather": 0, "ring_p2p": 0, "all": len(events)}
    for ev in events:
        category = ev["category"]
        key = (ev["direction"] if category == "stream" else ev["site"] if category == "grad"
               else ev["collective"] if category == "sp" else "vocab")
        out[key] += 1
    return out


def per_step_counts(source):
    """tally_events() of each training step of a trace, in step order."""
    trace = load_trace(source)
    events = collective_events(trace)
    return [tally_events([ev for ev in events if ev["step"] == i]) for i in range(len(step_spans(trace)))]


def step_timeline(source, step=0):
    """One step of a trace: (start µs, end µs, compute intervals, collective events), the compute intervals
    merged (the union of the step's CPU ops and GPU kernels), both as (start, end) relative to the step's
    start. A trace without step spans is taken whole, as one step."""
    trace = load_trace(source)
    spans = _spans(trace)
    steps = step_spans(trace)
    if steps:
        if not -len(steps) <= step < len(steps):
            raise TraceError(f"{_name(source)} has {len(steps)} step(s); there is no step {step}")
        start, end = steps[step]
    elif spans:
        start, end = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    else:
        raise TraceError(f"{_name(source)} has no timed events")
    busy = sorted((max(e["ts"], start), min(e["ts"] + e["dur"], end)) for e in spans
                  if e.get("cat") in COMPUTE_CATEGORIES and e["ts"] < end and e["ts"] + e["dur"] > start)
    merged = []
    for a, b in busy:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    events = [dict(ev, ts=ev["ts"] - start) for ev in collective_events(trace) if start <= ev["ts"] <= end]
    return start, end, [(a - start, b - start) for a, b in merged], events


def plot_timeline(sources, out_png, labels=None, *, step=0, title=None):
    """One training step of each trace (paths or loaded traces), one row each on a common time axis in ms
    (tpcomm/figures/command_figures.draw_trace), and the plotted numbers beside the PNG (<name>.data.json)."""
    from tpcomm.figures import command_figures

    sources = list(sources)
    if not sources:
        raise TraceError("no trace to plot")
    labels = list(labels) if labels is not None else [str(s) if not isinstance(s, dict) else f"trace {i}"
                                                      for i, s in enumerate(sources)]
    if len(labels) != len(sources):
        raise TraceError(f"{len(labels)} label(s) for {len(sources)} trace(s)")
    rows = []
    for start, end, compute, events in (step_timeline(s, step) for s in sources):
        rows.append([end - start, [list(c) for c in compute], [[ev["ts"], ev["dur"],
                                                                "grad" if ev["category"] == "grad"
                                                                else ev["direction"]] for ev in events]])
    data = dict(kind="trace", title=title, labels=labels, rows=rows)
    try:
        command_figures.write(command_figures.draw_trace(data), str(out_png), data)
    except OSError as e:
        raise TraceError(f"cannot write {str(out_png)!r} ({e.strerror or type(e).__name__})") from None


def overlap_by_direction(events):
    """Per direction ('fwd', 'bwd'; a gradient sync is 'bwd', as labelled) of collective_events(...,
    waits=True): dict(n, in_ms, exposed_ms, beside_ms, share). A blocking collective is in progress over
    its span, all of it exposed; an asynchronous one (a span followed by a 'wait ' span of the same
    label) from its issue to the end of its wait, exposed only inside those two spans: the rest of it ran
    beside compute. share = beside / in. Host spans: the same definitions as the counter's exposed and
    in-collective seconds (tpcomm/tp/counting.py)."""
    out = {d: dict(n=0, in_ms=0.0, exposed_ms=0.0) for d in ("fwd", "bwd")}
    issued = {}  # label -> issue events not yet waited for, in order
    rows = []  # [direction, start, end, exposed] per collective
    for ev in sorted(events, key=lambda e: e["ts"]):
        if ev["category"] == "wait":
            pending = issued.get(ev["name"][len(WAIT_PREFIX):])
            if pending:
                row = pending.pop(0)
                row[2] = max(row[2], ev["ts"] + ev["dur"])
                row[3] += ev["dur"]
            continue
        row = [ev["direction"], ev["ts"], ev["ts"] + ev["dur"], ev["dur"]]
        rows.append(row)
        issued.setdefault(ev["name"], []).append(row)
    for direction, start, end, exposed in rows:
        d = out[direction]
        d["n"] += 1
        d["in_ms"] += (end - start) / 1e3
        d["exposed_ms"] += exposed / 1e3
    for d in out.values():
        d["beside_ms"] = d["in_ms"] - d["exposed_ms"]
        d["share"] = d["beside_ms"] / d["in_ms"] if d["in_ms"] else 0.0
    return out


def device_overlap(trace, start, end):
    """GPU traces: (ms of NCCL kernels in [start, end], ms of them beside other
    kernels), or None without any."""
    kernels = [e for e in _spans(trace) if e.get("cat") == "kernel" and start <= e["ts"] <= end]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()]
    if not comm:
        return None
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()]
    beside = sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in _merged(compute))
    return sum(b - a for a, b in comm) / 1e3, beside / 1e3


def _merged(intervals):
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def summary(source):
    """Two lines per step: its collectives by kind and its time in them; then per direction the time in
    collectives and how much of it ran beside compute (overlap_by_direction), and on a GPU trace the NCCL
    kernels' time beside other kernels."""
    lines = []
    trace = load_trace(source)
    events = collective_events(trace)
    with_waits = collective_events(trace, waits=True)
    for i, (a, b) in enumerate(step_spans(trace)):
        mine = [ev for ev in events if ev["step"] == i]
        c = tally_events(mine)
        spent = sum(ev["dur"] for ev in mine) / 1e3
        lines.append(f"step {i}: {c['fwd']} fwd + {c['bwd']} bwd all-reduces, {c['grad_sync']} grad sync, "
                     f"{c['grad_norm']} grad norm, {c['vocab']} vocab" + (f", {c['reduce_scatter']} "
                                                                             f"reduce-scatters + "
                                                                             f"{c['all_gather']} "
                                                                             "all-gathers"
                                                                             if c["reduce_scatter"]
                                                                             or c["all_gather"] else "")
                     + (f", {c['ring_p2p']} ring transfers" if c["ring_p2p"] else "") + f"; {spent:.2f} of "
                     f"{(b - a) / 1e3:.2f} ms in collectives")
        per = overlap_by_direction([ev for ev in with_waits if ev["step"] == i])
        line = f"step {i} overlap: " + "; ".join(f"{d} {v['in_ms']:.2f} ms in collectives, "
                                                 f"{v['exposed_ms']:.2f} exposed, {v['beside_ms']:.2f} "
                                                 "beside " f"compute ({100 * v['share']:.0f}%)" for d,
                                                 v in per.items())
        device = device_overlap(trace, a, b)
        if device is not None:
            line += f"; device: NCCL kernels {device[0]:.2f} ms, {device[1]:.2f} beside other kernels"
        lines.append(line)
    return lines or [f"no steps; {len(events)} collectives"]


USAGE = ("usage: python -m tpcomm.bench.trace plot OUT.png TRACE.json [TRACE.json ...] [--labels=a,b] "
         "[--step=N] [--title=T] | python -m tpcomm.bench.trace summary TRACE.json [...]")


def parse_labels(text):
    """--labels: 'a,b' or, for labels with commas, a Python list of strings:
    "['tp']*12", "['parallel','spd']*6"."""
    if not text.lstrip().startswith("["):
        return text.split(",")
    try:
        labels = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        labels = None
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise TraceError(f"--labels must be a,b or a list of strings ['a', 'b'], got {text!r}")
    return labels


@exit_on_config_error
@exit_in_one_line(TraceError, 2)
def main(argv):
    options = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    args = [a for a in argv if not a.startswith("--")]
    unknown = sorted({a.split("=", 1)[0] for a in argv if a.startswith("--")}
                     - {"--labels", "--step", "--title"})
    if not args or args[0] not in ("plot", "summary") or unknown or any(a.startswith("--") and "=" not in a
                                                                         for a in argv):
        raise TraceError(USAGE)
    if args[0] == "summary":
        if len(args) < 2:
            raise TraceError(USAGE)
        for path in args[1:]:
            for line in summary(path):
                print(f"{path}: {line}")
        return
    if len(args) < 3:
        raise TraceError(USAGE)
    out, paths = args[1], args[2:]
    check_output_file(out, key="plot OUT.png", own=written_by("figure trace"), suffixes=(".png",))
    try:
        step = int(options.get("--step", "0"))
    except ValueError:
        raise TraceError(f"--step must be an int, got {options['--step']!r}") from None
    labels = parse_labels(options["--labels"]) if "--labels" in options else None
    plot_timeline(paths, out, labels, step=step, title=options.get("--title"))
    print(f"plot: {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
