"""
Data parallelism over the process grid's dp dimension, applied in one place: DDP (gradients all-reduced, every
rank holds the whole model replica) or FSDP2 (`fully_shard` per block and at the root: parameters, gradients
and optimizer state sharded over dp, gathered per block for its forward and backward), or FSDP2 as HSDP
(dp_shard < dp: sharded within each group of dp_shard ranks, replicated across the dp / dp_shard groups;
gradients reduce-scattered within a group, then all-reduced across groups). Each composes with tensor
parallelism: each rank's tp shards are what DDP replicates or FSDP shards further over dp.
"""

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

DATA_PARALLEL = ("ddp", "fsdp")
INIT_DEVICES = ("default", "meta")  # 'meta': build without memory, each rank materialising only what it holds


def mixed_precision_policies(dtype, device_type):
    """FSDP2's MixedPrecisionPolicy for the blocks and for the root (embeddings, ln_f, the tied lm_head),
    given the training dtype ('float32', 'bfloat16', 'float16'; None: full precision) and the device type.

    On CUDA under bf16/fp16 (torchtitan's defaults: param bf16, reduce fp32): the blocks' parameters are
    gathered in the autocast dtype (half the all-gather bytes; autocast rounds each matmul's weight to it
    anyway) and their gradients reduce-scattered in fp32, so averaging over many ranks loses nothing to
    bf16's 8-bit mantissa (docs/fsdp.md). cast_forward_inputs=False: the fp32 residual stream enters each
    block as it is (FSDP's default would round it to bf16 at every block boundary), and autocast decides
    each op's dtype as under DDP (CUDA autocast runs layer_norm in fp32, so bf16 layer-norm weights meet
    the fp32 stream there). The root keeps fp32 parameters: a bf16 wte/wpe would make the embedding's
    output, and with it the whole stream, bf16. Elsewhere (CPU, MPS) and in fp32: full precision (exactly
    DDP's math). CPU autocast does not run layer_norm in fp32 (fp32 stream x bf16 weight fails there),
    and gloo's all-gather is a memory copy: nothing to save."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    full = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)
    if dtype in (None, "float32") or device_type != "cuda":
        return full, full
    low = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return (MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32, cast_forward_inputs=False),
            MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32))


def apply_data_parallel(model, pd, *, kind, device_type, dtype=None):
    """The module to run forward/backward through: model itself (dp 1, or FSDP, which shards in place) or its
    DDP wrapper. The model keeps its interface (GPT-layout state, clipping, ...) either way. FSDP gathers and
    reduces in the precisions of mixed_precision_policies (the training dtype's, on CUDA)."""
    if pd.dp == 1:
        return model
    if kind == "ddp":
        return DDP(model, process_group=pd.dp_group, device_ids=[pd.local_rank] if device_type == "cuda"
                   else None)
    from torch.distributed.fsdp import fully_shard

    blocks, root = mixed_precision_policies(dtype, device_type)
    # a 2-D mesh (dp_replicate, dp_shard) makes it HSDP (ParallelDims.fsdp_mesh)
    for block in model.transformer.h:
        fully_shard(block, mesh=pd.fsdp_mesh, mp_policy=blocks)
    fully_shard(model, mesh=pd.fsdp_mesh, mp_policy=root)
    return model


def set_gradient_sync(run, *, enabled):
    """Gradient accumulation: reduce the gradients over dp on the last micro-batch of a step only (DDP's
    require_backward_grad_sync, FSDP2's set_requires_gradient_sync: no reduce-scatter per micro-batch)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(run, DDP):
        run.require_backward_grad_sync = enabled
    elif isinstance(run, FSDPModule):
        run.set_requires_gradient_sync(enabled)


def parallelize(model, pd, *, kind, device, device_type, meta=False, compile=False, dtype=None):
    """The model ready to train, in the one order each kind needs: (the module to run, the module gradient
    sync is set on). `model` is on `device`, or (meta=True) on the meta device, in which case it is
    materialised here with GPT's initial weights, bitwise (model.materialize_). dtype: the training precision
    (FSDP's gathers follow it; None: full precision).
      ddp:  materialise, wrap in DDP (DDP broadcasts rank 0's weights, so they must exist first), then compile
            the wrapped model: dynamo sees DDP and splits the graph at its buckets (DDPOptimizer), so each
            bucket's all-reduce overlaps the rest of the backward (nanoGPT compiles first: the whole backward
            is then one compiled node that hands out every gradient at its end, and every bucket waits for it)
      fsdp: shard (fully_shard, in place), materialise (each rank allocates its shards only), compile
    At dp 1 both are the plain model."""
    if kind == "fsdp":
        # in place: the FSDPModule
        apply_data_parallel(model, pd, kind="fsdp", device_type=device_type, dtype=dtype)
        if meta:
            model.materialize_(device)
        return (torch.compile(model) if compile else model), model
    if meta:
        model.materialize_(device)
    wrapped = apply_data_parallel(model, pd, kind=kind, device_type=device_type)
    return (torch.compile(wrapped) if compile else wrapped), wrapped
