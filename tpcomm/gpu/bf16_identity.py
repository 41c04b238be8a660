"""
The zeroed-c_proj identity in training passes under bf16 autocast: with every block's c_proj zeroed (weights
and biases) each block must leave the residual stream as it came, so a DistributedGPT's loss is GPT's exactly,
for every block type, tp and option that leaves the math unchanged (tp_async_grad, tp_overlap,
sequence_parallel, alone and in the combinations the validator allows). Train mode with gradients on: the
fused path of tp_async_grad runs only there (a pass without gradients has no backward to overlap). Read by
tests/gpu/test_bf16_train_identity.py and by `make gpu-check`'s bf16_identity section
(tpcomm/gpu/gpu_check.py).
"""

import itertools

import torch

from tpcomm.errors import ConfigError
from tpcomm.model.options import validate_sync_options

# 'ladder' delays its syncs: its stream is not GPT's stream in the first place
KINDS = ("tp", "spd", "parallel")
TPS = (2, 4, 8)
# each option that leaves the math unchanged; option_sets combines them as the validator allows
CHECKED_OPTIONS = (dict(tp_async_grad=True), dict(tp_overlap=2), dict(sequence_parallel=True))


def option_sets(block_types, tp):
    """Every combination of CHECKED_OPTIONS (none included) that validate_sync_options accepts
    for these blocks at this tp."""
    sets = []
    for n in range(len(CHECKED_OPTIONS) + 1):
        for combo in itertools.combinations(CHECKED_OPTIONS, n):
            options = {k: v for option in combo for k, v in option.items()}
            try:
                validate_sync_options(**dict(dict(tp_overlap=1, sequence_parallel=False), **options),
                                      block_types=block_types, tp_size=tp)
            except ConfigError:
                continue
            sets.append(options)
    return sets


def option_name(options):
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "no option"


def zero_c_proj(model):
    """Every c_proj weight and bias zeroed: each block must then leave the stream as it came."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".c_proj." in name:
                p.zero_()
    return model


def train_loss(model, idx, targets, ctx):
    """One training pass's loss (train mode, gradients on, its backward run) under
    ctx (an autocast context)."""
    model.train()
    model.zero_grad(set_to_none=True)
    with ctx:
        _, loss = model(idx, targets)
    loss.backward()
    return loss.detach().float()


def train_grid(make, want, idx, targets, ctx, *, n_layer, tps=TPS, kinds=KINDS):
    """{'kind tpN (options)': |loss - want|} over kinds x tps x option_sets; make(tp, block_types, options) ->
    a DistributedGPT whose c_proj are zeroed, want: GPT's train_loss on the same batch."""
    out = {}
    for tp in tps:
        for kind in kinds:
            block_types = [kind] * n_layer
            for options in option_sets(block_types, tp):
                loss = train_loss(make(tp, block_types, options), idx, targets, ctx)
                out[f"{kind} tp{tp} ({option_name(options)})"] = (loss - want).abs().item()
    return out
