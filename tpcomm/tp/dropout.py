"""
Keyed dropout: masks that depend only on a key (seed, iteration, micro-batch), the layer, the site inside the
layer, the stream and each element's index, never on which process draws them, in which order, or whether the
code runs compiled. So a resumed run, a run split over data-parallel ranks or pipeline stages, and real and
simulated tensor parallelism all draw the masks of one uninterrupted process (docs/model.md, "Dropout").

Streams: 0 is the model replica's (masks on values every tp shard shares); DistributedGPT gives tp shard i the
stream 1 + i (Megatron's separate tensor-parallel RNG). At tp_size 1 the one shard uses stream 0, so every
block type draws GPT's masks there.

The bits come from a counter-based hash of (key, salt(layer, site, stream), element index) computed with
tensor ops: no torch.Generator is built per step, so torch.compile traces it once (the key is a tensor whose
values change in place). Integer products stay below 2^63 (32-bit values times multipliers below 2^31), so
nothing overflows. Unkeyed (no key set), dropout uses torch's global RNG, as nn.Dropout.
"""

import hashlib
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

# where in a layer a mask is drawn (the embedding is layer -1, site EMBED)
ATTN_PROBS, ATTN_OUT, MLP_OUT, EMBED = 0, 1, 2, 3
M32 = 0xFFFFFFFF


def _digest(*values):
    return int.from_bytes(hashlib.blake2b(repr(values).encode(), digest_size=8).digest(), "little")


def _salt(layer, site, stream):
    """A 32-bit constant per (layer, site, stream), in plain int arithmetic (torch.compile folds it)."""
    h = 0x9E3779B9
    for v in (layer + 2, site + 1, stream + 1):
        h = ((h ^ v) * 0x01000193 + 0x7F4A7C15) & M32
        h ^= h >> 13
    return h


def _mix32(x):
    """A 32-bit integer hash (two multiply-xorshift rounds) of int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x46CA68B5) & M32
    return x ^ (x >> 16)


class DropoutKey:
    """The key of the next forward passes, shared by all of a model's dropout sites: None (unkeyed: torch's
    global RNG) or two 32-bit halves of a digest of the key, as an int64 tensor updated in place."""

    def __init__(self):
        self.tensor = None

    def set(self, key, device):
        """Key the next passes. The two halves reach the device as fill_ kernels' scalar arguments, not as a
        CPU tensor copied over: no host-to-device copy (on CUDA a pageable copy_ synchronizes the host with
        the device every micro-step), and none at all after the first call on a device."""
        if not key:
            self.tensor = None
            return
        d = _digest(*(int(k) for k in key))
        if self.tensor is None or self.tensor.device != torch.device(device):
            self.tensor = torch.empty(2, dtype=torch.int64, device=device)
        self.tensor[0].fill_(d & M32)
        self.tensor[1].fill_(d >> 32)


def _salts(layer, site, streams, device):
    """(S,) int64 on `device`: _salt(layer, site, s) for each of the consecutive streams, computed there (the
    last round of _salt in tensor ops on an arange) rather than built from a Python list (a host-to-device
    copy per mask). The first two rounds are plain ints."""
    S, first = len(streams), streams[0]
    assert tuple(streams) == tuple(range(first, first + S)), f"streams must be consecutive, got {streams}"
    h = 0x9E3779B9
    for v in (layer + 2, site + 1):
        h = ((h ^ v) * 0x01000193 + 0x7F4A7C15) & M32
        h ^= h >> 13
    s = torch.arange(first + 1, first + 1 + S, dtype=torch.int64, device=device)  # stream + 1
    s = ((s ^ h) * 0x01000193 + 0x7F4A7C15) & M32
    return s ^ (s >> 13)


def keep_mask(shape, p, key, *, layer, site, streams, device, offset=0):
    """A float32 keep-mask of `shape` scaled by 1/(1-p). The first dimension is split evenly between `streams`
    (one per tp shard), in order; each part is hashed with its own stream's salt and its own element indices.
    offset: each part's first element is element `offset` of a larger tensor's part (its element indices start
    there), so a batch chunk (tp_overlap) or a token shard (sequence_parallel) draws the whole batch's masks
    for its rows: offset = first row x the elements per row."""
    S = len(streams)
    part = (shape[0] // S, *shape[1:])
    salts = _salts(layer, site, streams, device)
    k = key.to(device)
    k0 = _mix32(k[0] ^ salts).view(S, *[1] * len(part))  # (S, 1, ...)
    i = torch.arange(math.prod(part), dtype=torch.int64, device=device).view(1, *part) + offset
    h = _mix32(_mix32((i & M32) ^ k0) ^ k[1] ^ (i >> 32))
    keep = (h >> 8) >= int(p * (1 << 24))  # 24 uniform bits against the drop probability
    return keep.to(torch.float32).div_(1.0 - p).view(shape)


def mask_or_none(like, p, key, *, training, layer, site, streams=(0,), offset=0):
    """keep_mask for a tensor like `like` (float32), torch's global RNG when unkeyed (offset then means
    nothing: chunks and token shards draw masks of their own), None when not dropping."""
    if not training or p == 0.0:
        return None
    if key.tensor is None:
        return F.dropout(torch.ones(like.shape, device=like.device), p)
    return keep_mask(like.shape, p, key.tensor, layer=layer, site=site, streams=streams, device=like.device,
                     offset=offset)


class KeyedDropout(nn.Module):
    """nn.Dropout whose mask is keyed (see the module docstring); the model's key decides,
    unkeyed it is nn.Dropout."""

    def __init__(self, p, key, *, layer, site):
        super().__init__()
        self.p, self.key, self.layer, self.site = p, key, layer, site

    def forward(self, x):
        mask = mask_or_none(x, self.p, self.key, training=self.training, layer=self.layer, site=self.site)
        return x if mask is None else x * mask.to(x.dtype)

    def extra_repr(self):
        return f"p={self.p}, layer={self.layer}, site={self.site}"
