"""
'tp': Megatron's tensor-parallel block, 2 forward all-reduces, output synced (docs/model.md):
    x' = xbar + sum_i d_i + R1 * (sum_i A_i(LN1(r_i)) + b_A);   x'' = x' + R2 * (sum_i M_i(LN2(x')) + b_M)
d_i = r_i - xbar is non-zero only after a block that leaves the stream desynced; it joins the first sync.
"""

from tpcomm.model.block_types.registry import BlockType, register


class TP(BlockType):
    """Megatron's block, written as its two syncs (`equations`), which tpcomm/model/strategies.py runs
    under tp_overlap (the batch in chunks, each chunk's all-reduce issued before the next chunk
    computes), tp_async_grad (f fused with its LayerNorm and projection, its backward all-reduce
    asynchronous), sequence parallelism (each sync a reduce-scatter, each f an all-gather) and
    tp_collective_matmul (docs/overlap.md)."""
    # desynced input: only the MLP reads the synced stream through f
    forward_syncs, backward_syncs = 2, (2, 1)
    overlaps = collective_matmul = True

    def equations(self, x, r, T, kv, at):
        a, R1 = self.attn_partials(x, r, T, kv, **at)  # a desynced input's d_i join this sum
        x = yield self.sync(a, "attn", x, R1, then=self.ln_2, masked=r is not None)
        x, m, R2 = self.mlp_from(x, at)
        yield self.sync(m, "mlp", x, R2)  # the block's output: x + the sum + b_M


register("tp", TP)
