"""
Sequence parallelism (Megatron-LM, arXiv 2205.05198): f and g along the tokens (docs/overlap.md).

    gather_to_tp_region           f: all-gather of the token shards (backward: reduce-scatter)
    reduce_scatter_from_tp_region g: reduce-scatter to the token shards (backward: all-gather)
    scatter_to_sequence_region / gather_from_sequence_region: onto the token shards (backward all-gather) /
                               off them (all-gather; backward nothing moves).

Between blocks the synced stream is sharded along the N = B*T tokens: rank j holds tokens [j*N/tp, (j+1)*N/tp)
(simulated: held whole, every shard side by side). Counted apart from the all-reduces (CommCounter.add_sp).
"""

import torch

from tpcomm.tp.collectives import in_autocast_dtype
from tpcomm.tp.counting import (AG, RS, SP_LABEL, backward_count, count_sp, count_when_compiling, nbytes,
                                traced, whole_bytes)


class _GatherToTPRegion(torch.autograd.Function):
    """f under sequence parallelism: all-gather of the token shards to every tp shard (L, N, C) forward,
    reduce-scatter of the shards' gradients backward."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.group, ctx.site = group, site
        with traced(group, "f", "fwd", site, count_sp(group, "fwd", AG, whole_bytes(group, x)),
                    collective=SP_LABEL[AG]):
            full = group.gather_tokens(x)
        return full.unsqueeze(0).expand(group.local, *full.shape)

    @staticmethod
    def backward(ctx, grad):
        with traced(ctx.group, "f", "bwd", ctx.site, backward_count(ctx.group, RS, nbytes(grad[0])),
                    collective=SP_LABEL[RS]):
            return ctx.group.reduce_scatter_tokens(grad), None, None


class _ReduceScatterFromTPRegion(torch.autograd.Function):
    """g under sequence parallelism: reduce-scatter of the shards' partial sums (L, N, C) to the token shards
    forward, all-gather of the gradient backward (fanned out to the shards)."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.group, ctx.site = group, site
        with traced(group, "g", "fwd", site, count_sp(group, "fwd", RS, nbytes(x[0])),
                    collective=SP_LABEL[RS]):
            return group.reduce_scatter_tokens(x)

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        with traced(group, "g", "bwd", ctx.site, backward_count(group, AG, whole_bytes(group, grad)),
                    collective=SP_LABEL[AG]):
            full = group.gather_tokens(grad)
        return full.unsqueeze(0).expand(group.local, *full.shape), None, None


class _ScatterToSequence(torch.autograd.Function):
    """The embedding output onto the token-sharded stream: this rank's rows forward
    (nothing moves), all-gather of the gradient backward (so the replicated embedding gets
    every token's gradient on every rank)."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.group, ctx.site = group, site
        n = x.shape[0] // (group.tp if group.real else 1)
        start = group.token_offset(n)
        return x[start:start + n]

    @staticmethod
    def backward(ctx, grad):
        group = ctx.group
        with traced(group, "scatter", "bwd", ctx.site, backward_count(group, AG, whole_bytes(group, grad)),
                    collective=SP_LABEL[AG]):
            return group.gather_tokens(grad), None, None


class _GatherFromSequence(torch.autograd.Function):
    """The token-sharded stream gathered whole (before ln_f): all-gather forward; backward this
    rank's rows of the gradient, which is the same on every rank (what follows is replicated, or
    begins with f): nothing moves."""

    @staticmethod
    def forward(ctx, x, group, site):
        ctx.n, ctx.start = x.shape[0], group.token_offset(x.shape[0])
        with traced(group, "gather", "fwd", site, count_sp(group, "fwd", AG, whole_bytes(group, x)),
                    collective=SP_LABEL[AG]):
            return group.gather_tokens(x)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.start:ctx.start + ctx.n], None, None


def gather_to_tp_region(x, group, *, site=None):
    """f under sequence parallelism: the token shards (N/tp, C) (simulated: held whole, (N, C)) -> (L, N, C)
    on the tp shards (all-gather); backward reduce-scatters the shards' gradients back to the token shards."""
    x = in_autocast_dtype(x)
    count_when_compiling(group, x, RS, whole_bytes(group, x))
    return _GatherToTPRegion.apply(x, group, site)


def reduce_scatter_from_tp_region(x, group, *, site=None):
    """g under sequence parallelism: (L, N, C) partial results -> this rank's token shard of their sum (N/tp,
    C) (simulated: every shard, (N, C)) (reduce-scatter); backward all-gathers the gradient."""
    x = in_autocast_dtype(x)
    count_when_compiling(group, x, AG, nbytes(x[0]))
    return _ReduceScatterFromTPRegion.apply(x, group, site)


def scatter_to_sequence_region(x, group, *, site=None):
    """(N, C) replicated -> this rank's token shard (N/tp, C) (simulated: the whole (N,
    C)); backward all-gather."""
    count_when_compiling(group, x, AG, nbytes(x))
    return _ScatterToSequence.apply(x, group, site)


def gather_from_sequence_region(x, group, *, site=None):
    """The token shards -> the whole (N, C) on every rank (all-gather); backward takes this rank's rows."""
    return _GatherFromSequence.apply(x, group, site)
