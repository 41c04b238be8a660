"""
A pipeline layout checked before any process group starts and without importing torch.distributed.pipelining
(which imports torch._dynamo, seconds at a start, so every config check paid it): the schedules' names,
validate_pp_layout (train.py, bench.py and the pipeline demo refuse a layout that cannot run in one line) and
stage_layers (the layers of each stage). The stages and the runner: tpcomm/parallel/pipeline.py.
"""

import torch

from tpcomm.errors import ConfigError

# the schedules pp_schedule names (tpcomm/parallel/pipeline.py maps each to torch's class)
SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved_1f1b")


def stage_takes_output_grads():
    """The stages hand torch their gradient examples (output_grads), which PipelineStage takes from
    torch 2.13 on: an older torch (2.11 on the H100 that ran make gpu-check) is refused at
    validation, not at the first stage built."""
    import inspect

    from torch.distributed.pipelining import PipelineStage

    return "output_grads" in inspect.signature(PipelineStage.__init__).parameters


def validate_pp_layout(*, world, pp_size, tp, n_layer, schedule, n_microbatches, virtual_stages=1,
                       pp_layers=None, batch_size=None, keys=None):
    """Raise ConfigError (one line naming keys and values) for a layout that cannot run. world:
    processes; tp: the tensor-parallel *process* dimension (tp_size in real mode, 1 simulated);
    batch_size: rows per step and replica; keys: what the caller calls schedule, n_microbatches,
    virtual_stages and pp_layers (train.py: pp_schedule...)."""
    k = dict(dict(schedule="schedule", n_microbatches="n_microbatches", virtual_stages="virtual_stages",
                  pp_layers="pp_layers"), **(keys or {}))
    for key, value in (("pp_size", pp_size), (k["virtual_stages"], virtual_stages),
                       (k["n_microbatches"], n_microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be a positive int, got {value!r}")
    if pp_size > 1 and not stage_takes_output_grads():
        raise ConfigError(f"pp_size={pp_size} needs torch >= 2.13 (its PipelineStage takes output_grads); "
                          "this is " f"torch {torch.__version__}")
    if schedule not in SCHEDULE_NAMES:
        raise ConfigError(f"{k['schedule']}: unknown schedule {schedule!r}; use one of "
                          f"{list(SCHEDULE_NAMES)}")
    if world % (pp_size * tp):
        raise ConfigError(f"world size ({world}) must be pp_size ({pp_size}) x dp x tp ({tp}), "
                          f"but is not divisible by pp_size x tp ({pp_size * tp})")
    if virtual_stages > 1 and schedule != "interleaved_1f1b":
        raise ConfigError(f"{k['virtual_stages']} ({virtual_stages}) > 1 needs "
                          f"{k['schedule']}='interleaved_1f1b', got {schedule!r}")
    if schedule == "interleaved_1f1b" and pp_size < 2:
        raise ConfigError(f"{k['schedule']}='interleaved_1f1b' needs pp_size >= 2, got {pp_size}")
    stages = pp_size * virtual_stages
    if stages > n_layer:
        raise ConfigError(f"pp_size ({pp_size}) x {k['virtual_stages']} ({virtual_stages}) = {stages} "
                          "stages, " f"more than n_layer ({n_layer})")
    if schedule != "gpipe" and n_microbatches < pp_size:
        raise ConfigError(f"{k['schedule']}={schedule!r} needs {k['n_microbatches']} ({n_microbatches}) >= "
                          f"pp_size ({pp_size})")
    rounds = max(1, n_microbatches // pp_size)  # torch's interleaved schedule runs m in rounds of m // rounds
    if schedule == "interleaved_1f1b" and n_microbatches % rounds:
        raise ConfigError(f"{k['schedule']}='interleaved_1f1b' needs {k['n_microbatches']} "
                          f"({n_microbatches}) divisible by {k['n_microbatches']} // pp_size ({rounds}), "
                          "e.g. a multiple of pp_size " f"({pp_size})")
    if batch_size is not None and batch_size % n_microbatches:
        raise ConfigError(f"batch_size ({batch_size}) must be divisible by {k['n_microbatches']} "
                          f"({n_microbatches})")
    if pp_layers is not None:
        if (not isinstance(pp_layers, (list, tuple)) or len(pp_layers) != stages
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in pp_layers)):
            raise ConfigError(f"{k['pp_layers']} must be a list of {stages} ints (layers per stage), got "
                              f"{pp_layers!r}")
        if sum(pp_layers) != n_layer:
            raise ConfigError(f"{k['pp_layers']} {list(pp_layers)} sums to {sum(pp_layers)}, not n_layer "
                              f"({n_layer})")
        if min(pp_layers) < 1:
            raise ConfigError(f"{k['pp_layers']} {list(pp_layers)} has an empty stage; every stage needs >= "
                              "1 layer")


def stage_layers(n_layer, n_stages, pp_layers=None):
    """[(first, end)) layer ranges of the stages: pp_layers, or balanced by count
    (earlier stages take the rest)."""
    sizes = list(pp_layers) if pp_layers is not None else [
        n_layer // n_stages + (s < n_layer % n_stages) for s in range(n_stages)]
    ends = [sum(sizes[:s + 1]) for s in range(n_stages)]
    return [(end - size, end) for size, end in zip(sizes, ends)]
