"""
The shard-side layers of DistributedGPT's blocks (tensor_parallel_model.py): attention and MLP holding their
heads' and hidden units' slices, the projection that accumulates the shards' partial results, and the pieces
of the stream a ladder block carries (a pending all-reduce and its bias).
"""

from typing import NamedTuple, Optional

import torch
import torch.nn as nn
from torch.nn import functional as F

from model import causal_attention
from tpcomm.tp.collectives import AsyncReduction


def layer_norm(ln, x):
    return F.layer_norm(x, ln.weight.shape, ln.weight, ln.bias, 1e-5)


def synced_layer_norm(ln, x, group):
    bias = group.synced(ln.bias) if ln.bias is not None else None
    return F.layer_norm(x, ln.weight.shape, group.synced(ln.weight), bias, 1e-5)


def project(y, w, *, acc=None, own_acc=False, bias=None, mask=None):
    """acc + mask * (y @ w + bias), batched over shards: y (L, N, K), w (L, K, C), acc (L, N, C) or None (no
    add), bias (C,) or None, mask a dropout keep-mask or None. Without dropout or autocast the add is fused
    into the matmul, in place when acc is a temporary nothing else uses (own_acc); under autocast it is not
    fused, so a float32 residual stream stays float32."""
    if mask is None and not torch.is_autocast_enabled(y.device.type):
        out = torch.bmm(y, w) if acc is None else acc.baddbmm_(y, w) if own_acc else torch.baddbmm(acc, y, w)
        return out if bias is None else out + bias
    out = torch.bmm(y, w)
    if bias is not None:
        out = out + bias
    if mask is not None:
        out = out * mask.to(out.dtype)
    return out if acc is None else acc + out


class ShardedAttention(nn.Module):
    """Attention of the L local shards at once: heads() gives each shard's head outputs, out() projects them
    through the shard's columns of c_proj (A_i: without c_proj's bias b_A) and adds them to a stream."""

    def __init__(self, config, local):
        super().__init__()
        C, tp = config.n_embd, config.tp_size
        self.Cs, self.nh = C // tp, config.n_head // tp  # width and heads per shard
        self.c_attn = nn.Linear(C, 3 * local * self.Cs, bias=config.bias)  # rows: [q | k | v], each (L, Cs)
        self.c_proj = nn.Linear(local * self.Cs, C, bias=config.bias)  # columns sharded, bias b_A replicated

    def heads(self, h, T, drop=None, kv=None):  # h: (L, N, C), N = B*T tokens -> (L, N, Cs)
        W, b = self.qkv_weight()
        return self.attend(torch.bmm(h, W) if b is None else torch.baddbmm(b, h, W), T, drop, kv)

    def qkv_weight(self):
        """(W (L, C, 3Cs), b (L, 1, 3Cs) or None): shard i's q, k, v columns of c_attn, qkv = h @ W + b."""
        Cs, C = self.Cs, self.c_attn.weight.shape[1]
        L = self.c_attn.weight.shape[0] // (3 * Cs)
        w = self.c_attn.weight.view(3, L, Cs, C).transpose(0, 1).reshape(L, 3 * Cs, C)  # shard i: its q, k, v
        b = self.c_attn.bias
        if b is not None:
            b = b.view(3, L, 1, Cs).transpose(0, 1).reshape(L, 1, 3 * Cs)
        return w.transpose(1, 2), b

    def attend(self, qkv, T, drop=None, kv=None):  # qkv: (L, N, 3Cs) -> (L, N, Cs)
        L, N, _ = qkv.shape
        B, Cs, nh = N // T, self.Cs, self.nh
        # shards x batch as one batch dim, 4-D as GPT does, so SDPA can take its fused kernel
        q, k, v = qkv.view(L * B, T, 3, nh, Cs // nh).permute(2, 0, 3, 1, 4).unbind(0)  # (L*B, nh, T, hs)
        if kv is not None:
            k, v = kv.update(k, v)  # each shard's heads' keys/values of every token so far
        # drop: the attention probabilities' dropout (each shard its own mask)
        y = causal_attention(q, k, v, drop)
        return y.transpose(1, 2).reshape(L, N, Cs)  # each shard's heads side by side

    def out(self, y, **kw):
        """acc + mask * (A_i + bias), see project."""
        return project(y, self.proj_weight(), **kw)

    def proj_weight(self):
        """(L, Cs, C): shard i's columns of c_proj, A_i = y_i @ W_i."""
        return self.c_proj.weight.view(-1, self.c_proj.weight.shape[1] // self.Cs, self.Cs).permute(1, 2, 0)


class ShardedMLP(nn.Module):
    """MLP of the L local shards at once: hidden() gives each shard's GELU units, out() projects them through
    the shard's columns of c_proj (M_i: without c_proj's bias b_M) and adds them to a stream."""

    def __init__(self, config, local):
        super().__init__()
        C, tp = config.n_embd, config.tp_size
        self.Hs = 4 * C // tp  # hidden units per shard
        self.c_fc = nn.Linear(C, local * self.Hs, bias=config.bias)
        self.c_proj = nn.Linear(local * self.Hs, C, bias=config.bias)
        self.gelu_approximate = config.gelu_approximate

    def hidden(self, h):  # h: (L, N, C) -> (L, N, Hs)
        w, b = self.fc_weight()
        return self.gelu(torch.bmm(h, w) if b is None else torch.baddbmm(b, h, w))

    def fc_weight(self):
        """(W (L, C, Hs), b (L, 1, Hs) or None): shard i's columns of c_fc."""
        L = self.c_fc.weight.shape[0] // self.Hs
        w = self.c_fc.weight.view(L, self.Hs, -1).transpose(1, 2)  # (L, C, Hs)
        return w, None if self.c_fc.bias is None else self.c_fc.bias.view(L, 1, self.Hs)

    def gelu(self, u):
        return F.gelu(u, approximate=self.gelu_approximate)

    def out(self, u, **kw):
        """acc + mask * (M_i + bias), see project."""
        return project(u, self.proj_weight(), **kw)

    def proj_weight(self):
        """(L, Hs, C): shard i's columns of c_proj, M_i = u_i @ W_i."""
        return self.c_proj.weight.view(-1, self.c_proj.weight.shape[1] // self.Hs, self.Hs).permute(1, 2, 0)


class Reduced(NamedTuple):
    """A g waited for at once, with AsyncReduction's wait(), so one loop serves tp_overlap=1 and K > 1."""
    value: torch.Tensor

    def wait(self):
        return self.value


def join(chunks):
    """The K chunks' (n, C) outputs as the batch's (N, C)."""
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


class Pending(NamedTuple):
    """A module's output on its way to the synced stream (a ladder block's): its all-reduce, maybe still
    running, the all-reduce's result (valid once waited for) and the c_proj bias to add once after it, dropped
    with the same replica mask (None without biases). The tensors are fields of their own, so that what maps
    over a block's outputs and inputs (FSDP's backward hooks) sees them."""
    reduction: AsyncReduction
    value: torch.Tensor  # (N, C): reduction.value
    bias: Optional[torch.Tensor]  # (C,) or (N, C)

    def add_to(self, x):
        self.reduction.wait()
        x = x + self.value
        return x if self.bias is None else x + self.bias


class SPStream(NamedTuple):
    """Sequence parallelism, the stream desynced (after a 'parallel' block): this rank's token shard of the
    last synced stream (N/tp, C), and that stream gathered (L, N, C), the value every shard's r_i started from
    (rounded to bf16 under autocast, as the all-gather moves it). r_i - base is the shard's d_i, exact in
    fp32, so a sync reduce-scatters d_i, not the stream itself, and adds it to the unrounded token shard."""
    shard: torch.Tensor
    base: torch.Tensor

    def delta(self, r):
        """d_i = r_i - base: a plain difference (not group.delta's gradient shortcut): base's gradient reaches
        the token shards through the all-gather's backward, a reduce-scatter, as r_i's own does."""
        return r - self.base


def stream_parts(x, pending):
    """x plus one pending output (or None) as the parts a ColumnInput sums, (x, value, bias); a stand-in for
    Pending that is already added (a pipeline cut's) as its sum."""
    if pending is None:
        return (x,)
    if isinstance(pending, Pending):
        return (x, pending.value, pending.bias)
    return (pending.add_to(x),)


def full(parts, like):
    """The stream's parts with a broadcast one (a bias, (C,)) expanded to like's shape (N, C): a part read
    twice (by a fused projection and by the stream formed apart, or by two projections) then has its two (N,
    C) gradients summed before the sum over tokens, as when one sum of the parts is read twice (bit for bit:
    the blocking path's gradient). None parts (no bias) stay None."""
    return tuple(p if p is None or p.shape == like.shape else p.expand(like.shape) for p in parts)


def add_pending(x, pending):
    """x (N, C) plus the pending outputs (a tuple of Pending, maybe empty), in order, each waited for."""
    for p in pending:
        x = p.add_to(x)
    return x
