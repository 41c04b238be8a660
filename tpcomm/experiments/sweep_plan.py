"""
The sweeps as data: each sweep a list of Runs (a train.py config file plus its own --key=value overrides), the
seeds each is trained with, and the remark printed with its table. tpcomm/experiments/sweep.py runs them;
tpcomm/experiments/report/report.py reads the result files they leave. A run's name names its directory and
result file (experiments/<sweep>/runs/<run>-seed<S> .json): renaming a run here orphans its committed results
(`python experiment.py report --check` fails).
"""

from dataclasses import dataclass, replace

from tpcomm.experiments import ways
from tpcomm.model.options import compact_list

@dataclass(frozen=True)
class Run:
    """One point of a sweep: a train.py config file plus its own --key=value overrides."""
    name: str  # e.g. '24comm'; run directories are <name>-seed<S>
    config: str  # relative to the repo root
    overrides: tuple = ()
    nproc: int = 1  # processes per run (torchrun when > 1); None: one per GPU of the node (sweep.node_gpus)
    # the sweep whose directory holds this run when another sweep shares it (None: this sweep's)
    home: str = None
    seeds: tuple = None  # the only seeds this run is trained with (None: every seed of the sweep)


def comm_runs(pattern, budgets, *, overrides=(), nproc=1):
    return [Run(f"{n}comm", pattern.format(n), tuple(overrides), nproc) for n in budgets]


def one_change(key, n_layer=12):
    """A way's one change to an all-'tp' config of n_layer layers (tpcomm/experiments/ways.py): its sync
    options where it sets any, else its block pattern."""
    way = ways.way(key)
    if way.sync:
        return tuple(f"--{k}={v}" for k, v in way.sync.items())
    return (f"--block_types={compact_list(way.blocks(n_layer))}",)


# the syncs kept but delayed (ladder) or shrunk (tp_comm_dtype): a budget's config with one change (a way's),
# named <n>comm-<change> (n still the forward all-reduces it runs)
DELAY_SHRINK = {"ladder": "all-ladder", "ladder-upper": "ladder-upper",
                **{dtype: f"all-tp-{dtype}" for dtype in ("bf16", "fp8", "int8")}}


def delay_shrink_runs(pattern):
    """all 'tp' (24 syncs) delayed or compressed each way, and all 'spd' (12) compressed to int8."""
    return [*(Run(f"24comm-{change}", pattern.format(24), one_change(key)) for change,
              key in DELAY_SHRINK.items()), Run("12comm-int8", pattern.format(12), one_change("all-tp-int8"))]


# ---- the axes sweeps (docs/axes.md): one model, varied along one axis at a time, 3 seeds, resumable ----
# 12 layers x 64, 8 heads, tp 4, 5000 steps, eval every 250 on 50 batches
AXES_CONFIG = "config/sweep_axes.py"
AXES_SIZE, AXES_STEPS, AXES_SEEDS = (12, 64, 8), 5000, (1337, 1338, 1339)
# cpu-long's resolved patterns get ten seeds, all spd and its baseline eleven: the power calculation in
# docs/axes.md ("Seeds for a 0.010 half-width")
RESOLVED_SEEDS = tuple(range(1337, 1348))
PATTERNS = ways.patterns()  # {name: block pattern of n layers}, the ways' (tpcomm/experiments/ways.py)
TP_AXIS_PATTERNS = ("all-spd", "parallel-spd", "all-parallel", "all-ladder", "ladder-upper")
# (n_layer, n_embd, n_head): max_iters. Tokens per parameter fixed (docs/axes.md, "The size axis"): steps =
# 3,840,000 / 591,424 non-embedding parameters (the 12 x 64 model at 5000 steps: 6.49 tokens/param) x the
# size's non-embedding parameters / 768 tokens per step, rounded to a multiple of 20 (an eval every 5% of
# training); tests/experiments/test_experiment.py recomputes it from the models.
SIZE_AXIS = {(12, 64, 8): 5000, (4, 48, 4): 940, (2, 32, 4): 200}
# docs/axes.md: planned from the old cpu-long curve; the baseline is still not flat here
CONVERGENCE_STEPS = 20000


def axes_run(pattern, *, tp=4, size=AXES_SIZE, steps=AXES_STEPS, home=None, seeds=None):
    """A run of the axes model with one thing changed: `pattern` a way's key (tpcomm/experiments/ways.py: its
    block pattern and sync options, e.g. 'all-tp-int8-2shot'), named by it. The schedule scales with the
    steps: warmup 1%, cosine decay to the last step, an eval every 5% (5000 steps: warmup 50, eval every 250,
    as config/sweep_axes.py)."""
    n_layer, n_embd, n_head = size
    way = ways.way(pattern)
    overrides = [f"--block_types={compact_list(way.blocks(n_layer))}",
                 *(f"--{k}={v}" for k, v in way.sync.items())]
    name = pattern
    if tp != 4:
        overrides.append(f"--tp_size={tp}")
        name += f"-tp{tp}"
    if size != AXES_SIZE:
        overrides += [f"--n_layer={n_layer}", f"--n_embd={n_embd}", f"--n_head={n_head}"]
        name += f"-{n_layer}x{n_embd}"
    if steps != AXES_STEPS:
        overrides += [f"--max_iters={steps}", f"--lr_decay_iters={steps}", f"--warmup_iters={steps // 100}",
                      f"--eval_interval={steps // 20}"]
    return Run(name, AXES_CONFIG, tuple(overrides), home=home, seeds=seeds)


# the order of cpu-long's committed tables (its runs are planned in it; a way not named here comes after them)
CPU_LONG_ORDER = ("all-tp", "all-spd", "parallel-spd", "all-parallel", "all-ladder", "ladder-upper",
                  "all-tp-bf16", "all-tp-fp8", "all-tp-int8", "all-spd-int8", "all-tp-int8-2shot", "all-caat",
                  "parallel3-spd", "all-caat-p0.25", "all-caat-p0.75", "parallel2-spd", "parallel5-spd")


def cpu_long_runs():
    """Every way cpu-long trains (ways.Way.seeds > 0), each with the first `seeds` of RESOLVED_SEEDS (all of
    them: None, the sweep's)."""
    trained = sorted((w for w in ways.WAYS if w.seeds), key=lambda w: CPU_LONG_ORDER.index(w.key)
                     if w.key in CPU_LONG_ORDER else len(CPU_LONG_ORDER))
    return [axes_run(w.key, seeds=None if w.seeds >= len(RESOLVED_SEEDS) else RESOLVED_SEEDS[:w.seeds])
            for w in trained]


def shared(pattern, **kw):
    """An axes run that is one of cpu-long's (tp 4, the axes model, 5000 steps): its files are cpu-long's."""
    return axes_run(pattern, home="cpu-long", **kw)


SWEEPS = {
    # the six SPEC budgets plus lower ones, then 24 syncs delayed or shrunk; one token budget, ~27 s per run
    "cpu": [*comm_runs("config/train_shakespeare_char_{}comm.py", (24, 18, 16, 12, 8, 6, 4, 3, 2, 1)),
            *delay_shrink_runs("config/train_shakespeare_char_{}comm.py")],
    # GPT-2 124M on OpenWebText, 20k steps (~9.8B tokens) per run, one process per GPU of the node (nproc
    # None: sweep.node_gpus(), e.g. 8; --nproc=N overrides): the six budgets, then cpu-long's delay and shrink
    # variants (all ladder, ladder upper half, bf16/fp8/int8, int8 on all spd, int8 two-shot); --tp_mode=real
    # trains them with real TP (into experiments/gpt2+tp_mode=real)
    "gpt2": [replace(run, nproc=None) for run in (
        *comm_runs("config/train_gpt2_{}comm.py", (24, 18, 16, 12, 8, 6)),
        *delay_shrink_runs("config/train_gpt2_{}comm.py"),
        Run("24comm-int8-2shot", "config/train_gpt2_24comm.py", one_change("all-tp-int8-2shot")))],
    # the CPU configs with real tensor parallelism: 2 processes, one shard each, all-reduces through gloo
    "cpu-real": comm_runs("config/train_shakespeare_char_{}comm.py", (24, 18, 16, 12, 8, 6, 4, 3, 2, 1),
                          overrides=("--tp_size=2", "--tp_mode=real"), nproc=2),
    # past the early phase: the axes model (cpu's 12 x 64 with 8 heads), 10x longer than "cpu", in every way
    # tpcomm/experiments/ways.py trains (Way.seeds: the resolved ones with RESOLVED_SEEDS or ten of them, the
    # rest 3)
    "cpu-long": cpu_long_runs(),
    # the tp degree: 2, 4 (cpu-long's runs) and 8; all-tp once at tp 4, and for seed 1337 at tp 2 and 8 to
    # show it is the same model at every degree
    "tp-axis": [shared("all-tp"),
                *(axes_run(p, tp=tp) if tp != 4 else shared(p) for tp in (2, 4, 8) for p in TP_AXIS_PATTERNS),
                axes_run("all-tp", tp=2, seeds=(1337,)), axes_run("all-tp", tp=8, seeds=(1337,))],
    # the model size at one tokens/parameter: 3 sizes spanning 24x in non-embedding parameters (12 x 64:
    # cpu-long's)
    "size-axis": [shared(p) if size == AXES_SIZE else axes_run(p, size=size, steps=steps)
                  for size, steps in SIZE_AXIS.items() for p in ("all-tp", "all-spd", "all-parallel")],
    # the axes model trained 4x longer; meant to reach a flat baseline (< 1% over the last fifth,
    # pairing.flatness), which 20,000 steps do not: docs/axes.md says why and what that costs
    "convergence": [axes_run(p, steps=CONVERGENCE_STEPS)
                    for p in ("all-tp", "all-spd", "all-parallel", "all-caat", "parallel3-spd")],
}
SWEEP_SEEDS = {**{name: AXES_SEEDS for name in ("tp-axis", "size-axis", "convergence")},
               "cpu-long": RESOLVED_SEEDS}  # else 1337
SWEEP_REMARKS = {  # printed with the sweep's table and written into its results.md
    "cpu": "These 500-step runs (384,000 tokens) are early training: here fewer syncs give a LOWER loss. "
                 "Trained 10x "
           "longer (docs/axes.md, `python experiment.py cpu-long`, 3.84M tokens) the advantage is gone and "
                 "all-"
           "parallel ends HIGHER than all-tp: read those runs before taking this table as a quality result.",
}


def runs_named(sweep, names):
    """The sweep's runs, or those named by --runs=A,B (a rerun check trains one again: docs/axes.md); None
    when a name is not one of its runs."""
    wanted = None if names is None else str(names).split(",") if names is not True else [""]
    if wanted is not None and set(wanted) - {r.name for r in SWEEPS[sweep]}:
        return None
    return [r for r in SWEEPS[sweep] if wanted is None or r.name in wanted]


# ---- gpu-scale (docs/gpu.md "gpu-scale"): cpu-long's model family at three sizes, on one GPU ----
# the axes model on the Linux C corpus, bf16 autocast and compile on CUDA
SCALE_CONFIG = "config/gpu_scale.py"
# (n_layer, n_embd, n_head): batch_size. n_embd = 16/3 n_layer (the 12 x 64 model's aspect), 8 heads (tp 4 and
# 8 divide them). Every size trains AXES_STEPS steps of block 64 at 6.49 tokens per non-embedding parameter
# (cpu-long's: 3,840,000 / 591,424), so the batch grows with N: batch = 6.49 N / (5000 x 64), rounded (6.47
# and 6.50 at the two new sizes; tests/experiments/test_gpu_scale.py recomputes it from the models). Learning
# rate 2e-3 x 64 / n_embd (Adam's hidden-layer rule of muP, from cpu-long's 2e-3 at width 64; not tuned),
# min_lr a tenth of it.
SCALE_SIZES = {(12, 64, 8): 12, (21, 112, 8): 64, (36, 192, 8): 324}
# caat: partial-channel sync, p = 0.5
SCALE_PATTERNS = ("all-tp", "all-spd", "all-parallel", "all-ladder", "all-caat")
SCALE_SEEDS = AXES_SEEDS
# the CPU rehearsal's (tests/experiments/test_gpu_scale.py): same code path
REHEARSAL_SIZES = {(2, 16, 4): 2, (3, 24, 4): 3}


def scale_run(pattern, size, batch, *, config=SCALE_CONFIG):
    """pattern None: GPT itself (model.py), the step-time reference (docs/gpu.md, "gpu-scale")."""
    n_layer, n_embd, n_head = size
    lr = 2e-3 * 64 / n_embd
    model = ("--model_type=gpt", "--tp_size=1", "--block_types=None") if pattern is None else \
        (f"--block_types={compact_list(PATTERNS[pattern](n_layer))}",)
    return Run(f"{pattern or 'gpt'}-{n_layer}x{n_embd}", config, (*model, f"--n_layer={n_layer}",
                                                                  f"--n_embd={n_embd}", f"--n_head={n_head}",
                                                                  f"--batch_size={batch}",
                                                                  f"--learning_rate={lr:.6g}",
                                                                  f"--min_lr={lr / 10:.6g}"),
               seeds=SCALE_SEEDS[:1] if pattern is None else None)


def scale_runs(sizes=None, *, config=SCALE_CONFIG):
    """Size by size, the all-tp baseline first; at the largest size GPT itself right after it
    (first seed only: its step time is what simulated tp 4 is timed against, and its loss equals
    all-tp's up to rounding)."""
    sizes = sizes or SCALE_SIZES
    largest = max(sizes, key=lambda s: s[0] * s[1] ** 2)
    return [run for size, batch in sizes.items() for p in SCALE_PATTERNS
            for run in [scale_run(p, size, batch, config=config)] +
            ([scale_run(None, size, batch, config=config)] if p == "all-tp" and size == largest else [])]


SWEEPS["gpu-scale"] = scale_runs()
SWEEP_SEEDS["gpu-scale"] = SCALE_SEEDS
