"""
Data parallelism over the process grid's dp dimension, applied in one place: DDP (gradients all-reduced, every
rank holds the whole model replica) or FSDP2 (`fully_shard` per block and at the root: parameters, gradients and
optimizer state sharded over dp, gathered per block for its forward and backward). Either composes with tensor
parallelism: each rank's tp shards are what DDP replicates or FSDP shards further over dp.
"""

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

DATA_PARALLEL = ("ddp", "fsdp")
INIT_DEVICES = ("default", "meta")  # 'meta': build without memory, each rank materialising only what it holds


def apply_data_parallel(model, pd, *, kind, device_type):
    """The module to run forward/backward through: model itself (dp 1, or FSDP, which shards in place) or its
    DDP wrapper. The model keeps its interface (GPT-layout state, clipping, ...) either way.

    FSDP's MixedPrecisionPolicy is left at its default, full precision: parameters are gathered and gradients
    reduced in the parameters' own dtype (fp32). Under bf16, autocast does the matmuls, so the residual stream
    stays fp32 as in GPT and gradients are averaged in fp32, exactly as DDP does."""
    if pd.dp == 1:
        return model
    if kind == "ddp":
        return DDP(model, process_group=pd.dp_group, device_ids=[pd.local_rank] if device_type == "cuda" else None)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)
    for block in model.transformer.h:
        fully_shard(block, mesh=pd.mesh["dp"], mp_policy=mp)
    fully_shard(model, mesh=pd.mesh["dp"], mp_policy=mp)
    return model


def set_gradient_sync(run, *, enabled):
    """Gradient accumulation: reduce the gradients over dp on the last micro-batch of a step only (DDP's
    require_backward_grad_sync, FSDP2's set_requires_gradient_sync: no reduce-scatter per micro-batch)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(run, DDP):
        run.require_backward_grad_sync = enabled
    elif isinstance(run, FSDPModule):
        run.set_requires_gradient_sync(enabled)


def parallelize(model, pd, *, kind, device, device_type, meta=False, compile=False):
    """The model ready to train, in the one order each kind needs: (the module to run, the module gradient sync is
    set on). `model` is on `device`, or (meta=True) on the meta device, in which case it is materialised here with
    GPT's initial weights, bitwise (model.materialize_).
      ddp:  materialise, compile, wrap in DDP (DDP broadcasts rank 0's weights, so they must exist first; nanoGPT
            compiles before wrapping)
      fsdp: shard (fully_shard, in place), materialise (each rank allocates its shards only), compile
    At dp 1 both are the plain model."""
    if kind == "fsdp":
        apply_data_parallel(model, pd, kind="fsdp", device_type=device_type)  # in place: model is the FSDPModule
        if meta:
            model.materialize_(device)
        return (torch.compile(model) if compile else model), model
    if meta:
        model.materialize_(device)
    run = apply_data_parallel(torch.compile(model) if compile else model, pd, kind=kind, device_type=device_type)
    return run, run
