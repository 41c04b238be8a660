"""
Where a training step's CPU time goes, by kind of op (bench.py --profile=True): torch.profiler's self CPU
time of every op, from key_averages, summed into a few groups. Each step runs inside a span of its own
(STEP); that span's self time is the time in no op at all (Python between ops), so the groups sum to the
steps' time as the profiler saw it.
"""

from torch.profiler import ProfilerActivity, profile, record_function

STEP = "op_profile step"  # the span around each profiled step
# (group, substrings of op names), first match wins; what matches none is 'other', the step span's own time
# 'python'
GROUPS = (
    ("optimizer", ("optimizer.", "_foreach_", "adam")),  # matched lower-case
    ("matmul", ("mm", "linear", "matmul")),  # mm, bmm, addmm, baddbmm and their backward nodes' ops
    ("layer_norm", ("layer_norm", "layernorm")),
    ("attention", ("attention", "softmax")),
    ("copies", ("copy", "cat", "stack", "index", "clone", "contiguous", "to_copy", "expand", "split",
                "unbind")),
    ("elementwise", ("add", "sub", "mul", "div", "gelu", "sum", "neg", "fill", "zero", "where", "masked")),
)
ORDER = (*(g for g, _ in GROUPS), "other", "python")


def group_of(name):
    """The group of a profiler event name ('aten::baddbmm' -> 'matmul'); the step span itself -> 'python'."""
    if name == STEP:
        return "python"
    low = name.lower()
    return next((g for g, words in GROUPS if any(w in low for w in words)), "other")


def op_breakdown(step, n):
    """Run step() n times under the CPU profiler: ({group: self CPU ms per step}, the
    step span's ms per step)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            with record_function(STEP):
                step()
    ms = dict.fromkeys(ORDER, 0.0)
    total = 0.0
    for e in prof.key_averages():
        ms[group_of(e.key)] += e.self_cpu_time_total / 1e3 / n  # microseconds over all n steps
        if e.key == STEP:
            total = e.cpu_time_total / 1e3 / n
    return ms, total


def compare(steps, n, rounds=3):
    """op_breakdown of each of steps ({name: step function}), the models interleaved in rounds so that machine
    noise hits all alike; each model's round of least total time kept. {name: (groups, total)}."""
    best = {}
    for _ in range(rounds):
        for name, step in steps.items():
            got = op_breakdown(step, n)
            if name not in best or got[1] < best[name][1]:
                best[name] = got
    return best


def breakdown_table(rows, base="gpt"):
    """Markdown lines: a column per model ({name: (groups, total)} from op_breakdown), then each model's
    excess over `base` (ms per step)."""
    names = list(rows)
    others = [n for n in names if n != base and base in rows]
    head = "| self CPU ms/step | " + " | ".join(f"`{n}`" for n in names) + "".join(
        f" | `{n}` - `{base}`" for n in others) + " |"
    lines = [head, "|---" + "|---:" * (len(names) + len(others)) + "|"]
    for g in (*ORDER, "total"):
        val = {n: rows[n][1] if g == "total" else rows[n][0][g] for n in names}
        lines.append(f"| {g} | " + " | ".join(f"{val[n]:.2f}" for n in names) + "".join(
            f" | {val[n] - val[base]:+.2f}" for n in others) + " |")
    return lines
