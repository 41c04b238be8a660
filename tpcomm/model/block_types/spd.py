"""
'spd': Sync-Point Drop (arXiv 2502.20727), the all-reduce after attention dropped, 1 forward all-reduce,
output synced (docs/model.md):
    a_i = D_i * (A_i(LN1(r_i)) + b_A/tp);   y_i = r_i + a_i + b_A (tp-1)/tp stays local
    x' = xbar + sum_i [d_i + a_i] + R * (sum_i M_i(LN2(y_i)) + b_M)
"""

from tpcomm.model.block_types.registry import BlockType, register


class SPD(BlockType):
    """Sync-Point Drop, written as its one sync (`equations`; the strategies as for 'tp'). f fans the synced
    stream out before each shard's LN1 (its attention's output stays on the shard's own stream)."""
    forward_syncs, backward_syncs = 1, (1, 0)  # backward: the fan-out of a synced input
    overlaps = tp_dependent = True
    norm_before_f = False

    def equations(self, x, r, T, kv, at):
        s, R = self.partials(x, r, T, kv, **at)
        yield self.sync(s, "mlp", x, R, masked=True)  # the block's output

    def partials(self, xbar, r, T, kv, n0=0, *, sequence_parallel=False, src=None):
        """(s (L, N, C), R): the summands d_i + a_i + R * M_i(LN2(y_i)) of the block's one all-reduce
        (sequence parallel: its reduce-scatter; a desynced xbar is an SPStream, d_i = r_i - its base) and the
        replica mask R. n0: a batch chunk's first token (its masks' rows)."""
        tp, proj = self.group.tp, self.attn.c_proj
        synced = r is None  # every r_i is xbar: d_i = 0
        r, heads = self.shard_heads(xbar, r, T, kv, n0, sequence_parallel=sequence_parallel, src=src)
        D = self.shard_mask(r, "attn", n0)
        rest = None if tp == 1 or proj.bias is None else self.bias_share(proj, (tp - 1) / tp)  # b_A (tp-1)/tp
        # the summands a_i + R * M_i, a_i = D_i * (A_i + b_A/tp) kept as it is, not as (r_i + a_i) - xbar
        if synced:
            a = self.attn.out(heads, bias=self.bias_share(proj, 1 / tp), mask=D)  # (L, N, C), fresh
            y = r + a if rest is None else r + a + rest
            R = self.replica_mask(r[0], "mlp", n0)
            return self.mlp.out(self.mlp.hidden(self.layer_norm(self.ln_2, y)), acc=a, own_acc=True,
                                mask=R), R
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
