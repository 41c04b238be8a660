"""
'spd': Sync-Point Drop (arXiv 2502.20727), the all-reduce after attention dropped, 1 forward all-reduce, output
synced (docs/model.md):
    a_i = D_i * (A_i(LN1(r_i)) + b_A/tp);   y_i = r_i + a_i + b_A (tp-1)/tp stays local
    x' = xbar + sum_i [d_i + a_i] + R * (sum_i M_i(LN2(y_i)) + b_M)
"""

from tpcomm.model.block_types.registry import BlockType, register


class SPD(BlockType):
    """Sync-Point Drop. tp_overlap = K: the batch in K chunks, chunk k's all-reduce overlapping chunk k+1's
    compute."""
    forward_syncs, backward_syncs = 1, (1, 0)  # backward: the fan-out of a synced input
    overlaps = tp_dependent = True

    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        if sequence_parallel:  # sum_i [d_i + a_i + R * M_i] reduce-scattered onto the token shard
            s, _ = self.partials(xbar, r, T, kv, sequence_parallel=True)
            shard = xbar if r is None else xbar.shard  # desynced: xbar an SPStream
            return self.sp_close(shard, self.reduce_scatter(s, "mlp"), self.mlp.c_proj, "mlp", masked=True), None
        chunks = self.chunks(xbar, r, T, kv)
        # tp_async_grad: f fused with LN1 and c_attn; with K chunks, each chunk's backward wait made before any
        # chunk computes (as in 'tp')
        srcs = [self.column_input((x,), self.ln_1, synced=False, defer=len(chunks) > 1)
                if self.fused_f() and rk is None else None for _, x, rk in chunks]
        issued = []
        for (n0, x, rk), src in zip(chunks, srcs):
            s, R = self.partials(x, rk, T, kv, n0, src=src)
            issued.append((x, self.g(s, "mlp", overlap=len(chunks) > 1), R))
        return self.join([self.add_synced_bias(x + reduced.wait(), self.mlp.c_proj, R)
                          for x, reduced, R in issued]), None

    def partials(self, xbar, r, T, kv, n0=0, *, sequence_parallel=False, src=None):
        """(s (L, N, C), R): the summands d_i + a_i + R * M_i(LN2(y_i)) of the block's one all-reduce (sequence
        parallel: its reduce-scatter; a desynced xbar is an SPStream, d_i = r_i - its base) and the replica mask R.
        n0: a batch chunk's first token (its masks' rows)."""
        tp, proj = self.group.tp, self.attn.c_proj
        synced = r is None  # every r_i is xbar: d_i = 0
        r, heads = self.shard_heads(xbar, r, T, kv, n0, sequence_parallel=sequence_parallel, src=src)
        D = self.shard_mask(r, "attn", n0)
        rest = None if tp == 1 or proj.bias is None else self.bias_share(proj, (tp - 1) / tp)  # b_A (tp-1)/tp
        if synced:  # the summands a_i + R * M_i, a_i = D_i * (A_i + b_A/tp) kept as it is, not as (r_i + a_i) - xbar
            a = self.attn.out(heads, bias=self.bias_share(proj, 1 / tp), mask=D)  # (L, N, C), fresh
            y = r + a if rest is None else r + a + rest
            R = self.replica_mask(r[0], "mlp", n0)
            return self.mlp.out(self.mlp.hidden(self.layer_norm(self.ln_2, y)), acc=a, own_acc=True, mask=R), R
        if D is None:  # y_i = r_i + A_i + b_A in one step
            y = self.attn.out(heads, acc=r, bias=proj.bias)
        else:
            y = self.attn.out(heads, acc=r, bias=self.bias_share(proj, 1 / tp), mask=D)
            y = y if rest is None else y + rest
        acc = xbar.delta(y) if sequence_parallel else self.group.delta(y, xbar)  # d_i + a_i + b_A (tp-1)/tp
        acc = acc if rest is None else acc - rest
        u = self.mlp.hidden(self.layer_norm(self.ln_2, y))
        R = self.replica_mask(r[0], "mlp", n0)
        return self.mlp.out(u, acc=acc, own_acc=acc is not y, mask=R), R


register("spd", SPD)
