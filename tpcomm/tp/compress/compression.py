"""
Block-quantized tensor-parallel reductions (Communication Compression for Tensor Parallel LLM Inference, arXiv
2411.09510); docs/compression.md has the equations, the choices and the measured errors.

Each rank's partial sum s_i (N, C) is split along the hidden dimension into blocks of B values; a block b
moves as its values divided by one absmax scale, cast to the wire dtype, plus the scale (fp32):

    scale_b = max_j |s_ij| / Q  (1 for an all-zero block)      Q = 127 (int8, rounded) or 448 (fp8 e4m3)
    q_ij = cast(clamp(s_ij / scale_b, -Q, Q))                 deq(s)_ij = q_ij * scale_b
    g(s_1..s_tp) = sum_i deq(s_i), summed in shard order       'bf16': deq(s) = bf16(s), no scales

How the compressed partials move (tp_comm_exchange):
    'one_shot'  every rank all-gathers the tp packed partials and sums them: (tp-1) payloads sent per rank
    'two_shot'  reduce-scatter, then all-gather, both compressed: rank j receives row-chunk j of every partial
                (all-to-all), sums it dequantized, and all-gathers that sum quantized again, so
                g = deq(q(sum_i deq(q(s_i)))): 2 (tp-1)/tp payloads sent per rank, two quantization errors

Codec holds one setting (dtype, group): quantize / dequantize / roundtrip for the simulated sum, pack / unpack
for the bytes real mode all-gathers. All arithmetic is fp32 whatever the input dtype, and the dequantized
values come back in the input dtype, so a simulated sum (roundtrip, then sum over the shard dimension) and a
real one (pack, all-gather, unpack, sum) compute the same numbers. Their measured error:
tpcomm/bench/compression_errors.py.
"""

import math
from typing import NamedTuple

import torch

# tp_comm_dtype -> wire dtype
WIRE_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}
QMAX = {"fp8": 448.0, "int8": 127.0}  # what a scale group's absmax maps to (the scaled dtypes)
SCALE_BYTES = 4  # one fp32 scale per scale group
COMM_DTYPES = tuple(WIRE_DTYPES)
EXCHANGES = ("one_shot", "two_shot")


def validate_compression(*, tp_comm_dtype, tp_comm_block, n_embd, tp_size, sequence_parallel=False,
                         tp_comm_exchange="one_shot"):
    """Raise ConfigError naming the keys and values where compression cannot run as asked."""
    from tpcomm.errors import ConfigError

    if isinstance(tp_comm_block, bool) or not isinstance(tp_comm_block, int) or tp_comm_block < 1:
        raise ConfigError(f"tp_comm_block must be a positive int (values per scale), got {tp_comm_block!r}")
    if tp_comm_exchange not in EXCHANGES:
        raise ConfigError(f"tp_comm_exchange must be one of {list(EXCHANGES)}, got {tp_comm_exchange!r}")
    if tp_comm_dtype is None:
        if tp_comm_exchange != "one_shot":
            raise ConfigError(f"tp_comm_exchange={tp_comm_exchange!r} moves compressed partial sums: set "
                              f"tp_comm_dtype too (it is None)")
        return
    if tp_comm_dtype not in WIRE_DTYPES:
        raise ConfigError(f"tp_comm_dtype must be None or one of {list(COMM_DTYPES)}, got {tp_comm_dtype!r}")
    if n_embd % tp_comm_block:
        raise ConfigError(f"tp_comm_block ({tp_comm_block}) must divide n_embd ({n_embd}): the scales' "
                          "blocks " f"run along the hidden dimension")
    if tp_size == 1:
        raise ConfigError(f"tp_comm_dtype={tp_comm_dtype!r} needs tp_size > 1, got tp_size={tp_size}: one "
                          "shard " f"reduces nothing")
    if sequence_parallel:
        raise ConfigError(f"tp_comm_dtype={tp_comm_dtype!r} does not run with sequence_parallel=True (its "
                          f"reduce-scatters are not compressed; docs/compression.md): use one of them")


def make_codec(tp_comm_dtype, tp_comm_block, tp_comm_exchange="one_shot"):
    """The Codec for these config values, or None when compression is off."""
    return None if tp_comm_dtype is None else Codec(tp_comm_dtype, tp_comm_block, tp_comm_exchange)


class Codec(NamedTuple):
    """One compression setting: dtype in COMM_DTYPES, group values per scale (tp_comm_block: a scale
    group along the last dimension; 'block' is kept in the option's name alone, beside the transformer's
    blocks), exchange in EXCHANGES."""
    dtype: str
    group: int = 32
    exchange: str = "one_shot"

    @property
    def scaled(self):
        return self.dtype in QMAX

    def payload_bytes(self, numel):
        """Bytes one rank sends for numel values (a multiple of group): wire values
        plus one scale per group."""
        values = numel * WIRE_DTYPES[self.dtype].itemsize
        return values + numel // self.group * SCALE_BYTES if self.scaled else values

    def quantize(self, x):
        """x (..., C) -> (q (..., C) in the wire dtype, scales (..., C/group) fp32; None for bf16)."""
        if not self.scaled:
            return x.to(torch.bfloat16), None
        qmax = QMAX[self.dtype]
        xb = x.float().unflatten(-1, (-1, self.group))  # (..., C/group, group)
        absmax = xb.abs().amax(-1, keepdim=True)
        # an all-zero group gets scale 1 (its q are 0); a non-finite one a non-finite scale, so it stays
        # non-finite
        scale = torch.where(absmax == 0, torch.ones_like(absmax), absmax / qmax)
        y = (xb / scale).clamp(-qmax, qmax)
        q = (y.round() if self.dtype == "int8" else y).to(WIRE_DTYPES[self.dtype])
        return q.flatten(-2), scale.squeeze(-1)

    def dequantize(self, q, scales, dtype):
        """(q, scales) from quantize -> the values (..., C) in dtype."""
        if scales is None:
            return q.to(dtype)
        return (q.float().unflatten(-1, (-1, self.group)) * scales.unsqueeze(-1)).flatten(-2).to(dtype)

    def roundtrip(self, x):
        """What the other ranks receive of x: dequantize(quantize(x)), in x's dtype."""
        return self.dequantize(*self.quantize(x), x.dtype)

    def reduce(self, x):
        """The compressed g of the partial sums x (L, N, C) -> (N, C), all shards in one
        process: what real mode's exchange computes (one_shot: sum_i deq(q(s_i)); two_shot:
        deq(q(that)), the all-gathered sum)."""
        total = self.roundtrip(x).sum(0)
        return self.roundtrip(total) if self.exchange == "two_shot" else total

    def pack(self, x):
        """x (..., C) -> its payload, payload_bytes(x.numel()) uint8: the scales' bytes, then the values'."""
        return self.pack_each(x.unsqueeze(0))[0]

    def pack_each(self, x):
        """x (k, ..., C) -> (k, payload bytes of x[0]) uint8: each x[i]'s pack, in one pass."""
        q, scales = self.quantize(x)
        parts = [q.contiguous().view(torch.uint8).reshape(x.shape[0], -1)]
        if scales is not None:
            parts.insert(0, scales.contiguous().view(torch.uint8).reshape(x.shape[0], -1))
        return torch.cat(parts, dim=1)

    def unpack(self, payloads, shape, dtype):
        """payloads (k, payload bytes), k ranks' packs of a `shape` tensor -> their
        values (k, *shape) in dtype."""
        k, numel = payloads.shape[0], math.prod(shape)
        n_scale = numel // self.group * SCALE_BYTES if self.scaled else 0
        # .contiguous(): a fresh, aligned copy where the slice is not (a view to a wider dtype needs
        # alignment)
        q = payloads[:, n_scale:].contiguous().view(WIRE_DTYPES[self.dtype]).view(k, *shape)
        if not self.scaled:
            return self.dequantize(q, None, dtype)
        scales = payloads[:, :n_scale].contiguous().view(torch.float32).view(k, *shape[:-1], -1)
        return self.dequantize(q, scales, dtype)
