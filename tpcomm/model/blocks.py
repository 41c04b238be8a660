"""
What every block type's forward runs on (tpcomm/model/block_types/ has the types, one module each): the
sharded attention and MLP, their layer norms, the dropout masks, f and g and the other collectives, and the
stream's pieces. DistributedGPT builds each layer as block_class(kind): the type's class mixed with
ShardedBlock, so a type's module holds its equations and needs no torch.

In the blocks the stream is flat over tokens: synced (N, C), per shard (L, N, C), N = B*T, L the shards this
process holds (tp simulated, 1 real). All communication goes through f and g (counted).
"""

import functools

import torch
import torch.nn as nn

from model import LayerNorm
from tpcomm.model.block_types.registry import block_type
from tpcomm.model.strategies import Strategies
from tpcomm.tp.collective_matmul import collective_matmul_block
from tpcomm.tp.collectives import (copy_to_tp_region, fan_out_stream, reduce_from_tp_region,
                                   reduce_from_tp_region_async)
from tpcomm.tp.dropout import ATTN_OUT, ATTN_PROBS, MLP_OUT, mask_or_none
from tpcomm.tp.sequence_parallel import gather_to_tp_region, reduce_scatter_from_tp_region
from tpcomm.tp.sharded_layers import (Pending, ShardedAttention, ShardedMLP, SPStream, add_pending, full,
                                      join, layer_norm, stream_parts, synced_layer_norm)

# a module's output dropout site (tpcomm/tp/dropout.py) by the module's name, as the types name them
OUT_SITES = {"attn": ATTN_OUT, "mlp": MLP_OUT}


class BlockOps:
    """The operations a type's forward uses beyond its modules, so that its module needs no torch: collectives
    on the block's group at its sites, and the stream's pieces (ShardedBlock holds the rest)."""

    layer_norm = staticmethod(layer_norm)
    join = staticmethod(join)  # the K chunks' (n, C) outputs as the batch's (N, C)
    full = staticmethod(full)
    stream_parts = staticmethod(stream_parts)
    sp_stream = staticmethod(SPStream)  # sequence parallel, desynced: (token shard, the gathered stream)

    @staticmethod
    def cat(tensors, dim=0):
        return torch.cat(tensors, dim=dim)

    @staticmethod
    def is_pending(p):
        """Whether p is a ladder output whose all-reduce may still run (not a pipeline cut's stand-in)."""
        return isinstance(p, Pending)

    def all_reduce(self, partials, site):
        """g: the sum over shards of partials (L, N, k), waited for."""
        return reduce_from_tp_region(partials, self.group, site=self.sites[site])

    def reduce_scatter(self, partials, site):
        """Sequence parallelism's g: the sum over shards of partials, this rank's token shard of it."""
        return reduce_scatter_from_tp_region(partials, self.group, site=self.sites[site])

    def fan_out_stream(self, x, site):
        """f of the synced x: each shard's copy (L, N, k), its backward all-reduced."""
        return fan_out_stream(x, self.group, self.sites[site])

    def collective_matmul_block(self, x, T, kv):
        """The block under sequence parallelism with its collectives as rings beside partial GEMMs
        (tpcomm/tp/collective_matmul.py; a type whose fact collective_matmul allows it)."""
        return collective_matmul_block(self, x, T, kv)

    def issue(self, partials, linear, mask, site):
        """Pending: the all-reduce of partials (L, N, C), issued, and the bias to add after it. The bias is a
        copy: it is used after this forward returns, when FSDP has freed the block's gathered parameters."""
        reduction = reduce_from_tp_region_async(partials, self.group, site=self.sites[site])
        b = self.synced_bias(linear, mask)
        return Pending(reduction, reduction.value, None if b is None else b.clone())

    def defers_waits_with(self, block):
        """Whether this block and the next may defer their backward waits to nodes made in each other's
        forward: in real eager training, and neither sharded by FSDP2 (which gathers block's LayerNorm,
        whose gradient the deferred wait gives, only in block's forward, and reduces block's gradients
        when block's inputs have theirs)."""
        if not (self.group.real and not torch.compiler.is_compiling()):
            return False
        from torch.distributed.fsdp import FSDPModule
        return not isinstance(self, FSDPModule) and not isinstance(block, FSDPModule)


class ShardedBlock(Strategies, BlockOps, nn.Module):
    """What every block type's forward runs on: the sharded attention and MLP, their layer norms, the dropout
    masks, f, g and the other collectives. A built block is block_class(kind): the type's class (its facts and
    forward) before this one.

    The stream contract: forward(xbar, r, T, kv) -> (xbar, r). xbar (N, C) is the last synced value of the
    residual stream; r (L, N, C) holds each shard's stream r_i = xbar + d_i while it is desynced, else None.
    d_i = r_i - xbar is formed only where a sync needs it. T: tokens per sequence (attention is causal within
    each); kv: this layer's KV cache (model.LayerKV) when generating, else None. The model passes blocks a
    third part, `pending`: the outputs of a ladder block's modules not yet added to the synced stream (see
    step, block_types/ladder.py).

    Dropout (docs/model.md): an output added to the synced stream after its all-reduce is dropped with the
    replica's mask (the same on every shard); one added to a shard's own stream with that shard's mask. Each
    dropped output includes its bias share, as GPT drops c_proj(y) with its bias. Masks are drawn in GPT's
    order (attention probabilities, attention output, MLP output), so at tp_size 1 a block whose gpt_at_tp1 is
    GPT's block. A mask's site is the module's name, 'attn' or 'mlp'."""

    def __init__(self, config, group, key, layer):
        super().__init__()
        self.group, self.key, self.layer, self.p = group, key, layer, config.dropout
        # K: chunks of the batch, each chunk's all-reduce overlapping the next chunk
        self.overlap = config.tp_overlap
        self.async_grad = config.tp_async_grad  # f's backward all-reduce asynchronous (docs/overlap.md)
        self.rings = config.tp_collective_matmul  # SP's collectives as rings beside partial GEMMs
        self.options = config.type_options[self.kind]  # its type's Options
        # where this block's collectives run, for their trace labels (counting.traced): (layer, block type,
        # site)
        self.sites = {site: (layer, self.kind, site) for site in ("attn", "mlp")}
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = ShardedAttention(config, group.local)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = ShardedMLP(config, group.local)
        # the tp shards' dropout streams (tpcomm.tp.dropout): at tp_size 1 the one shard's stream is the
        # replica's (0)
        tp, first = group.tp, group.first_shard
        self.streams = tuple(0 if tp == 1 else 1 + first + i for i in range(group.local))

    def probs_dropout(self, seq0=0):
        """The attention probabilities' dropout, each shard's heads with that shard's mask; None
        without dropout. seq0: the first sequence of a batch chunk (tp_overlap), whose masks are the
        whole batch's from there."""
        if not (self.training and self.p > 0.0):
            return None
        return lambda att: att * mask_or_none(att, self.p, self.key, training=True, layer=self.layer,
                                              site=ATTN_PROBS, streams=self.streams, offset=seq0
                                              * att[0].numel()).to(att.dtype)

    def shard_mask(self, like, site, n0=0):
        """Keep-mask (L, N, C) for an output added to the shards' own streams, or None without dropout; n0:
        the first token (a batch chunk's), the masks being the whole batch's rows from there."""
        return mask_or_none(like, self.p, self.key, training=self.training, layer=self.layer,
                            site=OUT_SITES[site], streams=self.streams, offset=n0 * like.shape[-1])

    def replica_mask(self, like, site, n0=0):
        """Keep-mask (N, C) for an output added to the synced stream after its all-reduce, or None; n0 as
        above (a batch chunk's or a token shard's first token)."""
        return mask_or_none(like, self.p, self.key, training=self.training, layer=self.layer,
                            site=OUT_SITES[site], offset=n0 * like.shape[-1])

    def synced_bias(self, linear, mask):
        """A c_proj bias to add once to the synced stream (after g), dropped with the
        replica mask; None without."""
        b = linear.bias
        if b is None:
            return None
        b = self.group.synced(b)
        return b if mask is None else b * mask.to(b.dtype)

    def add_synced_bias(self, x, linear, mask):
        b = self.synced_bias(linear, mask)
        return x if b is None else x + b

    @staticmethod
    def bias_share(linear, share):
        """share * a c_proj bias, for every shard's own stream (None without biases)."""
        return None if linear.bias is None else linear.bias * share

    def shard_heads(self, xbar, r, T, kv, n0=0, *, sequence_parallel=False, src=None):
        """(r (L, N, C), the shards' attention heads of LN1(r)): shard_streams then attention. Under
        tp_async_grad f, each shard's LN1 and c_attn of a synced xbar run fused: src, xbar's ColumnInput (made
        here unless the strategy made it before, strategies.run_chunks)."""
        drop = self.probs_dropout(n0 // T)
        if src is None and r is None and not sequence_parallel and self.fused_f():
            src = self.column_input((xbar,), self.ln_1, synced=False)
        if src is not None and r is None:
            r, qkv = src.project(*self.attn.qkv_weight(), norm="fan_out", site=self.sites["attn"])
            return r, self.attn.attend(qkv, T, drop, kv)
        r, h = self.shard_streams(xbar, r, sequence_parallel=sequence_parallel)
        return r, self.attn.heads(h, T, drop, kv)

    def shard_streams(self, xbar, r, *, sequence_parallel=False):
        """The shards' streams and LN1 of them: a synced stream fans out first (through f; sequence parallel:
        an all-gather of its token shards)."""
        # the stream's own dtype from here: a desynced r_i accumulates in fp32, as xbar does
        if r is None and sequence_parallel:
            r = gather_to_tp_region(xbar, self.group, site=self.sites["attn"]).to(xbar.dtype)
        elif r is None:
            return self.group.fan_out(xbar, lambda x: layer_norm(self.ln_1, x), self.sites["attn"])
        return r, layer_norm(self.ln_1, r)

    def fan_in(self, ln, x, site, *, sequence_parallel=False):
        """A module's input from the synced stream x, on every shard: f of the replica's LayerNorm of x, or,
        sequence parallel (x a token shard), the all-gather of the LayerNorm of the shard."""
        if sequence_parallel:
            return gather_to_tp_region(layer_norm(ln, x), self.group, site=self.sites[site])
        return copy_to_tp_region(synced_layer_norm(ln, x, self.group), self.group, site=self.sites[site])

    def attn_partials(self, xbar, r, T, kv, n0=0, *, sequence_parallel=False, src=None):
        """(R1 * A_i(LN1(.)) (L, N, C) for an all-reduce, R1): each shard's attention output
        dropped with the replica mask, read from the synced stream xbar (through f) or,
        desynced, from the shard's own r_i, whose
        d_i = r_i - xbar then join the same sum. n0: a batch chunk's first token (its dropout masks' rows).
        sequence_parallel: (fan_in; a desynced xbar is an SPStream, d_i = r_i - its base), the sum a
        reduce-scatter; from a synced stream R1 is None here, applied after it (sp_close).
        src: xbar's ColumnInput (tp_async_grad): f fused with LN1 and c_attn."""
        drop = self.probs_dropout(n0 // T)
        if r is None and src is not None:
            y = self.attn.attend(src.project(*self.attn.qkv_weight(), norm="before", site=self.sites["attn"]),
                                 T, drop, kv)
        elif r is None:
            y = self.attn.heads(self.fan_in(self.ln_1, xbar, "attn", sequence_parallel=sequence_parallel), T,
                                drop, kv)
        else:
            y = self.attn.heads(layer_norm(self.ln_1, r), T, drop, kv)
        if r is None:
            R1 = None if sequence_parallel else self.replica_mask(xbar, "attn", n0)
            return self.attn.out(y, mask=R1), R1
        R1 = self.replica_mask(r[0] if sequence_parallel else xbar, "attn", n0)
        d = xbar.delta(r) if sequence_parallel else self.group.delta(r, xbar)
        return self.attn.out(y, acc=d, own_acc=not sequence_parallel, mask=R1), R1

    def mlp_partials(self, x, r=None, n0=0, *, sequence_parallel=False):
        """(R2 * M_i(LN2(.)) (L, N, C) for an all-reduce, R2), read from the synced stream x (through f)
        or, given r (L, N, C), from each shard's own stream r_i. sequence_parallel: x a token shard
        (fan_in), R2 None here (sp_close)."""
        h = (self.fan_in(self.ln_2, x, "mlp", sequence_parallel=sequence_parallel) if r is None
             else layer_norm(self.ln_2, r))
        u = self.mlp.hidden(h)
        R2 = None if sequence_parallel else self.replica_mask(x, "mlp", n0)
        return self.mlp.out(u, mask=R2), R2

    def fused_mlp_partials(self, src, n0=0):
        """mlp_partials of the synced stream x = the sum of src's parts, f fused with LN2 and c_fc
        (tp_async_grad): (x (N, C), R2 * M_i(LN2(x)) (L, N, C), R2)."""
        # x is formed inside (its gradient then joins LN2's there), else it is parts[0]; a deferred src's
        # parts feed only the projection and ColumnInput.stream (their placeholder gradients must reach no
        # other use), so x comes out of the projection
        resid = len(src.parts) > 1 or src.link is not None
        out = src.project(*self.mlp.fc_weight(), norm="before", resid=resid, site=self.sites["mlp"])
        x, pre = out if resid else (src.parts[0], out)
        R2 = self.replica_mask(x, "mlp", n0)
        return x, self.mlp.out(self.mlp.gelu(pre), mask=R2), R2

    def step(self, xbar, r, pending, T, kv=None, *, sequence_parallel=False, next_block=None):
        """The model's stream through this block, (xbar, r, pending) -> (xbar, r, pending): outputs still
        pending (from a ladder block before it) are added first, then the block runs; it leaves nothing
        pending. sequence_parallel: xbar is this rank's token shard of the synced stream
        (docs/overlap.md). next_block: the block after this one in the same module (None at the end or at
        a pipeline cut; see block_types/ladder.py)."""
        return (*self(add_pending(xbar, pending), r, T, kv, sequence_parallel=sequence_parallel), ())


def block_class(kind):
    """The nn.Module class of a registered type (a name the validator accepted): its class, whose forward
    holds its equations, mixed with ShardedBlock, which that forward runs on."""
    return composed(block_type(kind))


@functools.cache
def composed(cls):
    own = {k for c in ShardedBlock.__mro__ if c not in nn.Module.__mro__ for k in vars(c)}
    shadowed = sorted({k for c in cls.__mro__ for k in vars(c) if not k.startswith("_")} & own
                      - {"step", "forward"})
    if shadowed:  # a fact or method of the type would hide what its forward runs on
        raise TypeError(f"block type {cls.kind!r}: {shadowed} would hide ShardedBlock's own; name them "
                        "otherwise")
    return type(cls.__name__ + "Block", (cls, ShardedBlock), {"__module__": cls.__module__,
                                                               "__qualname__": cls.__qualname__ + "Block"})
