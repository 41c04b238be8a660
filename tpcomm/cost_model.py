"""
A calibrated cost model of tensor-parallel communication: what the all-reduces of a block pattern cost, measured on
this machine and predicted for GPU clusters from published constants.

    t(n, p)  = alpha + 2(p-1)/p * n / B      one all-reduce of n bytes per rank over p ranks
    step_k   = compute + N_k * t(n, p)       pattern k with N_k blocking all-reduces per step (forward + backward)

alpha is the per-call latency and B the ring bus bandwidth: a ring all-reduce (reduce-scatter, then all-gather)
sends and receives 2(p-1)/p * n bytes per rank, so B is what nccl-tests reports as "busbw". A blocking all-reduce
sits on the critical path (Megatron's: the next matmul needs its result). Syncs that move instead of being dropped
leave part of it there: exposed = sum over modules of max(0, comm_i - efficiency * compute hiding it) (overlap:
tp_overlap chunks, ladder), a smaller comm_i (int8/fp8 compression, plus its quantize pass), or the same bytes in
two collectives (sequence parallelism). docs/cost_model.md has the equations and their checks.

$ python comm_model.py                                          # GPU predictions from published constants (< 2 s)
$ python comm_model.py --mfu=0.5 --batch_size=16 --seq_len=2048 # other assumptions
$ python comm_model.py measure --out=calibration.json           # gloo microbenchmark + bench.py under real TP (CPU)
$ python comm_model.py validate --calibration=calibration.json  # measured vs predicted ms/iter per block pattern
"""

import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from configurator import ConfigError, configure, exit_in_one_line, exit_on_config_error

from tpcomm import ROOT
BF16 = 2  # bytes per value: the GPU predictions move the residual stream in bf16 (tp_comm's autocast dtype)


class Constant(NamedTuple):
    value: float
    unit: str
    source: str


CONSTANTS = {
    "h100_bf16_flops": Constant(989e12, "FLOP/s", "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 Tensor "
                                "Core 1,979 TFLOPS with sparsity, i.e. 989 dense (model.py's PEAK_FLOPS)"),
    "h100_hbm_bw": Constant(3.35e12, "B/s", "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: HBM3, 3.35 TB/s"),
    "nvlink_bw": Constant(900e9, "B/s", "NVIDIA H100 datasheet: NVLink 4, 900 GB/s per GPU, total of both "
                          "directions (450 GB/s each way): the ceiling, not used in t(n, p)"),
    "nvlink_busbw": Constant(360e9, "B/s", "assumed: nccl-tests all_reduce_perf busbw on one 8x H100 SXM NVSwitch "
                             "node is commonly ~360-480 GB/s (e.g. 479.7 GB/s peak at 8 GiB in a published 8x H100 "
                             "SXM run, Voltage Park / Georgia Tech benchmark suite); the low end is taken for tp's "
                             "10-100 MB messages"),
    "nvlink_latency": Constant(10e-6, "s", "assumed: order of NCCL's small-message all-reduce time within one "
                               "NVSwitch node (nccl-tests, 8 B - 64 KB); measure the target system"),
    "ib_busbw": Constant(45e9, "B/s", "InfiniBand NDR 400 Gb/s = 50 GB/s per direction per port, one port per GPU "
                         "(DGX H100: 8x ConnectX-7); assumed 90% of line rate as busbw"),
    "ib_latency": Constant(20e-6, "s", "assumed: a few us of NIC and switch latency plus NCCL's network proxy, "
                           "order of nccl-tests small-message all-reduce time across nodes"),
    "mfu": Constant(0.40, "", "assumed model FLOPs utilization of the compute (PaLM appendix B definition); "
                    "--mfu overrides"),
    "llama2_70b_params": Constant(70e9, "", "Touvron et al. 2023, Llama 2: 70B parameters, 80 layers, d 8192, "
                                  "64 heads of 128, GQA with 8 KV heads"),
    "spd_paper_saving": Constant(0.20, "", "Kim et al., SPD: Sync-Point Drop (arXiv 2502.20727, ICML 2025), "
                                 "abstract: about 20% lower inference latency for LLaMA2-70B over 8 GPUs"),
    "kernel_launch": Constant(4e-6, "s", "assumed: launch and tail of one small GPU kernel; a compressed reduction "
                              "adds two (quantize, dequantize-and-sum)"),
    "domino_speedup": Constant(1.3, "", "Wang et al., Domino (arXiv 2409.15241), abstract: up to 1.3x over "
                               "Megatron-LM for LLM training on NVIDIA DGX-H100 (GPT-3 and Llama-2 models)"),
    "domino_share_low": Constant(0.17, "", "Domino (arXiv 2409.15241), introduction: tensor-parallel communication "
                                 "is 17% to 43% of end-to-end training time on DGX-H100"),
    "domino_share_high": Constant(0.43, "", "Domino (arXiv 2409.15241), introduction: the upper end of the 17-43%"),
    "ladder_speedup": Constant(1.29, "", "Zhang et al., Ladder Residual (arXiv 2501.06589, ICML 2025), abstract: "
                               "29% end-to-end inference speedup for a 70B model (LLaMA-3.1-70B shape) with TP over "
                               "8 devices (the batch-1 H100 NVLink setting is this repo's reading of the paper)"),
    "ladder_speedup_low": Constant(1.16, "", "Ladder Residual (arXiv 2501.06589): speedups across batch 1-64 at 70B, "
                                   "tp 8, H100 NVLink, about 1.16x-1.31x (the paper's per-batch results as summarised "
                                   "when this repo was planned; the table itself not re-checked)"),
    "ladder_speedup_high": Constant(1.31, "", "Ladder Residual (arXiv 2501.06589): upper end of the 1.16x-1.31x"),
}


def const(name):
    return CONSTANTS[name].value


class Link(NamedTuple):
    name: str
    alpha: float  # s per all-reduce
    busbw: float  # B/s, the B of t(n, p)


LINKS = (Link("NVLink 4 (intra-node)", const("nvlink_latency"), const("nvlink_busbw")),
         Link("IB NDR (inter-node)", const("ib_latency"), const("ib_busbw")))


class Shape(NamedTuple):
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab: int = 50304  # GPT-2's vocabulary padded to a multiple of 64 (nanoGPT), tied to lm_head

    @property
    def params(self):
        """12 L d^2 (attention 4d^2 + MLP 8d^2 per layer) plus the tied embedding; biases and norms left out."""
        return 12 * self.n_layer * self.n_embd ** 2 + self.vocab * self.n_embd


SHAPES = (Shape("GPT-2 124M", 12, 768, 12),  # Radford et al. 2019
          Shape("1.3B (24 x 2048)", 24, 2048, 16),  # GPT-3 XL's layers and width (Brown et al. 2020), 128-wide heads
          Shape("7B (32 x 4096)", 32, 4096, 32))  # LLaMA-7B's layers, width and heads (Touvron et al. 2023)

# the block patterns of the GPU tables, per layer count L (docs/model.md: 2 fwd all-reduces per 'tp', 1 per 'spd')
GPU_PATTERNS = {"all tp": lambda L: ["tp"] * L, "all spd": lambda L: ["spd"] * L,
                "parallel/spd": lambda L: ["parallel", "spd"] * (L // 2), "all parallel": lambda L: ["parallel"] * L}


# ---------- the model ----------

def ring_bytes(nbytes, p):
    """Bytes each rank sends (and receives) in a ring all-reduce: (p-1)/p of n in reduce-scatter, again in
    all-gather."""
    return 2 * (p - 1) / p * nbytes


def allreduce_time(nbytes, p, *, alpha, busbw):
    """Seconds for one all-reduce of nbytes per rank over p ranks; 0 at p = 1 (tp_comm skips one-rank
    collectives)."""
    return 0.0 if p == 1 else alpha + ring_bytes(nbytes, p) / busbw


def forward_syncs(block_types):
    """Forward all-reduces of a pattern, a list with one block type per layer (docs/model.md): 2 per 'tp', 1 per
    'spd', 1 more before ln_f when the last block leaves the stream desynced. Backward runs as many again."""
    return 2 * block_types.count("tp") + block_types.count("spd") + (block_types[-1] == "parallel")


def fit_line(xs, ys, *, weights=None):
    """Weighted least squares y = a + b x: (a, b). ValueError when the xs cannot determine a slope."""
    w = weights or [1.0] * len(xs)
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError(f"a line needs two distinct x values, got {list(xs)}")
    sw = sum(w)
    xm = sum(wi * x for wi, x in zip(w, xs)) / sw
    ym = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - xm) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - xm) * (y - ym) for wi, x, y in zip(w, xs, ys)) / sxx
    return ym - b * xm, b


def fit_allreduce(samples, p):
    """(alpha, B) from (bytes, seconds) samples of p-rank all-reduces. Least squares of the relative error, weights
    1/t^2: the times span several decades, and plain least squares would fit the largest messages only."""
    nbytes, seconds = [s[0] for s in samples], [s[1] for s in samples]
    alpha, slope = fit_line([ring_bytes(n, p) for n in nbytes], seconds, weights=[1 / t ** 2 for t in seconds])
    if slope <= 0:
        raise ValueError(f"the all-reduce times do not grow with the size (slope {slope:.3g} s/B)")
    return alpha, 1 / slope


def fit_plane(xs, zs, ys):
    """Least squares y = a + b x - h z: (a, b, h). ValueError when the points cannot determine the three (fewer
    than three, or x and z collinear over them)."""
    rows = [(1.0, x, -z) for x, z in zip(xs, zs)]
    A = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]  # normal equations A p = v
    v = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    scale = max(abs(a) for row in A for a in row) or 1.0
    for col in range(3):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, 3), key=lambda r: abs(A[r][col]))
        if abs(A[pivot][col]) < 1e-9 * scale:
            raise ValueError(f"a plane needs x and z varying independently, got x {list(xs)}, z {list(zs)}")
        A[col], A[pivot], v[col], v[pivot] = A[pivot], A[col], v[pivot], v[col]
        for r in range(col + 1, 3):
            f = A[r][col] / A[col][col]
            A[r] = [a - f * b for a, b in zip(A[r], A[col])]
            v[r] -= f * v[col]
    out = [0.0] * 3
    for r in (2, 1, 0):
        out[r] = (v[r] - sum(A[r][c] * out[c] for c in range(r + 1, 3))) / A[r][r]
    return tuple(out)


def fit_step(xs, ys, zs=None):
    """(C, t, h) of ms/iter = C + N t - N_ovl h: the plane when some of the points overlap all-reduces (zs), else
    the line with h = 0 (nothing known to be hidden: a pattern that overlaps is predicted as if it did not)."""
    if zs is not None and any(zs):
        try:
            return fit_plane(xs, zs, ys)
        except ValueError:
            pass
    return (*fit_line(xs, ys), 0.0)


def leave_one_out(xs, ys, *, zs=None):
    """For each point, the fit on all the others (fit_step: line, or plane with zs, the overlapped counts)
    evaluated at it; None where the others cannot determine a line."""
    zs = [0] * len(xs) if zs is None else zs
    out = []
    for i in range(len(xs)):
        others = [j for j in range(len(xs)) if j != i]
        try:
            a, b, h = fit_step([xs[j] for j in others], [ys[j] for j in others], [zs[j] for j in others])
            out.append(a + b * xs[i] - h * zs[i])
        except ValueError:
            out.append(None)
    return out


def train_step(shape, *, tp, link, tokens, seq_len, mfu, fwd_syncs, peak=None):
    """(compute s, communication s) of one training micro-step of `tokens` tokens on a tp group: compute is
    (6 N + 12 L d T) FLOPs per token (PaLM appendix B, as model.estimate_mfu) over tp GPUs at mfu of their peak;
    communication is 2 * fwd_syncs all-reduces (backward runs as many as forward) of tokens * d bf16 values."""
    peak = const("h100_bf16_flops") if peak is None else peak
    flops = (6 * shape.params + 12 * shape.n_layer * shape.n_embd * seq_len) * tokens
    nbytes = tokens * shape.n_embd * BF16
    return flops / (tp * peak * mfu), 2 * fwd_syncs * allreduce_time(nbytes, tp, alpha=link.alpha,
                                                                     busbw=link.busbw)


def decode_token(*, params, n_layer, n_embd, n_kv_heads, head_dim, context, batch, tp, link, syncs, hbm_bw=None):
    """(memory s, communication s) of one decode step: every GPU reads its 1/tp of the bf16 weights and its KV
    heads' cache from HBM at the datasheet bandwidth (FLOPs ignored: memory-bound at small batch), then `syncs`
    all-reduces of batch * d bf16 values. KV heads are replicated when tp exceeds them."""
    hbm_bw = const("h100_hbm_bw") if hbm_bw is None else hbm_bw
    weights = params * BF16 / tp
    kv = 2 * n_layer * n_kv_heads * head_dim * context * batch * BF16 / min(tp, n_kv_heads)
    comm = syncs * allreduce_time(batch * n_embd * BF16, tp, alpha=link.alpha, busbw=link.busbw)
    return (weights + kv) / hbm_bw, comm


# ---------- moving syncs instead of dropping them: hide, delay, shrink (docs/cost_model.md) ----------

def exposed(comms, hiders, *, efficiency=1.0):
    """Seconds of communication left on the critical path: sum of max(0, comms[i] - efficiency * hiders[i]),
    hiders[i] the compute that runs while comms[i] is in flight (0: a blocking collective). efficiency is the share
    of that compute that really hides communication (1: ideal; NCCL's kernels also take SMs and memory bandwidth)."""
    assert len(comms) == len(hiders)
    return sum(max(0.0, m - efficiency * c) for m, c in zip(comms, hiders))


def chunked_exposed(compute, nbytes, p, *, chunks, alpha, busbw, efficiency=1.0):
    """Exposed communication of one module run in K chunks (tp_overlap=K, Domino-style): each chunk's all-reduce
    of nbytes / K runs while the next chunk computes compute / K; the last chunk's is exposed. K times the latency,
    1/K the bytes each. Equals the two-stage pipeline's makespan minus the compute."""
    m = allreduce_time(nbytes / chunks, p, alpha=alpha, busbw=busbw)
    return exposed([m] * chunks, [compute / chunks] * (chunks - 1) + [0.0], efficiency=efficiency)


def ladder_exposed(comms, computes, *, efficiency=1.0):
    """Exposed communication of a run of ladder modules: module i's all-reduce runs while module i+1 computes;
    the run's last module has nothing after it to hide behind (the next block or ln_f needs the stream)."""
    return exposed(comms, list(computes[1:]) + [0.0], efficiency=efficiency)


def sp_time(nbytes, p, *, alpha, busbw):
    """Sequence parallelism replaces one all-reduce by a reduce-scatter and an all-gather: (p-1)/p * n bytes per
    rank each, 2(p-1)/p * n together, the ring all-reduce's bytes; two collectives, so twice the latency."""
    return 0.0 if p == 1 else 2 * alpha + ring_bytes(nbytes, p) / busbw


def activation_bytes(*, seq, batch, d, heads, tp, sp):
    """Activation bytes of one transformer layer per GPU, 16-bit activations and no recomputation (Korthikanti et
    al., arXiv 2205.05198, section 4): s b h (10 + 24/t + 5 a s / (h t)) under tp; sequence parallelism splits the
    LayerNorm and dropout regions' 10 s b h over the t ranks too: s b h (34/t + 5 a s / (h t))."""
    sbh, attn = seq * batch * d, 5 * heads * seq / (d * tp)
    return sbh * ((34 / tp + attn) if sp else (10 + 24 / tp + attn))


class Compression(NamedTuple):
    bits: int = 8  # per value on the wire (int8 or fp8)
    block: int = 32  # values per absmax scale (tp_comm_block)
    scale_bytes: int = 4  # one fp32 scale per block
    exchange: str = "allgather"  # 'allgather': what the repo implements; 'ring': compressed ring (not implemented)


INT8 = Compression()


def compressed_bytes(values, comp=INT8):
    """Bytes of `values` block-quantized: bits/8 per value plus one scale per block (int8, fp32 scale per 32
    values: 1 + 4/32 = 1.125 B per value against 2 for bf16)."""
    return values * comp.bits / 8 + math.ceil(values / comp.block) * comp.scale_bytes


def compressed_reduce_time(values, p, *, alpha, busbw, hbm_bw, launch, comp=INT8, value_bytes=BF16):
    """Seconds for one reduction of `values` partial sums compressed. 'allgather' (the repo's): every rank
    all-gathers the p compressed partials, (p-1) n_c bytes received per rank, and sums them locally; 'ring': the
    ring all-reduce's 2(p-1)/p of n_c (ideal: each reduce step would requantize). Plus the quantize pass (read n,
    write n_c) and the dequantize-and-sum pass (read the p or 2 partials, write n) at HBM bandwidth, two kernels."""
    if p == 1:
        return 0.0
    nc = compressed_bytes(values, comp)
    if comp.exchange == "allgather":
        wire, read = (p - 1) * nc, p * nc
    elif comp.exchange == "ring":
        wire, read = ring_bytes(nc, p), 2 * nc
    else:
        raise ValueError(f"exchange must be 'allgather' or 'ring', got {comp.exchange!r}")
    passes = (values * value_bytes + nc + read + values * value_bytes) / hbm_bw + 2 * launch
    return alpha + wire / busbw + passes


def overlapped_syncs(block_types):
    """Forward all-reduces of a pattern that run while other compute does: each run of k consecutive 'ladder'
    blocks overlaps 2k-1 of its 2k (docs/model.md); backward stays synchronous. 'tp' etc.: 0."""
    out, run = 0, 0
    for kind in list(block_types) + [None]:
        if kind == "ladder":
            run += 1
        elif run:
            out, run = out + 2 * run - 1, 0
    return out


def module_flops(shape, seq_len):
    """Forward FLOPs per token of one attention module (8 d^2 + 4 d T: projections, scores and values), one MLP
    module (16 d^2), and the whole step's rest (embedding and lm_head, forward + backward: 6 V d). Backward is twice
    forward, so L (3 attn + 3 mlp) + rest is train_step's 6 N + 12 L d T."""
    d = shape.n_embd
    return 8 * d * d + 4 * d * seq_len, 16 * d * d, 6 * shape.vocab * d


class Options(NamedTuple):
    """How the syncs move, for the GPU tables: tp_overlap chunks, overlap efficiency, compression."""
    chunks: int = 2
    efficiency: float = 1.0
    comp: Compression = INT8
    launch: float = const("kernel_launch")  # s per extra kernel (quantize, dequantize-and-sum)
    hbm_bw: float = const("h100_hbm_bw")


def train_variants(shape, *, tp, link, tokens, seq_len, mfu, opts=Options(), peak=None):
    """{variant: (compute s, exposed communication s)} of one training micro-step: blocking all 'tp'; with
    sequence parallelism; tp_overlap=K on every module forward and backward (Domino-style); all 'ladder' as the repo
    runs it (forward all-reduces delayed, backward blocking); int8-compressed forward reductions (backward ones stay
    bf16 all-reduces); dropped: all 'spd' and ['parallel','spd']*(L/2)."""
    peak = const("h100_bf16_flops") if peak is None else peak
    L, n = shape.n_layer, tokens * shape.n_embd * BF16
    per_flop = tokens / (tp * peak * mfu)
    attn, mlp, rest = module_flops(shape, seq_len)
    fwd = [attn * per_flop, mlp * per_flop] * L  # the 2L modules in order
    compute = 3 * sum(fwd) + rest * per_flop  # forward + backward (twice forward) + embedding and lm_head
    t = allreduce_time(n, tp, alpha=link.alpha, busbw=link.busbw)
    kw = dict(alpha=link.alpha, busbw=link.busbw, efficiency=opts.efficiency)
    overlap = sum(chunked_exposed(c, n, tp, chunks=opts.chunks, **kw)
                  + chunked_exposed(2 * c, n, tp, chunks=opts.chunks, **kw) for c in fwd)
    squeezed = compressed_reduce_time(tokens * shape.n_embd, tp, alpha=link.alpha, busbw=link.busbw,
                                      hbm_bw=opts.hbm_bw, launch=opts.launch, comp=opts.comp)
    comm = {"blocking": 4 * L * t, "+sp": 4 * L * sp_time(n, tp, alpha=link.alpha, busbw=link.busbw),
            f"overlap K={opts.chunks}": overlap,
            "ladder": ladder_exposed([t] * 2 * L, fwd, efficiency=opts.efficiency) + 2 * L * t,
            "int8": 2 * L * (squeezed + t),
            "all spd": 2 * forward_syncs(["spd"] * L) * t,
            "parallel/spd": 2 * forward_syncs(["parallel", "spd"] * (L // 2)) * t}
    return {k: (compute, v) for k, v in comm.items()}


class DecodeShape(NamedTuple):
    """A decoder for per-token latency; LLaMA-style (GQA, SwiGLU MLP of 3 d ffn weights)."""
    name: str
    params: float
    n_layer: int
    n_embd: int
    n_kv_heads: int
    head_dim: int
    ffn: int


LLAMA_70B = DecodeShape("LLaMA2-70B", const("llama2_70b_params"), 80, 8192, 8, 128, 28672)


def decode_modules(shape, *, context, batch, tp, hbm_bw):
    """Seconds one GPU reads HBM per decode step: (one attention module: q, o, k, v weights/tp and its KV heads'
    cache; one MLP module: 3 d ffn weights/tp; the rest of the parameters/tp: embedding, lm_head, norms)."""
    d = shape.n_embd
    attn_w = 2 * d * d + 2 * d * shape.n_kv_heads * shape.head_dim
    kv = 2 * shape.n_kv_heads * shape.head_dim * context * batch * BF16 / min(tp, shape.n_kv_heads)
    rest = shape.params - shape.n_layer * (attn_w + 3 * d * shape.ffn)
    return (attn_w * BF16 / tp + kv) / hbm_bw, 3 * d * shape.ffn * BF16 / tp / hbm_bw, rest * BF16 / tp / hbm_bw


def decode_variants(shape, *, context, batch, tp, link, opts=Options()):
    """{variant: (memory s, exposed communication s)} of one decode step: memory-bound modules (weights/tp and the
    KV cache read at HBM bandwidth; attention's module holds q, o, k, v and the cache, the MLP its 3 d ffn weights,
    the rest embedding and lm_head) and batch x d bf16 all-reduces: blocking all 'tp', all 'ladder', int8
    (all-gather, the repo's; ring), all 'spd'. tp_overlap is left out: a chunk re-reads the weights."""
    L, d = shape.n_layer, shape.n_embd
    attn, mlp, rest = decode_modules(shape, context=context, batch=batch, tp=tp, hbm_bw=opts.hbm_bw)
    memory = L * (attn + mlp) + rest
    t = allreduce_time(batch * d * BF16, tp, alpha=link.alpha, busbw=link.busbw)
    squeezed = {e: compressed_reduce_time(batch * d, tp, alpha=link.alpha, busbw=link.busbw, hbm_bw=opts.hbm_bw,
                                          launch=opts.launch, comp=opts.comp._replace(exchange=e))
                for e in ("allgather", "ring")}
    comm = {"blocking": 2 * L * t,
            "ladder": ladder_exposed([t] * 2 * L, [attn, mlp] * L, efficiency=opts.efficiency),
            "int8": 2 * L * squeezed["allgather"], "int8 ring": 2 * L * squeezed["ring"], "all spd": L * t}
    return {k: (memory, v) for k, v in comm.items()}


# ---------- python comm_model.py: GPU predictions ----------

PREDICT_DEFAULTS = {
    "mfu": const("mfu"),
    "batch_size": 8,  # sequences per micro-batch of one tp group
    "seq_len": 1024,  # tokens per sequence (attention FLOPs)
    "decode_batch": 1,  # LLaMA2-70B decode: sequences decoded together
    "decode_context": 1024,  # LLaMA2-70B decode: tokens in the KV cache
    "tp_overlap": 2,  # K: batch chunks per module of the overlapped (Domino-style) column
    "efficiency": 1.0,  # share of the concurrent compute that hides communication (1: ideal)
}

# Domino's models as checked below (Brown et al. 2020, table 2.1: layers x d_model, 128-wide heads at 6.7B, 13B)
GPT3_SHAPES = (Shape("GPT-3 2.7B", 32, 2560, 32), Shape("GPT-3 6.7B", 32, 4096, 32), Shape("GPT-3 13B", 40, 5120, 40))


def predict(cfg):
    """The checks against published figures, then the GPU tables: training step time per model shape, tp and
    network and LLaMA2-70B decode latency, with blocking, overlapped, delayed, shrunk and dropped syncs; sequence
    parallelism's activation memory; every constant with its source."""
    for key in ("batch_size", "seq_len", "decode_batch", "decode_context", "tp_overlap"):
        if type(cfg[key]) is not int or cfg[key] < 1:
            raise ConfigError(f"{key} must be an int >= 1, got {cfg[key]!r}")
    for key in ("mfu", "efficiency"):
        if not 0 < cfg[key] <= 1:
            raise ConfigError(f"{key} must be a fraction in (0, 1], got {cfg[key]!r}")
    opts = options(cfg)
    print_published(cfg, opts)
    print_training(cfg, opts)
    print_decode(cfg, opts)
    print_memory(cfg)
    print("\nConstants:")
    for name, c in CONSTANTS.items():
        print(f"- `{name}` = {c.value:g}{' ' + c.unit if c.unit else ''}: {c.source}")


def options(cfg):
    """The GPU tables' Options from predict's config and the named constants."""
    return Options(chunks=cfg["tp_overlap"], efficiency=cfg["efficiency"])


def speedup(variants, name):
    return sum(variants["blocking"]) / sum(variants[name])


def published_checks(cfg, opts):
    """The model's numbers beside the published ones (NVLink, H100): Domino's TP share of a training step and its
    speedup over Megatron-LM on GPT-3 shapes at tp 8 (seq 2048, micro-batch 4, 8, 16: assumed), and Ladder
    Residual's decode speedup on the 70B shape at tp 8, batch 1 and over batch 1-64. [(what, published, model)]."""
    nvlink = LINKS[0]
    runs = [train_variants(s, tp=8, link=nvlink, tokens=b * 2048, seq_len=2048, mfu=cfg["mfu"], opts=opts)
            for s in GPT3_SHAPES for b in (4, 8, 16)]
    share = [v["blocking"][1] / sum(v["blocking"]) for v in runs]
    domino = max(speedup(v, f"overlap K={opts.chunks}") for v in runs)
    bound = max(sum(v["blocking"]) / v["blocking"][0] for v in runs)
    ladder = [speedup(decode_variants(LLAMA_70B, context=cfg["decode_context"], batch=b, tp=8, link=nvlink,
                                      opts=opts), "ladder") for b in (1, 4, 16, 64)]
    return [("Domino: TP communication share of a training step (range)",
             (const("domino_share_low"), const("domino_share_high")), (min(share), max(share))),
            (f"Domino: best speedup over blocking (model: tp_overlap={opts.chunks} per module)",
             const("domino_speedup"), domino),
            ("Domino: best speedup if all TP communication were hidden (the bound)", const("domino_speedup"), bound),
            ("Ladder Residual: 70B decode speedup, tp 8, batch 1", const("ladder_speedup"), ladder[0]),
            ("Ladder Residual: 70B decode speedup over batch 1-64 (range)",
             (const("ladder_speedup_low"), const("ladder_speedup_high")), (min(ladder), max(ladder)))]


def print_published(cfg, opts):
    print("## Checked against published figures (H100 SXM, NVLink, tp 8), before any new prediction\n")
    print(f"Domino: GPT-3 2.7B, 6.7B and 13B shapes, sequence 2048, micro-batch 4, 8 and 16, MFU {cfg['mfu']:.0%}; "
          f"Ladder: the 70B decode shape below, context {cfg['decode_context']}, batch 1, 4, 16, 64. Overlap "
          f"efficiency {opts.efficiency:g}. A range's error is given at each end.\n")
    print("| figure | published | model | error |")
    print("|---|---:|---:|---:|")
    for what, published, model in published_checks(cfg, opts):
        one = "{:.0%}" if min(published if isinstance(published, tuple) else [published]) < 1 else "{:.2f}x"
        if isinstance(published, tuple):
            shown_p, shown_m = (" - ".join(one.format(x) for x in pair) for pair in (published, model))
            err = ", ".join(f"{end} {error(m, p):+.1f}%" for end, m, p in zip(("low", "high"), model, published))
        else:
            shown_p, shown_m, err = one.format(published), one.format(model), f"{error(model, published):+.1f}%"
        print(f"| {what} | {shown_p} | {shown_m} | {err} |")


TRAIN_COLUMNS = ("+sp", "overlap", "ladder", "int8", "all spd", "parallel/spd")


def print_training(cfg, opts):
    """Training step per shape, tp and network: blocking all 'tp', then the speedup of each other variant."""
    tokens = cfg["batch_size"] * cfg["seq_len"]
    K = opts.chunks
    print(f"\n## Training step, H100 SXM bf16, MFU {cfg['mfu']:.0%}, micro-batch {cfg['batch_size']} x "
          f"{cfg['seq_len']} = {tokens:,} tokens per tp group\n")
    print("Blocking: compute + 4L all-reduces t(tokens x d x 2 B, tp) (all 'tp'). Speedup = blocking step / the "
          f"variant's step. +sp: sequence parallelism (RS + AG, same bytes, twice the latency). overlap: "
          f"tp_overlap={K} on every module, forward and backward (Domino-style; chunk k's all-reduce hides behind "
          "chunk k+1's compute, the last chunk's exposed). ladder: all 'ladder' as the repo runs it (forward "
          "all-reduce of module i hides behind module i+1, backward blocking). int8: forward reductions "
          "block-quantized (1.125 B per value, all-gather exchange, the repo's), backward bf16. all spd: L "
          "forward syncs; parallel/spd: L/2.\n")
    print("| model | params | tp | network | compute ms | blocking step ms | comm share | "
          + " | ".join(c if c != "overlap" else f"overlap K={K}" for c in TRAIN_COLUMNS) + " |")
    print("|---|---:|---:|---|---:|---:|---:|" + "---:|" * len(TRAIN_COLUMNS))
    skipped = []
    for shape in SHAPES:
        for tp in (2, 4, 8):
            if shape.n_head % tp:
                skipped.append(f"{shape.name} at tp {tp} ({shape.n_head} heads)")
                continue
            for link in LINKS:
                v = train_variants(shape, tp=tp, link=link, tokens=tokens, seq_len=cfg["seq_len"], mfu=cfg["mfu"],
                                   opts=opts)
                compute, comm = v["blocking"]
                names = [c if c != "overlap" else f"overlap K={K}" for c in TRAIN_COLUMNS]
                print(f"| {shape.name} | {shape.params / 1e6:,.0f}M | {tp} | {link.name} | {compute * 1e3:.2f} | "
                      f"{(compute + comm) * 1e3:.2f} | {comm / (compute + comm):.1%} | "
                      + " | ".join(f"{speedup(v, n):.2f}x" for n in names) + " |")
    if skipped:
        print(f"\nNot shown: {', '.join(skipped)}: tp must divide the heads.")


def print_decode(cfg, opts):
    """Per-token decode latency of the LLaMA2-70B shape at tp 8: each variant's ms/token and speedup."""
    tp, batch = 8, cfg["decode_batch"]
    names = ("blocking", "ladder", "int8", "int8 ring", "all spd")
    print(f"\n## Decode, LLaMA2-70B shape (80 layers, d 8192, GQA 8 KV heads, MLP 3 x d x 28672, 70B params), tp {tp}, "
          f"batch {batch}, context {cfg['decode_context']}, bf16\n")
    print("Per token: each module's weights/tp (attention: also its KV cache) read from HBM at the datasheet "
          f"bandwidth, then its all-reduce of batch x d x 2 B = {batch * LLAMA_70B.n_embd * BF16:,} B. blocking: all "
          "'tp', 160 all-reduces; ladder: each hides behind the next module's reads; int8: all-gather exchange (the "
          "repo's), int8 ring: compressed ring (not implemented, for comparison); all spd: 80 all-reduces. "
          "tp_overlap is left out: at decode a chunk re-reads the weights.")
    attn, mlp, _ = decode_modules(LLAMA_70B, context=cfg["decode_context"], batch=batch, tp=tp, hbm_bw=opts.hbm_bw)
    print(f"Reads per GPU: {attn * 1e6:.1f} us per attention module, {mlp * 1e6:.1f} us per MLP module.\n")
    print("| network | HBM reads ms | one all-reduce us | " + " | ".join(f"{n} ms/token" for n in names)
          + " | " + " | ".join(f"speedup: {n}" for n in names[1:]) + " |")
    print("|---|---:|---:|" + "---:|" * (2 * len(names) - 1))
    for link in LINKS:
        v = decode_variants(LLAMA_70B, context=cfg["decode_context"], batch=batch, tp=tp, link=link, opts=opts)
        memory, comm = v["blocking"]
        print(f"| {link.name} | {memory * 1e3:.2f} | {comm / 160 * 1e6:.1f} | "
              + " | ".join(f"{sum(v[n]) * 1e3:.2f}" for n in names) + " | "
              + " | ".join(f"{speedup(v, n):.2f}x" for n in names[1:]) + " |")
    target = const("spd_paper_saving")
    # saving = L t / (memory + 2 L t) = target  =>  t = target * memory / (L (1 - 2 target))
    needed = target * memory / (80 * (1 - 2 * target))
    print(f"\nThe SPD paper reports about {target:.0%} lower latency for LLaMA2-70B on 8 GPUs; this model gives "
          f"{target:.0%} when one all-reduce costs {needed * 1e6:.1f} us. HBM read at the datasheet rate makes the "
          "memory time a lower bound, so each saving above is an upper bound for its all-reduce time.")


def print_memory(cfg):
    """Activation memory per layer with and without sequence parallelism, at the training table's micro-batch."""
    s, b = cfg["seq_len"], cfg["batch_size"]
    print(f"\n## Activation memory per layer and GPU, sequence {s}, micro-batch {b}, 16-bit, no recomputation\n")
    print("tp: s b h (10 + 24/t + 5 a s / (h t)) bytes; with sequence parallelism s b h (34/t + 5 a s / (h t)): "
          "the LayerNorm and dropout regions' 10 s b h split over the t ranks too (arXiv 2205.05198, section 4).\n")
    print("| model | tp | tp MiB | tp + sp MiB | saved |")
    print("|---|---:|---:|---:|---:|")
    for shape in SHAPES:
        for tp in (2, 8):
            if shape.n_head % tp:
                continue
            a, b_sp = (activation_bytes(seq=s, batch=b, d=shape.n_embd, heads=shape.n_head, tp=tp, sp=sp)
                       for sp in (False, True))
            print(f"| {shape.name} | {tp} | {a / 2 ** 20:,.0f} | {b_sp / 2 ** 20:,.0f} | {1 - b_sp / a:.0%} |")


# ---------- python comm_model.py measure: this machine ----------

MEASURE_DEFAULTS = {
    "out": None,  # the calibration JSON to write
    "procs": 2,  # gloo processes: the microbenchmark's ranks and bench.py's tp_size
    "sizes": None,  # all-reduce sizes in bytes; None: 1 KiB .. 64 MiB in powers of 4
    "reps": 10,  # timed all-reduces per size (median taken)
    "iters": 30,  # bench.py --iters (timed steps per pattern, over 3 interleaved rounds)
    "warmup": 5,  # bench.py --warmup (untimed steps per pattern and round)
    "patterns": None,  # bench.py --patterns; None: the 12-layer patterns of the CPU sweep (experiment.py cpu)
    # the model bench.py times: README's real-TP command
    "n_layer": 12, "n_head": 8, "n_embd": 128, "block_size": 64, "batch_size": 12, "vocab_size": 65,
}


class MeasureError(RuntimeError):
    """A measurement that failed (a benchmark process died, bench.py printed no row): one line, exit status 1."""


BENCH_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "vocab_size", "iters", "warmup")


def measure(cfg):
    import bench
    from tensor_parallel_model import validate_tp_args

    out = cfg["out"]
    if not isinstance(out, str) or not out:
        raise ConfigError(f"out must be the calibration file to write (--out=FILE.json), got {out!r}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise ConfigError(f"out: directory {os.path.dirname(os.path.abspath(out))!r} does not exist")
    for key, least in (("procs", 2), ("reps", 1)):
        if type(cfg[key]) is not int or cfg[key] < least:
            raise ConfigError(f"{key} must be an int >= {least}, got {cfg[key]!r}")
    bench.validate(dict(bench.DEFAULTS, **{k: cfg[k] for k in BENCH_KEYS}))  # before minutes of measuring
    sizes = cfg["sizes"] if cfg["sizes"] is not None else [1024 * 4 ** k for k in range(9)]
    if not isinstance(sizes, list) or not sizes or any(type(n) is not int or n < 4 or n % 4 for n in sizes):
        raise ConfigError(f"sizes must be a non-empty list of byte counts, multiples of 4 (float32), got {sizes!r}")
    patterns = cfg["patterns"] if cfg["patterns"] is not None else cpu_sweep_patterns()
    if not isinstance(patterns, list) or not patterns:
        raise ConfigError(f"patterns must be a non-empty list of block_types values, got {patterns!r}")
    for i, p in enumerate(patterns):
        try:
            validate_tp_args(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                             tp_size=cfg["procs"], block_types=p)
        except ConfigError as e:
            raise ConfigError(f"patterns[{i}] = {shown(p)}: {e}") from None
    record = {"format": "comm_model calibration 1", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "argv": sys.argv, "machine": machine()}
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores: other work on the machine inflates "
          "every time below")
    print(f"all-reduce microbenchmark: gloo, {cfg['procs']} processes, float32, {len(sizes)} sizes x "
          f"{cfg['reps']} repetitions")
    samples = microbenchmark(procs=cfg["procs"], sizes=sizes, reps=cfg["reps"])
    for s in samples:
        print(f"  {s['bytes']:>10,} B  {s['seconds'] * 1e3:9.3f} ms")
    fit = {"method": "least squares of the relative error of t = alpha + 2(p-1)/p * n / B"}
    try:
        fit["alpha_s"], fit["bus_bw_Bps"] = fit_allreduce([(s["bytes"], s["seconds"]) for s in samples], cfg["procs"])
        print(f"  fit: alpha = {fit['alpha_s'] * 1e6:.1f} us, B = {fit['bus_bw_Bps'] / 1e9:.3f} GB/s")
    except ValueError as e:  # noise swamped the sizes: keep the samples (and go on), validate will refuse them
        fit["error"] = str(e)
        print(f"  fit failed: {e}; add larger --sizes")
    record["microbenchmark"] = {
        "backend": "gloo", "procs": cfg["procs"], "dtype": "float32", "reps": cfg["reps"], "threads_per_process": 1,
        "statistic": "median over repetitions of the slowest rank's time; each repetition starts after a barrier",
        "samples": samples, "loadavg_after": loadavg(), "fit": fit}
    record["training"] = training(cfg, patterns)
    record["machine"]["loadavg_after"] = loadavg()
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, out)
    print(f"wrote {out}; next: python comm_model.py validate --calibration={out}")


def shown(pattern):
    """A block_types value as a short expression that configure() reads back: 'spd', ['parallel','spd']*6."""
    from tpcomm.results import compact_list

    return repr(pattern) if isinstance(pattern, str) else compact_list(pattern)


def cpu_sweep_patterns():
    """The block_types of the CPU sweep's budget configs (experiment.py's 'cpu' runs, 24 down to 1 forward syncs;
    not its delayed or compressed variants of them)."""
    from tpcomm.sweep import SWEEPS
    from train import DEFAULTS

    return [configure(DEFAULTS, [os.path.join(ROOT, run.config)])["block_types"] for run in SWEEPS["cpu"]
            if not run.overrides]


def machine():
    """What the timings depend on: CPU, cores, torch, and the load on the machine when they started."""
    import torch

    cpu = platform.processor()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "loadavg_before": loadavg()}


def loadavg():
    """The machine's load average over 1, 5 and 15 minutes: other work there slows every timing."""
    return [round(x, 2) for x in os.getloadavg()]


def microbenchmark(*, procs, sizes, reps):
    """[{bytes, seconds, all_seconds}]: gloo all-reduces of each size among `procs` spawned processes."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "samples.json")
        try:
            mp.spawn(_allreduce_worker, args=(procs, sizes, reps, os.path.join(d, "store"), out), nprocs=procs)
        except ProcessException as e:  # a worker raised or died: its traceback's last line
            raise MeasureError(f"all-reduce microbenchmark failed: {str(e).strip().splitlines()[-1]}") from None
        with open(out) as f:
            return json.load(f)


def _allreduce_worker(rank, procs, sizes, reps, store, out):
    import torch
    import torch.distributed as dist
    from tqdm import tqdm

    torch.set_num_threads(1)  # as bench.py under OMP_NUM_THREADS=1
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=procs)
    try:
        samples = []
        for n in tqdm(sizes, desc="all-reduce sizes", disable=rank != 0):
            x = torch.zeros(n // 4)  # float32, n bytes; zeros stay zeros however often they are summed
            for _ in range(2):  # warm-up: gloo's buffers for this size
                dist.all_reduce(x)
            times = torch.zeros(reps, dtype=torch.float64)
            for r in range(reps):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(x)
                times[r] = time.perf_counter() - start
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a repetition lasts until its slowest rank is done
            samples.append({"bytes": n, "seconds": statistics.median(times.tolist()), "all_seconds": times.tolist()})
        if rank == 0:
            with open(out, "w") as f:
                json.dump(samples, f)
    finally:
        dist.destroy_process_group()


def training(cfg, patterns):
    """bench.py under torchrun with real TP over cfg['procs'] gloo processes, all patterns interleaved in one run;
    its printed rows parsed into step ms, collectives ms and the measured all-reduce counts and sizes."""
    from bench import pattern_name

    listed = "[" + ", ".join(shown(p) for p in patterns) + "]"
    args = ["bench.py", "--model_type=distributed_gpt", f"--tp_size={cfg['procs']}", "--tp_mode=real",
            "--device=cpu", "--dtype=float32", *(f"--{k}={cfg[k]}" for k in BENCH_KEYS), f"--patterns={listed}"]
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg['procs']}"]
    command = "OMP_NUM_THREADS=1 torchrun " + " ".join(launch[2:] + args[:-1]) + f' --patterns="{listed}"'
    print(f"in-training: {command}")
    r = subprocess.run([sys.executable, *launch, *args], check=False, cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(r.stdout, end="")
    if r.returncode:
        last = next((line for line in reversed(r.stderr.splitlines()) if line.strip()), "")
        raise MeasureError(f"bench.py under torchrun failed (exit {r.returncode}): {last.strip()}")
    row = re.compile(r"^(?P<name>.+?)\s+(?P<ms>[\d.]+) ms/iter .* all-reduces fwd (?P<fwd>\d+) bwd (?P<bwd>\d+)\s+"
                     r"(?P<bpt>[\d.]+) B/token\s+collectives (?P<coll>[\d.]+) ms/iter")
    found = {m["name"]: m for m in map(row.match, r.stdout.splitlines()) if m}
    tokens = cfg["batch_size"] * cfg["block_size"]
    rows = []
    for p in patterns:
        m = found.get(pattern_name(p))
        if m is None:
            raise MeasureError(f"bench.py printed no timing row for pattern {pattern_name(p)}")
        fwd, bwd = int(m["fwd"]), int(m["bwd"])
        rows.append({"pattern": p, "name": pattern_name(p), "fwd_allreduces": fwd, "bwd_allreduces": bwd,
                     "allreduces_per_step": fwd + bwd, "bytes_per_token": float(m["bpt"]),
                     "bytes_per_allreduce": round(float(m["bpt"]) * tokens / (fwd + bwd)),
                     "step_ms": float(m["ms"]), "collectives_ms": float(m["coll"])})
    model = {k: cfg[k] for k in BENCH_KEYS[:-2]}
    return {"command": command, "procs": cfg["procs"], "model": dict(model, tokens_per_iter=tokens, dtype="float32"),
            "iters": cfg["iters"], "warmup": cfg["warmup"],
            "statistic": "bench.py: best of 3 interleaved rounds of iters/3 steps; collectives include the per-step "
                         "all-reduce of the block-replicated gradients and waiting for the other rank",
            "patterns": rows, "bench_output": r.stdout}


# ---------- python comm_model.py validate: measured against predicted ----------

VALIDATE_DEFAULTS = {"calibration": None}  # the JSON `measure` wrote


def validate(cfg):
    """The validation table of a calibration file: per pattern, measured ms/iter against predictors (i) and (ii)."""
    data, path = load_calibration(cfg["calibration"])
    micro, train = data["microbenchmark"], data["training"]
    m = train["model"]
    rows, summary = validation(micro["samples"], train["patterns"], procs=micro["procs"], n_layer=m["n_layer"])
    print(f"calibration {path}: {data.get('created', '?')}, {data['machine'].get('cpu', '?')}, "
          f"load average (1, 5, 15 min) before {data['machine'].get('loadavg_before', '?')}, after "
          f"{data['machine'].get('loadavg_after', '?')}")
    print(f"microbenchmark: gloo, {micro['procs']} processes, {len(micro['samples'])} sizes: alpha = "
          f"{summary['alpha'] * 1e6:.1f} us, B = {summary['busbw'] / 1e9:.3f} GB/s; t(n = "
          f"{summary['nbytes']:,} B, p = {micro['procs']}) = {summary['t_micro'] * 1e3:.3f} ms")
    print(f"training: bench.py, real TP over {train['procs']} processes, {m['n_layer']} x {m['n_embd']}, "
          f"{m['tokens_per_iter']} tokens/iter, {train['iters']} iters\n")
    print("| pattern | all-reduces / step | of them overlapped | measured ms/iter | in collectives ms/iter "
          "| (i) microbenchmark ms/iter | (i) error | (ii) in-training, leave-one-out ms/iter | (ii) error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ii = "n/a" if r["loo_ms"] is None else f"{r['loo_ms']:.1f}"
        print(f"| `{r['name']}` | {r['n']} | {r['overlapped']} | {r['step_ms']:.1f} | {r['collectives_ms']:.1f} | "
              f"{r['micro_ms']:.1f} | "
              f"{'anchor' if r['anchor'] else pct(r['micro_err'])} | {ii} | {pct(r['loo_err'])} |")
    print(f"\n(i) microbenchmark alpha, B: ms/iter = compute + N x t(n, p), compute = the measured ms/iter of "
          f"`{summary['anchor']}` (fewest all-reduces) minus its own {summary['anchor_n']} modelled all-reduces = "
          f"{summary['compute_ms']:.1f} ms (so the per-step gradient sync and all pattern-independent work are in "
          f"it). That row is the anchor, exact by construction. Mean |error| of the others: "
          f"{pct(summary['micro_mae'], sign=False)}.")
    print(f"(ii) in-training: ms/iter = C + N x t_eff - N_ovl x h (N_ovl: forward all-reduces overlapped by "
          f"'ladder', h: the time each hides; h = 0 when no fitted pattern overlaps), least squares on every pattern "
          f"but the predicted one "
          f"(leave-one-pattern-out). Mean |error|: {pct(summary['loo_mae'], sign=False)}. On all patterns: C = "
          + (f"{summary['C_ms']:.1f} ms, t_eff = {summary['t_eff_ms']:.3f} ms per all-reduce."
             if summary["t_eff_ms"] is not None else "n/a (fewer than two distinct all-reduce counts)."))
    if summary["hidden_ms"] is not None:
        print(f"Overlap: h = {summary['hidden_ms']:.3f} ms hidden per overlapped all-reduce, "
              f"{summary['hidden_ms'] / summary['t_eff_ms']:.0%} of t_eff (100% would be fully hidden, 0 nothing). "
              f"Without the overlap term (h = 0, a line in N): leave-one-out mean |error| "
              f"{pct(summary['loo_line_mae'], sign=False)}.")
    if summary["t_eff_ms"] is not None:
        print(f"Contention factor t_eff / t(n, p) = {summary['t_eff_ms'] / (summary['t_micro'] * 1e3):.2f}: an "
              f"all-reduce costs the training step that many microbenchmark all-reduces. The slope of the measured "
              f"collectives ms/iter on N is {summary['t_coll_ms']:.3f} ms "
              f"({summary['t_coll_ms'] / (summary['t_micro'] * 1e3):.2f} x the microbenchmark).")
    print("GPU predictions (python comm_model.py) use (i)'s form, compute + N x t(n, p), with t from the published "
          "NVLink / InfiniBand constants; no contention factor is applied.")


def pct(x, *, sign=True):
    return "n/a" if x is None else (f"{x:+.1f}%" if sign else f"{x:.1f}%")


def row_overlapped(row, n_layer):
    """A calibration row's overlapped forward all-reduces per step (overlapped_syncs of its pattern; a pattern
    given as one block type is that type in all n_layer layers); 0 for a row that names no pattern."""
    pattern = row.get("pattern")
    if pattern is None:
        return 0
    return overlapped_syncs([pattern] * n_layer if isinstance(pattern, str) else pattern)


def validation(samples, patterns, *, procs, n_layer=1):
    """Per pattern: measured ms/iter, predictor (i) (microbenchmark t(n, p) + compute from the fewest-syncs pattern,
    nothing hidden) and predictor (ii) (leave-one-pattern-out fit of ms/iter = C + N t_eff - N_ovl h, N_ovl the
    overlapped all-reduces, h the time each hides), with signed errors in %."""
    alpha, busbw = fit_allreduce([(s["bytes"], s["seconds"]) for s in samples], procs)
    t_ms = [allreduce_time(p["bytes_per_allreduce"], procs, alpha=alpha, busbw=busbw) * 1e3 for p in patterns]
    ns = [p["allreduces_per_step"] for p in patterns]
    steps = [p["step_ms"] for p in patterns]
    a = min(range(len(patterns)), key=lambda i: ns[i])
    compute = steps[a] - ns[a] * t_ms[a]
    ovl = [row_overlapped(p, n_layer) for p in patterns]
    loo = leave_one_out(ns, steps, zs=ovl)
    line = [abs(error(y, m)) for y, m in zip(leave_one_out(ns, steps), steps) if y is not None]  # h = 0 always
    rows = []
    for i, p in enumerate(patterns):
        micro = compute + ns[i] * t_ms[i]
        rows.append({"name": p["name"], "n": ns[i], "overlapped": ovl[i], "step_ms": steps[i],
                     "collectives_ms": p["collectives_ms"],
                     "micro_ms": micro, "micro_err": error(micro, steps[i]), "anchor": i == a, "loo_ms": loo[i],
                     "loo_err": None if loo[i] is None else error(loo[i], steps[i])})
    try:
        C, t_eff, hidden = fit_step(ns, steps, ovl)
        _, t_coll = fit_line(ns, [p["collectives_ms"] for p in patterns])
    except ValueError:
        C = t_eff = t_coll = hidden = None
    others = [abs(r["micro_err"]) for r in rows if not r["anchor"]]
    looe = [abs(r["loo_err"]) for r in rows if r["loo_err"] is not None]
    return rows, {"alpha": alpha, "busbw": busbw, "nbytes": patterns[a]["bytes_per_allreduce"],
                  "t_micro": t_ms[a] / 1e3, "anchor": patterns[a]["name"], "anchor_n": ns[a], "compute_ms": compute,
                  "C_ms": C, "t_eff_ms": t_eff, "t_coll_ms": t_coll, "hidden_ms": hidden if any(ovl) else None,
                  "micro_mae": statistics.mean(others) if others else None,
                  "loo_mae": statistics.mean(looe) if looe else None,
                  "loo_line_mae": statistics.mean(line) if line and any(ovl) else None}


def error(predicted, measured):
    return 100 * (predicted - measured) / measured


def load_calibration(path):
    """The calibration JSON, checked for every key `validate` reads: ConfigError naming the file and the key."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"calibration must be the file `measure` wrote (--calibration=FILE.json), got {path!r}")
    if not os.path.isfile(path):
        raise ConfigError(f"calibration file {path!r} not found")
    try:
        with open(path) as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"calibration file {path!r} is not valid JSON: {e}") from None

    def need(obj, where, key, kind):
        if not isinstance(obj, dict) or key not in obj:
            raise ConfigError(f"calibration file {path!r} lacks key {where + key!r}")
        value = obj[key]
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and kind is not list and kind is not dict:
            ok = math.isfinite(value) and value > 0
        if not ok:
            what = {list: "a non-empty list", dict: "an object"}.get(kind, "a positive number")
            raise ConfigError(f"calibration file {path!r}: {where}{key} must be {what}, got {value!r}")
        if kind is list and not value:
            raise ConfigError(f"calibration file {path!r}: {where}{key} must be a non-empty list, got []")
        return value

    number = (int, float)
    micro, train = need(data, "", "microbenchmark", dict), need(data, "", "training", dict)
    need(data, "", "machine", dict)
    need(micro, "microbenchmark.", "procs", int)
    for i, s in enumerate(need(micro, "microbenchmark.", "samples", list)):
        for key in ("bytes", "seconds"):
            need(s, f"microbenchmark.samples[{i}].", key, number)
    for key in ("procs", "iters"):
        need(train, "training.", key, int)
    for key in ("n_layer", "n_embd", "tokens_per_iter"):
        need(need(train, "training.", "model", dict), "training.model.", key, int)
    for i, p in enumerate(need(train, "training.", "patterns", list)):
        for key in ("allreduces_per_step", "bytes_per_allreduce", "step_ms", "collectives_ms"):
            need(p, f"training.patterns[{i}].", key, number)
        if not isinstance(p.get("name"), str):
            raise ConfigError(f"calibration file {path!r}: training.patterns[{i}].name must be a string")
    try:
        fit_allreduce([(s["bytes"], s["seconds"]) for s in micro["samples"]], micro["procs"])
    except ValueError as e:
        raise ConfigError(f"calibration file {path!r}: microbenchmark.samples: {e}") from None
    return data, path


COMMANDS = {"predict": (PREDICT_DEFAULTS, predict), "measure": (MEASURE_DEFAULTS, measure),
            "validate": (VALIDATE_DEFAULTS, validate)}


@exit_in_one_line(MeasureError, 1)
@exit_on_config_error
def main(argv):
    command = "predict"
    if argv and not argv[0].startswith("--"):
        command, argv = argv[0], argv[1:]
    if command not in COMMANDS:
        raise ConfigError(f"unknown command {command!r}; use {', '.join(COMMANDS)} (no command: predict)")
    defaults, run = COMMANDS[command]
    run(configure(defaults, argv))


if __name__ == "__main__":
    main(sys.argv[1:])
