"""
'tp': Megatron's tensor-parallel block, 2 forward all-reduces, output synced (docs/model.md):
    x' = xbar + sum_i d_i + R1 * (sum_i A_i(LN1(r_i)) + b_A);   x'' = x' + R2 * (sum_i M_i(LN2(x')) + b_M)
d_i = r_i - xbar is non-zero only after a block that leaves the stream desynced; it joins the first all-reduce.
"""

from tpcomm.model.block_types.registry import BlockType, register


class TP(BlockType):
    """Megatron's block. tp_overlap = K: the batch in K chunks; chunk k's all-reduce is issued (not waited for) before
    chunk k+1 computes. tp_async_grad: f fused with its LayerNorm and projection, its backward all-reduce
    asynchronous (docs/overlap.md)."""
    forward_syncs, backward_syncs = 2, (2, 1)  # desynced input: only the MLP reads the synced stream through f
    overlaps = collective_matmul = True

    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        if sequence_parallel:
            return self.forward_sp(xbar, r, T, kv)
        chunks = self.chunks(xbar, r, T, kv)
        overlap = len(chunks) > 1
        fused = self.fused_f()
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
        return self.join([self.add_synced_bias(x + reduced.wait(), self.mlp.c_proj, R2)
                          for x, reduced, R2 in mlp]), None

    def forward_sp(self, x, r, T, kv):
        """Sequence parallelism: x (N/tp, C) this rank's token shard of the synced stream (simulated: all of them,
        (N, C)); LN1, LN2, the biases and the replica dropout run on it; f is an all-gather, g a reduce-scatter.
        Desynced input (r; x an SPStream): the reduce-scatter of d_i + R1 * A_i, d_i = r_i - base, onto the token
        shard, R1 applied before the reduce-scatter (it must not drop the d_i)."""
        if self.rings:  # tp_collective_matmul: the collectives as rings beside partial GEMMs
            return self.collective_matmul_block(x, T, kv), None
        a, _ = self.attn_partials(x, r, T, kv, sequence_parallel=True)
        x = self.sp_close(x if r is None else x.shard, self.reduce_scatter(a, "attn"), self.attn.c_proj, "attn",
                          masked=r is not None)
        m, _ = self.mlp_partials(x, sequence_parallel=True)
        return self.sp_close(x, self.reduce_scatter(m, "mlp"), self.mlp.c_proj, "mlp", masked=False), None


register("tp", TP)
