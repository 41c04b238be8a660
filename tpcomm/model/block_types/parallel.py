"""
'parallel': no communication, each shard updates its own stream, output desynced (docs/model.md):
    r_i += D_i * (A_i(LN1(r_i)) + b_A/tp);   r_i += E_i * (M_i(LN2(r_i)) + b_M/tp)
A later syncing block sums the d_i = r_i - xbar; after the last block the final sync does.
"""

from tpcomm.model.block_types.registry import BlockType, register


class Parallel(BlockType):
    """Fully parallel. tp_overlap does not apply (nothing to overlap); sequence parallel: a synced input is
    all-gathered."""
    backward_syncs = (1, 0)  # the fan-out of a synced input
    desyncs = tp_dependent = True

    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        tp, synced = self.group.tp, r is None
        r, y = self.shard_heads(xbar, r, T, kv, sequence_parallel=sequence_parallel)
        if sequence_parallel and synced:  # the token shard and the gathered stream the r_i start from
            xbar = self.sp_stream(xbar, r)
        r = self.attn.out(y, acc=r, bias=self.bias_share(self.attn.c_proj, 1 / tp),
                          mask=self.shard_mask(r, "attn"))
        u = self.mlp.hidden(self.layer_norm(self.ln_2, r))
        r = self.mlp.out(u, acc=r, bias=self.bias_share(self.mlp.c_proj, 1 / tp),
                         mask=self.shard_mask(r, "mlp"))
        return xbar, r


register("parallel", Parallel)
