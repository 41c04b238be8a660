"""
'ladder': Ladder Residual (arXiv 2501.06589). Each module reads the stream from before the previous module's
output is added, so that output's all-reduce runs while this module computes: 2 forward all-reduces, both
issued asynchronously; output synced, with this block's two reduced outputs pending (docs/model.md). With P_A,
P_M attention l-1's and MLP l-1's pending outputs (absent after a block of another type):
    u = xbar + P_A (through attention l-1);  P_A' = sum_i [d_i + R1 * A_i(LN1(u_i))] + R1 b_A  (issued)
    x' = u + P_M (through MLP l-1);          P_M' = R2 * (sum_i M_i(LN2(x'_i)) + b_M)          (issued)
    -> (x', None, (P_A', P_M')), neither waited for. Synced input: u_i = u, x'_i = x', d_i = 0; desynced
    (after 'parallel', nothing pending): u_i = x'_i = r_i, the d_i join attention's all-reduce.
"""

from tpcomm.model.block_types.registry import BlockType, register


class Ladder(BlockType):
    """Ladder Residual: a block that overlaps by itself (its pending outputs cross a pipeline cut)."""
    forward_syncs, backward_syncs = 2, (2, 0)  # desynced input: both modules read the shards' own streams
    delays = True
    sequence_parallel = False  # its pending all-reduces are not token-sharded
    gpt_at_tp1 = False  # each module reads the stream from before the previous module's output, at every tp

    def step(self, xbar, r, pending, T, kv=None, *, sequence_parallel=False, next_block=None):
        assert not sequence_parallel, "the validator refuses sequence_parallel here (its facts)"
        return self(xbar, r, T, kv, pending=pending, next_block=next_block)

    def forward(self, xbar, r, T, kv=None, pending=(), next_block=None):
        if self.fused_f() and r is None:
            return self.forward_async_grad(xbar, T, kv, pending, next_block)
        # a ladder block's two outputs, or nothing after another block type
        P_A, P_M = pending or (None, None)
        # waits for attention l-1's all-reduce (MLP l-1 ran meanwhile)
        u = xbar if P_A is None else P_A.add_to(xbar)
        a, R1 = self.attn_partials(u, r, T, kv)
        P_A = self.issue(a, self.attn.c_proj, R1, "attn")
        x = u if P_M is None else P_M.add_to(u)  # waits for MLP l-1's all-reduce (attention l ran meanwhile)
        m, R2 = self.mlp_partials(x, r)
        return x, None, (P_A, self.issue(m, self.mlp.c_proj, R2, "mlp"))

    def forward_async_grad(self, xbar, T, kv, pending, next_block):
        """forward on a synced stream with tp_async_grad: f fused with LN1 and c_attn, and with LN2 and
        c_fc, each backward all-reduce asynchronous, waited for in a node made before the module the
        ladder lets it overlap: the MLP's wait before attention computes (MLP l's backward all-reduce
        runs while attention l's backward computes), and, when the next block is a ladder block this one
        can hand its input to (hands_over_to), the next attention's wait before this MLP computes
        (attention l+1's runs while MLP l's backward computes)."""
        # handed: this attention's ColumnInput, made by the block before
        P_A, P_M, *handed = pending or (None, None)
        src = handed[0] if handed else self.column_input(self.full(self.stream_parts(xbar, P_A), xbar),
                                                         self.ln_1)
        if len(src.parts) > 1:
            P_A.reduction.wait()  # attention l-1's all-reduce (MLP l-1 ran meanwhile)
        # formed apart from attention's projection, whose backward then need not wait for the MLP's
        u = src.stream()
        # x = u + P_M, summed in the MLP's (and next attention's)
        x_parts = self.full(self.stream_parts(u, P_M), u)
        # projection; the MLP's wait made before all of attention (its projection included), so it runs after
        # attention's backward
        mlp_src = self.column_input(x_parts, self.ln_2, defer=True)
        a, R1 = self.attn_partials(xbar, None, T, kv, src=src)
        P_A = self.issue(a, self.attn.c_proj, R1, "attn")
        # the next attention reads x + P_A: its ColumnInput, its wait's node, made before MLP l computes
        handed = (next_block.column_input(self.full((*x_parts, P_A.value, P_A.bias), u), next_block.ln_1,
                                          defer=True),) if self.hands_over_to(next_block) else ()
        if self.is_pending(P_M):
            P_M.reduction.wait()  # MLP l-1's all-reduce (attention l ran meanwhile)
        x, m, R2 = self.fused_mlp_partials(mlp_src)
        return x, None, (P_A, self.issue(m, self.mlp.c_proj, R2, "mlp"), *handed)

    def hands_over_to(self, block):
        """Whether this block makes the next block's first ColumnInput (forward_async_grad): block is a ladder
        block taking the fused path, and both may defer their waits (ShardedBlock.defers_waits_with)."""
        return isinstance(block, Ladder) and block.fused_f() and self.defers_waits_with(block)


register("ladder", Ladder)
