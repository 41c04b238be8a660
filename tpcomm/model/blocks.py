"""
DistributedGPT's block types (tensor_parallel_model.py builds one per layer): Megatron tensor-parallel ('tp', 2
forward all-reduces), Sync-Point Drop ('spd', arXiv 2502.20727, 1), fully 'parallel' (0), Ladder Residual ('ladder',
arXiv 2501.06589, 2, delayed) and partial-channel sync ('caat', arXiv 2506.19645, 2 of a fraction of the channels).
docs/model.md has the equations, the sharding and the dropout rules; this file is them in code.

Each type is one class, whose class attributes include its facts (tpcomm/model/block_types.py lists them:
syncs, whether it leaves the stream desynced or its outputs pending, which execution strategies it runs under,
whether it is GPT's block at tp 1; a built-in type inherits them from its facts class there, which the torch-free
cost model reads), and one `register` call. Every other place (the validator in tpcomm/model/options.py, the cost
model, the pipeline's cuts, the GPU report) reads the facts from block_types.BLOCK_TYPES, never a type's name.

In the blocks the stream is flat over tokens: synced (N, C), per shard (L, N, C), N = B*T, L the shards this process
holds (tp simulated, 1 real). All communication goes through f and g (counted).
"""

import torch
import torch.nn as nn

from tpcomm.errors import ConfigError
from model import LayerNorm
from tpcomm.model.block_types import BLOCK_TYPES, BlockType, CAATType, LadderType, ParallelType, SPDType, TPType, add
from tpcomm.tp.async_grad import ColumnInput
from tpcomm.tp.collective_matmul import collective_matmul_block
from tpcomm.tp.collectives import copy_to_tp_region, reduce_from_tp_region, reduce_from_tp_region_async
from tpcomm.tp.dropout import ATTN_OUT, ATTN_PROBS, MLP_OUT, mask_or_none
from tpcomm.tp.partial_sync import PartialSync
from tpcomm.tp.sequence_parallel import gather_to_tp_region, reduce_scatter_from_tp_region
from tpcomm.tp.sharded_layers import (Pending, Reduced, ShardedAttention, ShardedMLP, SPStream, add_pending, full,
                                      join, layer_norm, stream_parts, synced_layer_norm)


class ShardedBlock(BlockType, nn.Module):
    """What every block type shares: the sharded attention and MLP, their layer norms, and the dropout masks.

    The stream contract: forward(xbar, r, T, kv) -> (xbar, r). xbar (N, C) is the last synced value of the residual
    stream; r (L, N, C) holds each shard's stream r_i = xbar + d_i while it is desynced, else None. d_i = r_i - xbar
    is formed only where a sync needs it. T: tokens per sequence (attention is causal within each); kv: this
    layer's KV cache (model.LayerKV) when generating, else None. The model passes blocks a third part, `pending`:
    the outputs of a ladder block's modules not yet added to the synced stream (see step, LadderBlock).

    Dropout (docs/model.md): an output added to the synced stream after its all-reduce is dropped with the
    replica's mask (the same on every shard); one added to a shard's own stream with that shard's mask. Each
    dropped output includes its bias share, as GPT drops c_proj(y) with its bias. Masks are drawn in GPT's order
    (attention probabilities, attention output, MLP output), so at tp_size 1 a block whose gpt_at_tp1 is GPT's block."""

    def __init__(self, config, group, key, layer):
        super().__init__()
        self.group, self.key, self.layer, self.p = group, key, layer, config.dropout
        self.overlap = config.tp_overlap  # K: chunks of the batch, each chunk's all-reduce overlapping the next chunk
        self.async_grad = config.tp_async_grad  # f's backward all-reduce asynchronous (docs/overlap.md)
        self.rings = config.tp_collective_matmul  # SP's collectives as rings beside partial GEMMs
        # where this block's collectives run, for their trace labels (counting.traced): (layer, block type, site)
        self.sites = {site: (layer, self.kind or type(self).__name__, site) for site in ("attn", "mlp")}
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = ShardedAttention(config, group.local)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = ShardedMLP(config, group.local)
        # the tp shards' dropout streams (tpcomm.tp.dropout): at tp_size 1 the one shard's stream is the replica's (0)
        tp, first = group.tp, group.first_shard
        self.streams = tuple(0 if tp == 1 else 1 + first + i for i in range(group.local))

    def probs_dropout(self, seq0=0):
        """The attention probabilities' dropout, each shard's heads with that shard's mask; None without dropout.
        seq0: the first sequence of a batch chunk (tp_overlap), whose masks are the whole batch's from there."""
        if not (self.training and self.p > 0.0):
            return None
        return lambda att: att * mask_or_none(att, self.p, self.key, training=True, layer=self.layer, site=ATTN_PROBS,
                                              streams=self.streams, offset=seq0 * att[0].numel()).to(att.dtype)

    def shard_mask(self, like, site, n0=0):
        """Keep-mask (L, N, C) for an output added to the shards' own streams, or None without dropout; n0: the
        first token (a batch chunk's), the masks being the whole batch's rows from there."""
        return mask_or_none(like, self.p, self.key, training=self.training, layer=self.layer, site=site,
                            streams=self.streams, offset=n0 * like.shape[-1])

    def replica_mask(self, like, site, n0=0):
        """Keep-mask (N, C) for an output added to the synced stream after its all-reduce, or None; n0 as above (a
        batch chunk's or a token shard's first token)."""
        return mask_or_none(like, self.p, self.key, training=self.training, layer=self.layer, site=site,
                            offset=n0 * like.shape[-1])

    def chunks(self, xbar, r, T, kv):
        """[(n0, xbar_k, r_k)]: the batch in tp_overlap = K chunks of whole sequences, n0 each one's first token
        (views, no copy); one chunk when K = 1, with a KV cache (decoding), or outside training when the batch does
        not split (generation of one sequence)."""
        N, K = xbar.shape[0], self.overlap
        B = N // T
        if K == 1 or kv is not None or (B % K and not self.training):
            return [(0, xbar, r)]
        if B % K:
            raise ConfigError(f"tp_overlap={K} needs a batch of whole sequences divisible by it, got batch {B}")
        n = N // K
        rs = [None] * K if r is None else r.split(n, dim=1)
        return [(k * n, x, rk) for k, (x, rk) in enumerate(zip(xbar.split(n), rs))]

    def fused_f(self):
        """Whether f runs fused with its projection, its backward all-reduce asynchronous (tp_async_grad; in
        training passes: a pass without gradients has no backward)."""
        return self.async_grad and torch.is_grad_enabled()

    def column_input(self, parts, ln, *, synced=True, defer=False):
        """ColumnInput of the synced stream parts[0] + parts[1] + ... and the LayerNorm ln on it (synced: the
        replica's, used on the synced stream; else each shard's own, used after f). defer: its backward wait is a
        node made now (real mode), so what is computed from here to its projection runs backward meanwhile."""
        g = self.group
        b = None if ln.bias is None else g.synced(ln.bias) if synced else ln.bias
        w = g.synced(ln.weight) if synced else ln.weight
        return ColumnInput(g, [p for p in parts if p is not None], w, b, defer=defer)

    def g(self, partials, site, *, overlap):
        """g of the (L, N, C) partials: waited for at once (Reduced) or, overlap, issued asynchronously."""
        if overlap:
            return reduce_from_tp_region_async(partials, self.group, site=self.sites[site])
        return Reduced(reduce_from_tp_region(partials, self.group, site=self.sites[site]))

    def sp_close(self, x, reduced, linear, site, *, masked):
        """Sequence parallelism, on the token shard x (N/tp, C): x + R ⊙ (reduced + b), R this shard's rows of the
        replica mask (Megatron's bias-dropout-add); masked: reduced already holds R ⊙ its sum (applied before the
        reduce-scatter), so only b is dropped here. b is used plainly: each rank's gradient of it is partial (its
        tokens), summed over the tp group with the block-replicated gradients."""
        R = self.replica_mask(x, site, n0=self.group.token_offset(x.shape[0]))
        b = linear.bias
        if not masked:
            y = reduced if b is None else reduced + b
            return x + (y if R is None else y * R.to(y.dtype))
        x = x + reduced
        return x if b is None else x + (b if R is None else b * R.to(b.dtype))

    def synced_bias(self, linear, mask):
        """A c_proj bias to add once to the synced stream (after g), dropped with the replica mask; None without."""
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
        """(r (L, N, C), the shards' attention heads of LN1(r)): shard_streams then attention; src: xbar's
        ColumnInput (tp_async_grad), f and LN1 and c_attn fused."""
        drop = self.probs_dropout(n0 // T)
        if src is not None and r is None:
            r, qkv = src.project(*self.attn.qkv_weight(), norm="fan_out", site=self.sites["attn"])
            return r, self.attn.attend(qkv, T, drop, kv)
        r, h = self.shard_streams(xbar, r, sequence_parallel=sequence_parallel)
        return r, self.attn.heads(h, T, drop, kv)

    def shard_streams(self, xbar, r, *, sequence_parallel=False):
        """The shards' streams and LN1 of them: a synced stream fans out first (through f; sequence parallel: an
        all-gather of its token shards)."""
        # the stream's own dtype from here: a desynced r_i accumulates in fp32, as xbar does
        if r is None and sequence_parallel:
            r = gather_to_tp_region(xbar, self.group, site=self.sites["attn"]).to(xbar.dtype)
        elif r is None:
            return self.group.fan_out(xbar, lambda x: layer_norm(self.ln_1, x), self.sites["attn"])
        return r, layer_norm(self.ln_1, r)

    def fan_in(self, ln, x, site, *, sequence_parallel=False):
        """A module's input from the synced stream x, on every shard: f of the replica's LayerNorm of x, or, sequence
        parallel (x a token shard), the all-gather of the LayerNorm of the shard."""
        if sequence_parallel:
            return gather_to_tp_region(layer_norm(ln, x), self.group, site=self.sites[site])
        return copy_to_tp_region(synced_layer_norm(ln, x, self.group), self.group, site=self.sites[site])

    def attn_partials(self, xbar, r, T, kv, n0=0, *, sequence_parallel=False, src=None):
        """(R1 * A_i(LN1(.)) (L, N, C) for an all-reduce, R1): each shard's attention output dropped with the replica
        mask, read from the synced stream xbar (through f) or, desynced, from the shard's own r_i, whose
        d_i = r_i - xbar then join the same sum. n0: a batch chunk's first token (its dropout masks' rows).
        sequence_parallel: (fan_in; a desynced xbar is an SPStream, d_i = r_i - its base), the sum a
        reduce-scatter; from a synced stream R1 is None here, applied after it (sp_close).
        src: xbar's ColumnInput (tp_async_grad): f fused with LN1 and c_attn."""
        drop = self.probs_dropout(n0 // T)
        if r is None and src is not None:
            y = self.attn.attend(src.project(*self.attn.qkv_weight(), norm="before", site=self.sites["attn"]), T,
                                 drop, kv)
        elif r is None:
            y = self.attn.heads(self.fan_in(self.ln_1, xbar, "attn", sequence_parallel=sequence_parallel), T, drop, kv)
        else:
            y = self.attn.heads(layer_norm(self.ln_1, r), T, drop, kv)
        if r is None:
            R1 = None if sequence_parallel else self.replica_mask(xbar, ATTN_OUT, n0)
            return self.attn.out(y, mask=R1), R1
        R1 = self.replica_mask(r[0] if sequence_parallel else xbar, ATTN_OUT, n0)
        d = xbar.delta(r) if sequence_parallel else self.group.delta(r, xbar)
        return self.attn.out(y, acc=d, own_acc=not sequence_parallel, mask=R1), R1

    def mlp_partials(self, x, r=None, n0=0, *, sequence_parallel=False):
        """(R2 * M_i(LN2(.)) (L, N, C) for an all-reduce, R2), read from the synced stream x (through f) or, given
        r (L, N, C), from each shard's own stream r_i. sequence_parallel: x a token shard (fan_in), R2 None here
        (sp_close)."""
        h = (self.fan_in(self.ln_2, x, "mlp", sequence_parallel=sequence_parallel) if r is None
             else layer_norm(self.ln_2, r))
        u = self.mlp.hidden(h)
        R2 = None if sequence_parallel else self.replica_mask(x, MLP_OUT, n0)
        return self.mlp.out(u, mask=R2), R2

    def fused_mlp_partials(self, src, n0=0):
        """mlp_partials of the synced stream x = the sum of src's parts, f fused with LN2 and c_fc (tp_async_grad):
        (x (N, C), R2 * M_i(LN2(x)) (L, N, C), R2)."""
        # x is formed inside (its gradient then joins LN2's there), else it is parts[0]; a deferred src's parts feed
        # only the projection and ColumnInput.stream (their placeholder gradients must reach no other use), so x
        # comes out of the projection
        resid = len(src.parts) > 1 or src.link is not None
        out = src.project(*self.mlp.fc_weight(), norm="before", resid=resid, site=self.sites["mlp"])
        x, pre = out if resid else (src.parts[0], out)
        R2 = self.replica_mask(x, MLP_OUT, n0)
        return x, self.mlp.out(self.mlp.gelu(pre), mask=R2), R2

    def step(self, xbar, r, pending, T, kv=None, *, sequence_parallel=False, next_block=None):
        """The model's stream through this block, (xbar, r, pending) -> (xbar, r, pending): outputs still pending
        (from a ladder block before it) are added first, then the block runs; it leaves nothing pending.
        sequence_parallel: xbar is this rank's token shard of the synced stream (docs/overlap.md). next_block:
        the block after this one in the same module (None at the end or at a pipeline cut; see LadderBlock)."""
        return (*self(add_pending(xbar, pending), r, T, kv, sequence_parallel=sequence_parallel), ())


class TPBlock(TPType, ShardedBlock):
    """Megatron's block, 2 forward all-reduces; output synced:
    x' = xbar + sum_i d_i + R1 * (sum_i A_i(LN1(r_i)) + b_A);  x'' = x' + R2 * (sum_i M_i(LN2(x')) + b_M).
    tp_overlap = K: the batch in K chunks; chunk k's all-reduce is issued (not waited for) before chunk k+1 computes."""


    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        if sequence_parallel:
            return self.forward_sp(xbar, r, T, kv)
        chunks = self.chunks(xbar, r, T, kv)
        overlap = len(chunks) > 1
        fused = self.fused_f()  # tp_async_grad: f fused with its projection, the backward all-reduce asynchronous
        # with K chunks, every chunk's backward wait is a node made before any chunk computes, so each chunk's
        # backward all-reduce runs while the other chunks' backward computes (ColumnInput)
        srcs = [self.column_input((x,), self.ln_1, defer=overlap) if fused and rk is None else None
                for _, x, rk in chunks]
        attn = []  # every chunk's attention, each chunk's all-reduce issued before the next chunk computes
        for (n0, x, rk), src in zip(chunks, srcs):
            a, R1 = self.attn_partials(x, rk, T, kv, n0, src=src)  # a desynced input's d_i join this all-reduce
            attn.append((self.g(a, "attn", overlap=overlap), R1))
        if fused:  # x' = x + the attention's sum + its bias, as parts: the MLP's ColumnInputs, made before any MLP
            srcs = [self.column_input((x, reduced.value, self.synced_bias(self.attn.c_proj, R1)), self.ln_2,
                                      defer=overlap) for (_, x, _), (reduced, R1) in zip(chunks, attn)]
        mlp = []  # then per chunk: wait for its attention's sum, its MLP, issue (the previous chunk's runs meanwhile)
        for k, ((n0, x, _), (reduced, R1)) in enumerate(zip(chunks, attn)):
            if fused:
                reduced.wait()
                x, m, R2 = self.fused_mlp_partials(srcs[k], n0)
            else:
                x = self.add_synced_bias(x + reduced.wait(), self.attn.c_proj, R1)
                m, R2 = self.mlp_partials(x, n0=n0)
            mlp.append((x, self.g(m, "mlp", overlap=overlap), R2))
        return join([self.add_synced_bias(x + reduced.wait(), self.mlp.c_proj, R2) for x, reduced, R2 in mlp]), None

    def forward_sp(self, x, r, T, kv):
        """Sequence parallelism: x (N/tp, C) this rank's token shard of the synced stream (simulated: all of them,
        (N, C)); LN1, LN2, the biases and the replica dropout run on it; f is an all-gather, g a reduce-scatter.
        Desynced input (r, after 'parallel'; x an SPStream): the reduce-scatter of d_i + R1 * A_i, d_i = r_i - base,
        onto the token shard, R1 applied before the reduce-scatter (it must not drop the d_i)."""
        group, sites = self.group, self.sites
        if self.rings:  # tp_collective_matmul: the collectives as rings beside partial GEMMs
            return collective_matmul_block(self, x, T, kv), None
        a, _ = self.attn_partials(x, r, T, kv, sequence_parallel=True)
        x = self.sp_close(x if r is None else x.shard, reduce_scatter_from_tp_region(a, group, site=sites["attn"]),
                          self.attn.c_proj, ATTN_OUT, masked=r is not None)
        m, _ = self.mlp_partials(x, sequence_parallel=True)
        return self.sp_close(x, reduce_scatter_from_tp_region(m, group, site=sites["mlp"]), self.mlp.c_proj, MLP_OUT,
                             masked=False), None


class SPDBlock(SPDType, ShardedBlock):
    """Sync-Point Drop: the all-reduce after attention is dropped, 1 forward all-reduce; output synced:
    a_i = D_i * (A_i(LN1(r_i)) + b_A/tp);  y_i = r_i + a_i + b_A (tp-1)/tp stays local;
    x' = xbar + sum_i [d_i + a_i] + R * (sum_i M_i(LN2(y_i)) + b_M).
    tp_overlap = K: the batch in K chunks, chunk k's all-reduce overlapping chunk k+1's compute."""


    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        # sum_i [d_i + a_i + R * M_i] reduce-scattered onto the token shard (desynced: xbar an SPStream)
        if sequence_parallel:
            s, _ = self.partials(xbar, r, T, kv, sequence_parallel=True)
            reduced = reduce_scatter_from_tp_region(s, self.group, site=self.sites["mlp"])
            shard = xbar if r is None else xbar.shard
            return self.sp_close(shard, reduced, self.mlp.c_proj, MLP_OUT, masked=True), None
        chunks = self.chunks(xbar, r, T, kv)
        # tp_async_grad: f fused with LN1 and c_attn; with K chunks, each chunk's backward wait made before any
        # chunk computes (see TPBlock)
        srcs = [self.column_input((x,), self.ln_1, synced=False, defer=len(chunks) > 1)
                if self.fused_f() and rk is None else None for _, x, rk in chunks]
        issued = []
        for (n0, x, rk), src in zip(chunks, srcs):
            s, R = self.partials(x, rk, T, kv, n0, src=src)
            issued.append((x, self.g(s, "mlp", overlap=len(chunks) > 1), R))
        return join([self.add_synced_bias(x + reduced.wait(), self.mlp.c_proj, R) for x, reduced, R in issued]), None

    def partials(self, xbar, r, T, kv, n0=0, *, sequence_parallel=False, src=None):
        """(s (L, N, C), R): the summands d_i + a_i + R * M_i(LN2(y_i)) of the block's one all-reduce (sequence parallel: its
        reduce-scatter; a desynced xbar is an SPStream, d_i = r_i - its base) and the replica mask R. n0: a batch
        chunk's first token (its masks' rows)."""
        group, tp, proj = self.group, self.group.tp, self.attn.c_proj
        synced = r is None  # every r_i is xbar: d_i = 0
        r, heads = self.shard_heads(xbar, r, T, kv, n0, sequence_parallel=sequence_parallel, src=src)
        D = self.shard_mask(r, ATTN_OUT, n0)
        if synced:  # the summands a_i + R * M_i, a_i = D_i * (A_i + b_A/tp) kept as it is, not as (r_i + a_i) - xbar
            a = self.attn.out(heads, bias=self.bias_share(proj, 1 / tp), mask=D)  # (L, N, C), fresh
            y = r + a if tp == 1 or proj.bias is None else r + a + self.bias_share(proj, (tp - 1) / tp)
            R = self.replica_mask(r[0], MLP_OUT, n0)
            return self.mlp.out(self.mlp.hidden(layer_norm(self.ln_2, y)), acc=a, own_acc=True, mask=R), R
        if D is None:  # y_i = r_i + A_i + b_A in one step
            y = self.attn.out(heads, acc=r, bias=proj.bias)
        else:
            y = self.attn.out(heads, acc=r, bias=self.bias_share(proj, 1 / tp), mask=D)
            if tp > 1 and proj.bias is not None:
                y = y + self.bias_share(proj, (tp - 1) / tp)
        acc = xbar.delta(y) if sequence_parallel else group.delta(y, xbar)  # d_i + a_i + b_A (tp-1)/tp
        if tp > 1 and proj.bias is not None:
            acc = acc - self.bias_share(proj, (tp - 1) / tp)
        u = self.mlp.hidden(layer_norm(self.ln_2, y))
        R = self.replica_mask(r[0], MLP_OUT, n0)
        return self.mlp.out(u, acc=acc, own_acc=acc is not y, mask=R), R


class ParallelBlock(ParallelType, ShardedBlock):
    """No communication; each shard updates its own stream, output desynced:
    r_i += D_i * (A_i(LN1(r_i)) + b_A/tp);  r_i += E_i * (M_i(LN2(r_i)) + b_M/tp).
    tp_overlap does not apply (nothing to overlap); sequence parallel: a synced input is all-gathered."""


    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        tp, synced = self.group.tp, r is None
        src = self.column_input((xbar,), self.ln_1, synced=False) if self.fused_f() and synced else None
        r, y = self.shard_heads(xbar, r, T, kv, sequence_parallel=sequence_parallel, src=src)
        if sequence_parallel and synced:  # the token shard and the gathered stream the r_i start from (see SPStream)
            xbar = SPStream(xbar, r)
        r = self.attn.out(y, acc=r, bias=self.bias_share(self.attn.c_proj, 1 / tp), mask=self.shard_mask(r, ATTN_OUT))
        u = self.mlp.hidden(layer_norm(self.ln_2, r))
        r = self.mlp.out(u, acc=r, bias=self.bias_share(self.mlp.c_proj, 1 / tp), mask=self.shard_mask(r, MLP_OUT))
        return xbar, r


class LadderBlock(LadderType, ShardedBlock):
    """Ladder Residual: each module reads the stream from before the previous module's output is added, so that
    output's all-reduce runs while this module computes. 2 forward all-reduces, both issued asynchronously; output
    synced, with this block's two reduced outputs pending. With P_A, P_M attention l-1's and MLP l-1's pending
    outputs (absent after a non-ladder block):
    u = xbar + P_A (through attention l-1);  P_A' = sum_i [d_i + R1 * A_i(LN1(u_i))] + R1 b_A  (issued, not waited)
    x' = u + P_M (through MLP l-1);          P_M' = R2 * (sum_i M_i(LN2(x'_i)) + b_M)          (issued, not waited)
    -> (x', None, (P_A', P_M')). Synced input: u_i = u, x'_i = x', d_i = 0; desynced (after 'parallel', nothing
    pending): u_i = x'_i = r_i, the d_i join attention's all-reduce."""


    def step(self, xbar, r, pending, T, kv=None, *, sequence_parallel=False, next_block=None):
        assert not sequence_parallel, "validate_sync_options refuses sequence_parallel with this block type (its facts)"
        return self(xbar, r, T, kv, pending=pending, next_block=next_block)

    def forward(self, xbar, r, T, kv=None, pending=(), next_block=None):
        if self.fused_f() and r is None:
            return self.forward_async_grad(xbar, T, kv, pending, next_block)
        P_A, P_M = pending or (None, None)  # a ladder block's two outputs, or nothing after another block type
        u = xbar if P_A is None else P_A.add_to(xbar)  # waits for attention l-1's all-reduce (MLP l-1 ran meanwhile)
        a, R1 = self.attn_partials(u, r, T, kv)
        P_A = self.issue(a, self.attn.c_proj, R1, "attn")
        x = u if P_M is None else P_M.add_to(u)  # waits for MLP l-1's all-reduce (attention l ran meanwhile)
        m, R2 = self.mlp_partials(x, r)
        return x, None, (P_A, self.issue(m, self.mlp.c_proj, R2, "mlp"))

    def forward_async_grad(self, xbar, T, kv, pending, next_block):
        """forward on a synced stream with tp_async_grad: f fused with LN1 and c_attn, and with LN2 and c_fc, each
        backward all-reduce asynchronous, waited for in a node made before the module the ladder lets it overlap:
        the MLP's wait before attention computes (MLP l's backward all-reduce runs while attention l's backward
        computes), and, when the next block is a ladder block this one can hand its input to (hands_over_to), the
        next attention's wait before this MLP computes (attention l+1's runs while MLP l's backward computes)."""
        P_A, P_M, *handed = pending or (None, None)  # handed: this attention's ColumnInput, made by the block before
        src = handed[0] if handed else self.column_input(full(stream_parts(xbar, P_A), xbar), self.ln_1)
        if len(src.parts) > 1:
            P_A.reduction.wait()  # attention l-1's all-reduce (MLP l-1 ran meanwhile)
        u = src.stream()  # formed apart from attention's projection, whose backward then need not wait for the MLP's
        x_parts = full(stream_parts(u, P_M), u)  # x = u + P_M, summed in the MLP's (and next attention's) projection
        # the MLP's wait made before all of attention (its projection included), so it runs after attention's backward
        mlp_src = self.column_input(x_parts, self.ln_2, defer=True)
        a, R1 = self.attn_partials(xbar, None, T, kv, src=src)
        P_A = self.issue(a, self.attn.c_proj, R1, "attn")
        # the next attention reads x + P_A: its ColumnInput, its wait's node, made before MLP l computes
        handed = (next_block.column_input(full((*x_parts, P_A.value, P_A.bias), u), next_block.ln_1, defer=True),) \
            if self.hands_over_to(next_block) else ()
        if isinstance(P_M, Pending):
            P_M.reduction.wait()  # MLP l-1's all-reduce (attention l ran meanwhile)
        x, m, R2 = self.fused_mlp_partials(mlp_src)
        return x, None, (P_A, self.issue(m, self.mlp.c_proj, R2, "mlp"), *handed)

    def hands_over_to(self, block):
        """Whether this block makes the next block's first ColumnInput (forward_async_grad): block is a ladder block
        taking the fused path, in real eager training (where waits are deferred), and neither block is sharded by
        FSDP2 (which gathers block's LayerNorm, whose gradient the deferred wait gives, only in block's forward, and
        reduces block's gradients when block's inputs have theirs)."""
        if not (isinstance(block, LadderBlock) and block.fused_f() and self.group.real
                and not torch.compiler.is_compiling()):
            return False
        from torch.distributed.fsdp import FSDPModule
        return not isinstance(self, FSDPModule) and not isinstance(block, FSDPModule)

    def issue(self, partials, linear, mask, site):
        """Pending: the all-reduce of partials (L, N, C), issued, and the bias to add after it. The bias is a copy:
        it is used after this forward returns, when FSDP has freed the block's gathered parameters."""
        reduction = reduce_from_tp_region_async(partials, self.group, site=self.sites[site])
        b = self.synced_bias(linear, mask)
        return Pending(reduction, reduction.value, None if b is None else b.clone())


class CAATBlock(PartialSync, CAATType, ShardedBlock):
    """Partial-channel sync: its forward is PartialSync's (tpcomm/tp/partial_sync.py)."""


def register(kind, cls):
    """Make cls (a ShardedBlock) the block type `kind`: block_types accepts it, DistributedGPT builds it, and every
    place reads its facts (block_types.BLOCK_TYPES)."""
    if not (isinstance(cls, type) and issubclass(cls, ShardedBlock)):
        raise TypeError(f"block type {kind!r}: {cls!r} is not a ShardedBlock")
    return add(kind, cls)


for _kind, _cls in (("tp", TPBlock), ("spd", SPDBlock), ("parallel", ParallelBlock), ("ladder", LadderBlock),
                    ("caat", CAATBlock)):
    register(_kind, _cls)


def block_class(kind):
    """The block class of a registered type (a name the validator accepted)."""
    cls = BLOCK_TYPES[kind]
    assert issubclass(cls, ShardedBlock), f"block type {kind!r} has facts but no code: register its ShardedBlock"
    return cls
