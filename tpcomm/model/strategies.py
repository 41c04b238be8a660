"""
The execution strategies, applied from outside a block type's equations: a type that writes its block as
`equations(x, r, T, kv, at)`, a generator that yields each of its syncs (a Sync) and is sent back the synced
stream, runs under every strategy its facts permit without a branch of its own (its last sync, then=None, is
its output: the stream leaves it synced):
- tp_overlap = K: the batch in K chunks of whole sequences, one generator each, run in lockstep: every chunk's
  sync is issued (not waited for) before the next chunk computes, and waited for just before its chunk goes
  on;
- tp_async_grad: f fused with the LayerNorm and projection after it (ColumnInput), its backward all-reduce
  asynchronous; with K chunks each chunk's backward wait is a node made before any chunk computes;
- sequence_parallel: each sync a reduce-scatter onto this rank's token shard, closed by the bias-dropout-add
  on the shard, each f an all-gather (the type's partials read `at`);
- tp_collective_matmul (with sequence_parallel): the block's collectives as rings beside partial GEMMs.
docs/overlap.md has the schedules.
"""

from typing import NamedTuple, Optional

import torch

from tpcomm.errors import ConfigError
from tpcomm.tp.async_grad import ColumnInput
from tpcomm.tp.collectives import reduce_from_tp_region, reduce_from_tp_region_async
from tpcomm.tp.sharded_layers import Reduced, SPStream, join


class Sync(NamedTuple):
    """One sync of a type's equations: the stream x plus the sum over shards of partials (L, N, C), plus the
    site's c_proj bias, dropped with the replica mask R (applied to partials already). then: the LayerNorm the
    next module applies to the result (tp_async_grad fuses f with it); None: the result is the block's output.
    masked: under sequence parallelism, R is in partials already (drawn on the shard's rows otherwise)."""
    partials: torch.Tensor
    site: str
    x: object  # (N, C), or under sequence parallelism the token shard (an SPStream when desynced)
    R: Optional[torch.Tensor]
    then: object
    masked: bool


class FusedInput(NamedTuple):
    """A sync's result handed on under tp_async_grad: the next module's ColumnInput over x + the sum + the
    bias (made before any chunk's module computes) and the all-reduce to wait for before its projection."""
    src: ColumnInput
    reduced: object


class Strategies:
    """The drivers of a type's `equations` (ShardedBlock mixes this in; a type with a
    forward of its own runs that)."""

    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        """(xbar, None): the type's equations under this block's strategies (the
        stream contract: ShardedBlock)."""
        if sequence_parallel and self.rings and self.collective_matmul:
            return self.collective_matmul_block(xbar, T, kv), None
        if sequence_parallel:
            return self.run_sequence_parallel(xbar, r, T, kv)
        return self.run_chunks(xbar, r, T, kv)

    def sync(self, partials, site, x, R, *, then=None, masked=False):
        return Sync(partials, site, x, R, then, masked)

    def mlp_from(self, x, at):
        """(x, R2 * M_i(LN2(x)) (L, N, C), R2) from the synced stream a sync handed back: a tensor, or under
        tp_async_grad a FusedInput (f fused with LN2 and c_fc; x formed inside the projection)."""
        if isinstance(x, FusedInput):
            x.reduced.wait()
            return self.fused_mlp_partials(x.src, at.get("n0", 0))
        m, R2 = self.mlp_partials(x, n0=at.get("n0", 0), sequence_parallel=at.get("sequence_parallel", False))
        return x, m, R2

    def run_chunks(self, xbar, r, T, kv):
        chunks = self.chunks(xbar, r, T, kv)
        overlap, fused = len(chunks) > 1, self.fused_f()
        # every chunk's fused first f before any chunk computes
        firsts = [self.first_input(x, fused and rk is None, overlap) for _, x, rk in chunks]
        gens = [self.equations(x, rk, T, kv, dict(n0=n0, src=src))
                for (n0, x, rk), src in zip(chunks, firsts)]
        outs, sent, last = [None] * len(gens), {k: (lambda: None) for k in range(len(gens))}, set()
        while sent:  # a round: every chunk to its next sync, each issued before the next chunk computes
            issued = {}
            for k, value in sent.items():
                if k in last:  # its block output, waited for in chunk order
                    outs[k] = value()
                    continue
                req = gens[k].send(value())
                issued[k] = (req, self.g(req.partials, req.site, overlap=overlap))
                if req.then is None:
                    last.add(k)
            sent = {k: self.handed_back(req, reduced, fused=fused, defer=overlap)
                    for k, (req, reduced) in issued.items()}
        return join(outs), None

    def first_input(self, x, fuse, defer):
        """Under tp_async_grad, a synced chunk's first f fused with LN1 and c_attn: its ColumnInput (with
        defer, its backward wait a node made before any chunk computes); else None."""
        return self.column_input((x,), self.ln_1, synced=self.norm_before_f, defer=defer) if fuse else None

    def handed_back(self, req, reduced, *, fused, defer):
        """What a chunk's generator is sent for its sync (a thunk, called just before the chunk goes on): x +
        the sum + the bias, waited for then; under tp_async_grad, for a sync with a next LayerNorm, a
        FusedInput made now, before any chunk's next module computes."""
        linear = self.site_linear(req.site)
        if fused and req.then is not None:
            fi = FusedInput(self.column_input((req.x, reduced.value, self.synced_bias(linear, req.R)),
                                              req.then, defer=defer), reduced)
            return lambda: fi
        return lambda: self.add_synced_bias(req.x + reduced.wait(), linear, req.R)

    def run_sequence_parallel(self, xbar, r, T, kv):
        gen, value = self.equations(xbar, r, T, kv, dict(sequence_parallel=True)), None
        while True:
            req = gen.send(value)
            shard = req.x.shard if isinstance(req.x, SPStream) else req.x
            value = self.sp_close(shard, self.reduce_scatter(req.partials, req.site),
                                  self.site_linear(req.site), req.site, masked=req.masked)
            if req.then is None:
                return value, None

    def site_linear(self, site):
        return {"attn": self.attn.c_proj, "mlp": self.mlp.c_proj}[site]

    def chunks(self, xbar, r, T, kv):
        """[(n0, xbar_k, r_k)]: the batch in tp_overlap = K chunks of whole sequences, n0 each one's first
        token (views, no copy); one chunk when K = 1, with a KV cache (decoding), or outside training when the
        batch does not split (generation of one sequence)."""
        N, K = xbar.shape[0], self.overlap
        B = N // T
        if K == 1 or kv is not None or (B % K and not self.training):
            return [(0, xbar, r)]
        if B % K:
            raise ConfigError(f"tp_overlap={K} needs a batch of whole sequences divisible by it, got batch "
                              f"{B}")
        n = N // K
        rs = [None] * K if r is None else r.split(n, dim=1)
        return [(k * n, x, rk) for k, (x, rk) in enumerate(zip(xbar.split(n), rs))]

    def fused_f(self):
        """Whether f runs fused with its projection, its backward all-reduce asynchronous (tp_async_grad; in
        training passes: a pass without gradients has no backward)."""
        return self.async_grad and torch.is_grad_enabled()

    def column_input(self, parts, ln, *, synced=True, defer=False):
        """ColumnInput of the synced stream parts[0] + parts[1] + ... and the LayerNorm ln on it
        (synced: the replica's, used on the synced stream; else each shard's own, used after f).
        defer: its backward wait is a node made now (real mode), so what is computed from here to
        its projection runs backward meanwhile."""
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
        """Sequence parallelism, on the token shard x (N/tp, C): x + R ⊙ (reduced + b), R this shard's rows of
        the replica mask (Megatron's bias-dropout-add); masked: reduced already holds R ⊙ its sum (applied
        before the reduce-scatter), so only b is dropped here. b is used plainly: each rank's gradient of it
        is partial (its tokens), summed over the tp group with the block-replicated gradients."""
        R = self.replica_mask(x, site, n0=self.group.token_offset(x.shape[0]))
        b = linear.bias
        if not masked:
            y = reduced if b is None else reduced + b
            return x + (y if R is None else y * R.to(y.dtype))
        x = x + reduced
        return x if b is None else x + (b if R is None else b * R.to(b.dtype))
