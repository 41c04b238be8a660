"""
'caat': partial-channel sync (CAAT-Net, arXiv 2506.19645), as its authors' Megatron fork runs it. At each of a
block's two syncs only the first k = p * n_embd channels S of the module's output are all-reduced; on the
other channels P each shard adds its own partial result, scaled by sqrt(tp), to its own stream. p is the
option `caat_sync_fraction` (default 0.5, the paper's main setting). docs/model.md has the equations, each
line mapped to the authors' code.

In the stream contract of tpcomm/model/blocks.ShardedBlock a 'caat' block leaves the stream desynced:
xbar (N, C) holds S's synced value and, on P, the value at the last full sync; r (L, N, C) each shard's
stream, r_i = xbar on S. A later 'tp' or 'spd' block sums d_i = r_i - xbar as after a 'parallel' block.
After a last 'caat' block there is no final sync (its fact private_head): each shard's ln_f and
vocabulary slice of the head read its own stream.
"""

from dataclasses import dataclass, field

from tpcomm.errors import ConfigError
from tpcomm.model.block_types.registry import BlockType, register


@dataclass(frozen=True)
class CAATOptions:
    # p: the share of each sync's channels all-reduced (the paper's main setting: 0.5); short: its name in run
    # names
    sync_fraction: float = field(default=0.5, metadata={"short": "p"})

    def check(self, *, n_embd, tp_size):
        p = self.sync_fraction
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ConfigError(f"caat_sync_fraction must be a number in (0, 1], got {p!r}")
        if abs(p * n_embd - round(p * n_embd)) > 1e-9 or round(p * n_embd) < 1:
            raise ConfigError(f"caat_sync_fraction={p!r} times n_embd ({n_embd}) must be a whole number of "
                              "channels, " f"at least 1")
        if tp_size == 1 and p != CAATOptions.sync_fraction:  # one shard: every channel is the one stream's
            raise ConfigError(f"caat_sync_fraction={p!r} needs tp_size > 1, got tp_size=1: one shard syncs "
                              "nothing, " f"so every fraction is the same model as all 'tp'")


class CAAT(BlockType):
    """Partial-channel sync, output desynced on the private channels P:
        z_i = M_i * (A_i(LN1(r_i)) + [b_A[S] / tp, b_A[P]]),  M_i = R on the synced channels S, D_i on P
        xbar[S] += sum_i (d_i[S] + z_i[S]),  r_i[S] = xbar[S];   r_i[P] += sqrt(tp) * z_i[P]   (xbar[P] kept)
    then the same for the MLP. d_i = r_i - xbar: non-zero on S only after a 'parallel' block."""
    # each sync's fan-out (a fraction), and a synced input's (whole)
    forward_syncs, backward_syncs = 2, (3, 2)
    desyncs = tp_dependent = private_head = True
    # its streams are not token-sharded; its syncs move a channel slice
    sequence_parallel = compressible = False
    fuses_f = False  # its f fans out the synced channel slice, fused with no projection
    Options = CAATOptions

    @staticmethod
    def synced_share(options):
        return options.sync_fraction

    @property
    def k(self):
        """The channels each sync all-reduces, the first k: S (CAATOptions.check: a whole number)."""
        return round(self.options.sync_fraction * self.ln_1.weight.shape[0])

    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        assert not sequence_parallel, "the validator refuses it with this block type (its facts)"
        synced = r is None
        if synced:  # fan out (f): every r_i = xbar, d_i = 0
            r, h = self.group.fan_out(xbar, lambda x: self.layer_norm(self.ln_1, x), self.sites["attn"])
        else:
            h = self.layer_norm(self.ln_1, r)
        y = self.attn.heads(h, T, self.probs_dropout(), kv)
        z = self.attn.out(y, bias=self.split_bias(self.attn.c_proj), mask=self.channel_mask(r, xbar, "attn"))
        xbar, r = self.partial_sync(xbar, r, z, "attn", in_sync=synced)
        u = self.mlp.hidden(self.layer_norm(self.ln_2, r))
        z = self.mlp.out(u, bias=self.split_bias(self.mlp.c_proj), mask=self.channel_mask(r, xbar, "mlp"))
        return self.partial_sync(xbar, r, z, "mlp", in_sync=True)  # after a caat sync the S channels agree

    def split_bias(self, linear):
        """(C,) the bias each shard adds: b[S] / tp (summed once by the sync), b[P] whole (the authors add the
        bias after their partial reduce, so every private stream gets all of it); None without biases."""
        b = linear.bias
        return None if b is None else self.cat([b[:self.k] / self.group.tp, b[self.k:]])

    def channel_mask(self, r, xbar, site):
        """(L, N, C) keep-mask, or None without dropout: the replica's mask R on the synced channels (their
        sum is dropped once, on every shard alike, as a 'tp' block drops it), each shard's own mask D_i on the
        others (as a 'parallel' block). At tp 1 both are GPT's mask."""
        D = self.shard_mask(r, site)
        if D is None:
            return None
        R = self.replica_mask(xbar, site)[:, :self.k]  # (N, k)
        return self.cat([R.unsqueeze(0).expand(D.shape[0], *R.shape), D[..., self.k:]], dim=-1)

    def partial_sync(self, xbar, r, z, site, *, in_sync):
        """(xbar, r) after adding the module outputs z (L, N, C): g of the first k channels' summands d_i +
        z_i (the all-reduce, p of a full sync's bytes), fanned back out by f (its backward all-reduce, p too:
        the authors' partial reduce all-reduces the same channels of the gradient); the other channels'
        sqrt(tp) * z_i added to each shard's own stream (the authors' ForwardScaling; times 1.0 at tp 1:
        exact, GPT's block). in_sync: the input's S channels agree (d_i[S] = 0)."""
        k = self.k
        s = z[..., :k] if in_sync else self.group.delta(r[..., :k], xbar[:, :k]) + z[..., :k]
        xs = xbar[:, :k] + self.all_reduce(s.contiguous(), site)  # (N, k), synced
        rs = self.fan_out_stream(xs, site)  # (L, N, k): each shard's copy, backward all-reduced
        zp = z[..., k:] * self.group.tp ** 0.5
        return self.cat([xs, xbar[:, k:]], dim=-1), self.cat([rs, r[..., k:] + zp], dim=-1)


register("caat", CAAT)
