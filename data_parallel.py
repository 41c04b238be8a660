"""
Data parallelism over the process grid's dp dimension, applied in one place: DDP (gradients all-reduced, every
rank holds the whole model replica) or FSDP2 (`fully_shard` per block and at the root: parameters, gradients and
optimizer state sharded over dp, gathered per block for its forward and backward). Either composes with tensor
parallelism: each rank's tp shards are what DDP replicates or FSDP shards further over dp.
"""

from torch.nn.parallel import DistributedDataParallel as DDP

DATA_PARALLEL = ("ddp", "fsdp")


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
