"""
A calibrated cost model of tensor-parallel communication: what the all-reduces of a block pattern cost,
measured on this machine and predicted for GPU clusters from published constants.

    t(n, p)  = alpha + 2(p-1)/p * n / B      one all-reduce of n bytes per rank over p ranks
    step_k   = compute + N_k * t(n, p)       pattern k, N_k blocking all-reduces a step (forward + backward)

alpha is the per-call latency and B the ring bus bandwidth: a ring all-reduce (reduce-scatter, then
all-gather) sends and receives 2(p-1)/p * n bytes per rank, so B is what nccl-tests reports as "busbw". A
blocking all-reduce sits on the critical path (Megatron's: the next matmul needs its result). Syncs that move
instead of being dropped leave part of it there: exposed = sum over modules of max(0, comm_i - efficiency *
compute hiding it) (overlap: tp_overlap chunks, ladder), a smaller comm_i (int8/fp8 compression, plus its
quantize pass), or the same bytes in two collectives (sequence parallelism). The backward has its own hiding:
Megatron-LM issues each column-parallel layer's input-gradient all-reduce asynchronously and computes the
weight gradient meanwhile (exposed = max(0, t - efficiency * wgrad GEMM)); that is the default baseline
('megatron'; 'blocking' is the older, weaker one), and Domino's backward chunks and the ladder's backward
slack add to it. docs/cost_model.md has the equations and their checks; tpcomm/experiments/calibration.py
measures them on this machine.

$ python comm_model.py  # GPU predictions from published constants (< 2 s)
$ python comm_model.py --mfu=0.5 --batch_size=16 --seq_len=2048 # other assumptions
$ python comm_model.py --baseline=blocking                      # speedups over all 'tp' with blocking
                                                                # backward
$ python comm_model.py measure --out=calibration.json           # gloo microbenchmark + bench.py under real TP
                                                                # (CPU)
$ python comm_model.py validate --calibration=calibration.json  # measured vs predicted ms/iter per block
                                                                # pattern
"""

import math
from collections import Counter
from typing import NamedTuple, Optional

from tpcomm.errors import ConfigError
from tpcomm.model.block_types.registry import block_type, synced_share
from tpcomm.costmodel.collective_matmul_cost import BF16, gpt_collective_matmul, torchtitan_checks
from tpcomm.experiments import ways


class Constant(NamedTuple):
    value: float
    unit: str
    source: str


CONSTANTS = {
    "h100_bf16_flops": Constant(989e12, "FLOP/s", "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 "
                                "Tensor Core 1,979 TFLOPS with sparsity, i.e. 989 dense (model.py's "
                                "PEAK_FLOPS)"),
    "h100_hbm_bw": Constant(3.35e12, "B/s", "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: HBM3, 3.35 "
                            "TB/s"),
    "nvlink_bw": Constant(900e9, "B/s", "NVIDIA H100 datasheet: NVLink 4, 900 GB/s per GPU, total of both "
                          "directions (450 GB/s each way): the ceiling, not used in t(n, p)"),
    "nvlink_busbw": Constant(360e9, "B/s", "assumed: nccl-tests all_reduce_perf busbw on one 8x H100 SXM "
                             "NVSwitch node is commonly ~360-480 GB/s (e.g. 479.7 GB/s peak at 8 GiB in a "
                             "published 8x H100 SXM run, Voltage Park / Georgia Tech benchmark suite); the "
                             "low end is taken for tp's 10-100 MB messages"),
    "nvlink_latency": Constant(10e-6, "s", "assumed: order of NCCL's small-message all-reduce time within "
                               "one NVSwitch node (nccl-tests, 8 B - 64 KB); measure the target system"),
    "ib_busbw": Constant(45e9, "B/s", "InfiniBand NDR 400 Gb/s = 50 GB/s per direction per port, one port "
                         "per GPU (DGX H100: 8x ConnectX-7); assumed 90% of line rate as busbw"),
    "ib_latency": Constant(20e-6, "s", "assumed: a few us of NIC and switch latency plus NCCL's network "
                           "proxy, order of nccl-tests small-message all-reduce time across nodes"),
    "mfu": Constant(0.40, "", "assumed model FLOPs utilization of the compute (PaLM appendix B definition); "
                    "--mfu overrides"),
    "llama2_70b_params": Constant(70e9, "", "Touvron et al. 2023, Llama 2: 70B parameters, 80 layers, d "
                                  "8192, 64 heads of 128, GQA with 8 KV heads"),
    "spd_paper_saving": Constant(0.20, "", "Kim et al., SPD: Sync-Point Drop (arXiv 2502.20727, ICML 2025), "
                                 "abstract: about 20% lower inference latency for LLaMA2-70B over 8 GPUs"),
    "kernel_launch": Constant(4e-6, "s", "assumed: launch and tail of one small GPU kernel; a compressed "
                              "reduction adds two (quantize, dequantize-and-sum)"),
    "domino_speedup": Constant(1.3, "", "Wang et al., Domino (arXiv 2409.15241), abstract: up to 1.3x over "
                               "Megatron-LM for LLM training on NVIDIA DGX-H100 (GPT-3 and Llama-2 models)"),
    "domino_share_low": Constant(0.17, "", "Domino (arXiv 2409.15241), introduction: tensor-parallel "
                                 "communication is 17% to 43% of end-to-end training time on DGX-H100"),
    "domino_share_high": Constant(0.43, "", "Domino (arXiv 2409.15241), introduction: the upper end of the "
                                  "17-43%"),
    "ladder_speedup": Constant(1.29, "", "Zhang et al., Ladder Residual (arXiv 2501.06589, ICML 2025), "
                               "abstract: 29% end-to-end inference speedup for a 70B model (LLaMA-3.1-70B "
                               "shape) with TP over 8 devices (the batch-1 H100 NVLink setting is this "
                               "repo's reading of the paper)"),
    "ladder_speedup_low": Constant(1.16, "", "Ladder Residual (arXiv 2501.06589): speedups across batch 1-64 "
                                   "at 70B, tp 8, H100 NVLink, about 1.16x-1.31x (the paper's per-batch "
                                   "results as summarised when this repo was planned; the table itself not "
                                   "re-checked)"),
    "ladder_speedup_high": Constant(1.31, "", "Ladder Residual (arXiv 2501.06589): upper end of the "
                                    "1.16x-1.31x"),
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
        """12 L d^2 (attention 4d^2 + MLP 8d^2 per layer) plus the tied embedding;
        biases and norms left out."""
        return 12 * self.n_layer * self.n_embd ** 2 + self.vocab * self.n_embd


TABLE_SHAPES = (Shape("GPT-2 124M", 12, 768, 12),  # Radford et al. 2019
          # GPT-3 XL's layers and width (Brown et al. 2020), 128-wide heads
          Shape("1.3B (24 x 2048)", 24, 2048, 16),
          Shape("7B (32 x 4096)", 32, 4096, 32))  # LLaMA-7B's layers, width and heads (Touvron et al. 2023)

# the block patterns of the GPU tables, per layer count L (docs/model.md: 2 fwd all-reduces per 'tp', 1 per
# 'spd')
GPU_PATTERNS = {w.price.label: w.blocks
                for w in map(ways.way, ("all-tp", "all-spd", "parallel-spd", "all-parallel"))}


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
    """Forward all-reduces of a pattern (one block type per layer): each block's forward_syncs fact, 1 more
    before ln_f when the last block leaves the stream desynced, unless its head reads each shard's stream
    (private_head). ValueError for a name that is not a registered block type."""
    kinds = [block_type(kind) for kind in block_types]
    return sum(cls.forward_syncs for cls in kinds) + (kinds[-1].desyncs and not kinds[-1].private_head)


def backward_syncs(block_types):
    """Backward all-reduces of a pattern (f's): each block's backward_syncs for a synced or a
    desynced input (its class's fact), the embedding's fan-out counted in the first block's. Equals
    forward_syncs for every pattern of the registered types (each sync's sum fans out through one
    f). ValueError for an unregistered name."""
    kinds = [block_type(kind) for kind in block_types]
    return sum(cls.backward_syncs[prev is not None and prev.desyncs] for prev,
               cls in zip([None, *kinds], kinds))


def step_seconds(shape, *, tp, link, tokens, seq_len, mfu, fwd_syncs, peak=None):
    """(compute s, communication s) of one training micro-step of `tokens` tokens on a tp group:
    compute is (6 N + 12 L d T) FLOPs per token (PaLM appendix B, as model.estimate_mfu) over tp GPUs
    at mfu of their peak; communication is 2 * fwd_syncs all-reduces (backward runs as many as
    forward) of tokens * d bf16 values."""
    peak = const("h100_bf16_flops") if peak is None else peak
    flops = (6 * shape.params + 12 * shape.n_layer * shape.n_embd * seq_len) * tokens
    nbytes = tokens * shape.n_embd * BF16
    return flops / (tp * peak * mfu), 2 * fwd_syncs * allreduce_time(nbytes, tp, alpha=link.alpha,
                                                                     busbw=link.busbw)


def decode_token(*, params, n_layer, n_embd, n_kv_heads, head_dim, context, batch, tp, link, syncs,
                 hbm_bw=None):
    """(memory s, communication s) of one decode step: every GPU reads its 1/tp of the bf16 weights and its KV
    heads' cache from HBM at the datasheet bandwidth (FLOPs ignored: memory-bound at small batch), then
    `syncs` all-reduces of batch * d bf16 values. KV heads are replicated when tp exceeds them."""
    hbm_bw = const("h100_hbm_bw") if hbm_bw is None else hbm_bw
    weights = params * BF16 / tp
    kv = 2 * n_layer * n_kv_heads * head_dim * context * batch * BF16 / min(tp, n_kv_heads)
    comm = syncs * allreduce_time(batch * n_embd * BF16, tp, alpha=link.alpha, busbw=link.busbw)
    return (weights + kv) / hbm_bw, comm


# ---------- moving syncs instead of dropping them: hide, delay, shrink (docs/cost_model.md) ----------

def exposed(comms, hiders, *, efficiency=1.0):
    """Seconds of communication left on the critical path: sum of max(0, comms[i] - efficiency *
    hiders[i]), hiders[i] the compute that runs while comms[i] is in flight (0: a blocking collective).
    efficiency is the share of that compute that really hides communication (1: ideal; NCCL's kernels
    also take SMs and memory bandwidth)."""
    assert len(comms) == len(hiders)
    # a model's layers repeat the same (communication, compute) pairs: each distinct pair once, times its
    # count
    return sum(k * max(0.0, m - efficiency * c) for (m, c), k in Counter(zip(comms, hiders)).items())


def chunked_exposed(compute, nbytes, p, *, chunks, alpha, busbw, efficiency=1.0, tail=0.0):
    """Exposed communication of one module run in K chunks (tp_overlap=K, Domino-style): each chunk's
    all-reduce of nbytes / K runs while the next chunk computes compute / K; the last chunk's hides behind
    `tail` only (0 in the forward; in a backward with Megatron's asynchronous input-gradient all-reduce, the
    last chunk's weight-gradient GEMM, w / K). K times the latency, 1/K the bytes each. Equals the two-stage
    pipeline's makespan minus the compute (backward: each chunk's all-reduce issued after its input-gradient
    GEMM, before its weight-gradient GEMM)."""
    m = allreduce_time(nbytes / chunks, p, alpha=alpha, busbw=busbw)
    return exposed([m] * chunks, [compute / chunks] * (chunks - 1) + [tail], efficiency=efficiency)


def async_grad_exposed(comms, wgrads, *, efficiency=1.0):
    """Megatron-LM's asynchronous input-gradient all-reduce
    (LinearWithGradAccumulationAndAsyncCommunication): in the backward of each column-parallel layer
    (c_attn, c_fc: the f operators) the all-reduce of the input gradient is issued as soon as that
    gradient is computed and waited for after the layer's weight-gradient GEMM, so each hides behind its
    own layer's wgrad GEMM and nothing else: sum of max(0, comms[i] - efficiency * wgrads[i])."""
    return exposed(comms, wgrads, efficiency=efficiency)


def ladder_exposed(comms, computes, *, efficiency=1.0, own=None):
    """Exposed communication of a run of ladder modules: module i's all-reduce runs while module i+1 computes;
    the run's last module has nothing after it to hide behind (the next block or ln_f needs the stream).
    own[i]: the part of module i's compute that runs after its all-reduce is issued (the backward's wgrad GEMM
    under the asynchronous input-gradient all-reduce; default none). Each all-reduce is then given the compute
    from its issue to the next one's, own[i] + computes[i+1] - own[i+1] (windows that do not overlap: the link
    moves one at a time); the last gets own[-1]. For the backward, pass the modules in backward order (the
    forward's reversed): module i's input-gradient all-reduce is needed by module i-2's backward, so it runs
    while module i-1's backward computes."""
    own = [0.0] * len(comms) if own is None else own
    hiders = [o + c - o_next for o, c, o_next in zip(own, computes[1:], own[1:])] + [own[-1]]
    return exposed(comms, hiders, efficiency=efficiency)


def sp_time(nbytes, p, *, alpha, busbw):
    """Sequence parallelism replaces one all-reduce by a reduce-scatter and an all-gather:
    (p-1)/p * n bytes per rank each, 2(p-1)/p * n together, the ring all-reduce's bytes; two
    collectives, so twice the latency."""
    return 0.0 if p == 1 else 2 * alpha + ring_bytes(nbytes, p) / busbw


def activation_bytes(*, seq, batch, d, heads, tp, sequence_parallel):
    """Activation bytes of one transformer layer per GPU, 16-bit activations and no recomputation (Korthikanti
    et al., arXiv 2205.05198, section 4): s b h (10 + 24/t + 5 a s / (h t)) under tp; sequence parallelism
    splits the LayerNorm and dropout regions' 10 s b h over the t ranks too: s b h (34/t + 5 a s / (h t))."""
    sbh, attn = seq * batch * d, 5 * heads * seq / (d * tp)
    return sbh * ((34 / tp + attn) if sequence_parallel else (10 + 24 / tp + attn))


class Compression(NamedTuple):
    bits: int = 8  # per value on the wire (int8 or fp8)
    group: int = 32  # values per absmax scale: a scale group (tp_comm_block)
    scale_bytes: int = 4  # one fp32 scale per group
    exchange: str = "one_shot"  # tp_comm_exchange: 'one_shot' all-gathers the partials, 'two_shot' RS + AG


INT8 = Compression()


def compressed_bytes(values, comp=INT8):
    """Bytes of `values` block-quantized: bits/8 per value plus one scale per block (int8, fp32 scale per 32
    values: 1 + 4/32 = 1.125 B per value against 2 for bf16)."""
    return values * comp.bits / 8 + math.ceil(values / comp.group) * comp.scale_bytes


def compressed_reduce_time(values, p, *, alpha, busbw, hbm_bw, launch, comp=INT8, value_bytes=BF16):
    """Seconds for one reduction of `values` partial sums compressed (n = values x value_bytes, n_c
    compressed). 'one_shot': one all-gather of the p compressed partials, (p-1) n_c sent per rank, then a
    quantize pass (read n, write n_c) and a dequantize-and-sum pass (read p n_c, write n): two kernels.
    'two_shot': an all-to-all of row chunks then an all-gather of each rank's summed chunk, 2(p-1)/p n_c sent
    per rank, two latencies; passes: quantize (n, n_c), dequantize-and-sum the chunk (n_c, n/p), requantize it
    (n/p, n_c/p), dequantize what is gathered (n_c, n): four kernels. All passes at HBM bandwidth."""
    if p == 1:
        return 0.0
    nc, n = compressed_bytes(values, comp), values * value_bytes
    if comp.exchange == "one_shot":
        calls, wire, moved, kernels = 1, (p - 1) * nc, n + nc + p * nc + n, 2
    elif comp.exchange == "two_shot":
        calls, wire, moved, kernels = (2, ring_bytes(nc, p), (n + nc) + (nc + n / p) + (n / p + nc / p)
                                       + (nc + n), 4)
    else:
        raise ValueError(f"exchange must be 'one_shot' or 'two_shot', got {comp.exchange!r}")
    return calls * alpha + wire / busbw + moved / hbm_bw + kernels * launch


def overlapped_syncs(block_types):
    """Forward all-reduces of a pattern that run while other compute does: each run of k consecutive blocks
    that delay their outputs ('ladder') overlaps 2k-1 of its 2k (docs/model.md); backward stays synchronous.
    'tp' etc.: 0. ValueError for a name that is not a registered block type."""
    out, run = 0, 0
    for kind in list(block_types) + [None]:
        if kind is not None and block_type(kind).delays:
            run += 1
        elif run:
            out, run = out + 2 * run - 1, 0
    return out


def module_flops(shape, seq_len):
    """Forward FLOPs per token of one attention module (8 d^2 + 4 d T: projections, scores and values), one
    MLP module (16 d^2), and the whole step's rest (embedding and lm_head, forward + backward: 6 V d).
    Backward is twice forward, so L (3 attn + 3 mlp) + rest is step_seconds's 6 N + 12 L d T."""
    d = shape.n_embd
    return 8 * d * d + 4 * d * seq_len, 16 * d * d, 6 * shape.vocab * d


def wgrad_flops(shape):
    """FLOPs per token of the weight-gradient GEMM of each module's column-parallel layer, the compute
    Megatron's asynchronous input-gradient all-reduce hides behind: c_attn (d -> 3d) 6 d^2, c_fc (d -> 4d) 8
    d^2 (a GEMM's wgrad costs what its forward does)."""
    d = shape.n_embd
    return 6 * d * d, 8 * d * d


class Options(NamedTuple):
    """How the syncs move, for the GPU tables: tp_overlap chunks, overlap efficiency, compression."""
    chunks: int = 2
    efficiency: float = 1.0
    comp: Compression = INT8
    launch: float = const("kernel_launch")  # s per extra kernel (quantize, dequantize-and-sum)
    hbm_bw: float = const("h100_hbm_bw")
    # the block types' own options by config key (default: each one's default)
    block_options: Optional[dict] = None


# tp_comm_dtype on the wire (docs/compression.md): 'bf16' is a plain cast, no scales (under bf16 autocast the
# same bytes as no compression, but still exchanged as compressed: all-gathered, or all-to-all + all-gather);
# 'fp8' and 'int8' are 1 byte a value plus an fp32 scale per 32: the model cannot tell them apart (same bytes,
# same passes).
WIRE_COST = {"bf16": Compression(bits=16, scale_bytes=0), "fp8": INT8, "int8": INT8}
# what "all tp" means: with Megatron's async input-gradient all-reduce, or not
BASELINES = ("megatron", "blocking")


def train_variants(shape, *, tp, link, tokens, seq_len, mfu, opts=Options(), peak=None, async_grad=False):
    """{variant: (compute s, exposed communication s)} of one training micro-step, one per priced way of
    tpcomm/experiments/ways.py, keyed by its Price.label and computed by its Price.term. The baseline 'all
    tp': 2L forward all-reduces, blocking, and 2L backward ones (one per f), blocking, or with async_grad
    (Megatron-LM's default) each hidden behind its column-parallel layer's weight-gradient GEMM. The others,
    each with the same backward rule for the all-reduces it keeps (async_grad: every backward f all-reduce can
    hide behind its own wgrad GEMM): '+sp' sequence parallelism; 'overlap K=k' tp_overlap=k on every module
    forward and backward (Domino-style); 'ladder' all 'ladder' with its forward all-reduces delayed and its
    backward ones as the baseline's (the repo's ladder with tp_async_grad=False, against the blocking
    baseline); 'ladder fwd+bwd' the backward delayed too (module i's input-gradient all-reduce behind module
    i-1's backward: the repo's with tp_async_grad=True); 'int8', 'fp8', 'bf16' and their '2shot': the forward
    reductions compressed, one_shot or two_shot exchange (backward ones stay bf16 all-reduces); every drop
    ('all spd', 'parallel/spd', 'all parallel', 'tracks/4', 'spd int8': its forward syncs, compressed where
    the way sets tp_comm_dtype); 'collective matmul'; 'partial sync' (all 'caat'). async_grad=False gives the
    numbers of the blocking model this repository printed before."""
    peak = const("h100_bf16_flops") if peak is None else peak
    L, n, eta = shape.n_layer, tokens * shape.n_embd * BF16, opts.efficiency
    per_flop = tokens / (tp * peak * mfu)
    attn, mlp, rest = module_flops(shape, seq_len)
    fwd = [attn * per_flop, mlp * per_flop] * L  # the 2L modules in order
    compute = 3 * sum(fwd) + rest * per_flop  # forward + backward (twice forward) + embedding and lm_head
    # what each module's backward all-reduce hides behind by itself: its wgrad GEMM under async_grad, else
    # nothing
    wgrad = [w * per_flop for w in wgrad_flops(shape)] * L if async_grad else [0.0] * (2 * L)
    t = allreduce_time(n, tp, alpha=link.alpha, busbw=link.busbw)
    kw = dict(alpha=link.alpha, busbw=link.busbw, efficiency=eta)
    backward = async_grad_exposed([t] * 2 * L, wgrad, efficiency=eta)  # the 2L f all-reduces of all 'tp'
    half = sp_time(n, tp, alpha=link.alpha, busbw=link.busbw) / 2  # one reduce-scatter or all-gather
    # the 2L modules are L copies of (attention, MLP): each distinct module priced once, times its count
    overlap = sum(k * (chunked_exposed(c, n, tp, chunks=opts.chunks, **kw)
                       + chunked_exposed(2 * c, n, tp, chunks=opts.chunks, tail=w / opts.chunks, **kw))
                  for (c, w), k in Counter(zip(fwd, wgrad)).items())
    ladder_fwd = ladder_exposed([t] * 2 * L, fwd, efficiency=eta)
    ladder_bwd = ladder_exposed([t] * 2 * L, [2 * c for c in fwd[::-1]], own=wgrad[::-1], efficiency=eta)

    def squeezed(sync):  # one reduction compressed at the way's tp_comm_dtype and tp_comm_exchange
        comp = WIRE_COST[sync["tp_comm_dtype"]]._replace(exchange=sync.get("tp_comm_exchange", "one_shot"))
        return compressed_reduce_time(tokens * shape.n_embd, tp, alpha=link.alpha, busbw=link.busbw,
                                      hbm_bw=opts.hbm_bw, launch=opts.launch, comp=comp)

    def dropped(way):
        # N forward syncs (compressed when the way sets tp_comm_dtype) and N backward all-reduces, each at a
        # block's input f: hides behind that block's attention QKV wgrad GEMM under async_grad
        N, N_bwd = forward_syncs(way.blocks(L)), backward_syncs(way.blocks(L))
        forward_comm = squeezed(way.sync) if "tp_comm_dtype" in way.sync else t
        return N * forward_comm + async_grad_exposed([t] * N_bwd, [wgrad[0]] * N_bwd, efficiency=eta)

    terms = {"baseline": lambda w: 2 * L * t + backward, "drop": dropped,
             # forward: AG + RS per module; backward: the g's AG blocking, the f's RS behind the wgrad GEMM
             "sequence parallel": lambda w: 2 * L * 2 * half + 2 * L * half + async_grad_exposed(
                 [half] * 2 * L, wgrad, efficiency=eta),
             "overlap": lambda w: overlap, "delay": lambda w: ladder_fwd + backward,
             "delay both": lambda w: ladder_fwd + ladder_bwd, "compress": lambda w: 2 * L * squeezed(w.sync)
             + backward,
             # SP's collectives as rings beside partial GEMMs, forward and backward
             # (collective_matmul_cost.py)
             "collective matmul": lambda w: gpt_collective_matmul(L, shape.n_embd, tp=tp, link=link,
                                                                  tokens=tokens,
                                                                  peak=peak, mfu=mfu, efficiency=eta),
             "partial sync": lambda w: partial_sync_comm(t, allreduce_time(synced_share(
                 {**(opts.block_options or {}), **w.sync}, w.blocks(L), n_embd=shape.n_embd, tp_size=tp) * n,
                                                                           tp,
                 alpha=link.alpha, busbw=link.busbw), wgrad, eta)}
    comm = {}
    for way in ways.WAYS:  # one term per priced way, under its label (two ways may share one: all tp)
        if way.price and way.price.label.format(chunks=opts.chunks) not in comm:
            comm[way.price.label.format(chunks=opts.chunks)] = terms[way.price.term](way)
    return {k: (compute, v) for k, v in comm.items()}


def partial_sync_comm(t, t_p, wgrad, efficiency=1.0):
    """Exposed communication of all 'caat' (tpcomm/model/block_types/caat.py): each module's forward
    all-reduce and its f's backward one move p of the channels (t_p each; the backward one behind its wgrad
    GEMM as the baseline's), plus the embedding's fan-out in the backward (t, a full sync). No final sync: the
    head is vocabulary-parallel, its loss's collectives three scalars a token (not priced)."""
    return (len(wgrad) * t_p + async_grad_exposed([t_p] * len(wgrad), wgrad, efficiency=efficiency)
            + async_grad_exposed([t], wgrad[:1], efficiency=efficiency))


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
    """Seconds one GPU reads HBM per decode step: (one attention module: q, o, k, v weights/tp and
    its KV heads' cache; one MLP module: 3 d ffn weights/tp; the rest of the parameters/tp:
    embedding, lm_head, norms)."""
    d = shape.n_embd
    attn_w = 2 * d * d + 2 * d * shape.n_kv_heads * shape.head_dim
    kv = 2 * shape.n_kv_heads * shape.head_dim * context * batch * BF16 / min(tp, shape.n_kv_heads)
    rest = shape.params - shape.n_layer * (attn_w + 3 * d * shape.ffn)
    return (attn_w * BF16 / tp
            + kv) / hbm_bw, 3 * d * shape.ffn * BF16 / tp / hbm_bw, rest * BF16 / tp / hbm_bw


def decode_variants(shape, *, context, batch, tp, link, opts=Options()):
    """{variant: (memory s, exposed communication s)} of one decode step: memory-bound modules (weights/tp and
    the KV cache read at HBM bandwidth; attention's module holds q, o, k, v and the cache, the MLP its 3 d ffn
    weights, the rest embedding and lm_head) and batch x d bf16 all-reduces: blocking all 'tp', all 'ladder',
    int8 (one_shot and two_shot exchange), all 'spd'. tp_overlap is left out: a chunk re-reads the weights."""
    L, d = shape.n_layer, shape.n_embd
    attn, mlp, rest = decode_modules(shape, context=context, batch=batch, tp=tp, hbm_bw=opts.hbm_bw)
    memory = L * (attn + mlp) + rest
    t = allreduce_time(batch * d * BF16, tp, alpha=link.alpha, busbw=link.busbw)
    squeezed = {e: compressed_reduce_time(batch * d, tp, alpha=link.alpha, busbw=link.busbw,
                                          hbm_bw=opts.hbm_bw, launch=opts.launch,
                                          comp=opts.comp._replace(exchange=e)) for e in ("one_shot",
                                                                                         "two_shot")}
    comm = {"blocking": 2 * L * t, "ladder": ladder_exposed([t] * 2 * L, [attn, mlp] * L,
                                                            efficiency=opts.efficiency), "int8": 2 * L
            * squeezed["one_shot"], "int8 2shot": 2 * L * squeezed["two_shot"], "all spd": L * t}
    return {k: (memory, v) for k, v in comm.items()}


# ---------- python comm_model.py: GPU predictions ----------

PREDICT_DEFAULTS = {
    # all 'tp' as Megatron-LM runs it (async input-gradient all-reduce), or 'blocking'
    "baseline": "megatron",
    "mfu": const("mfu"),
    "batch_size": 8,  # sequences per micro-batch of one tp group
    "seq_len": 1024,  # tokens per sequence (attention FLOPs)
    "decode_batch": 1,  # LLaMA2-70B decode: sequences decoded together
    "decode_context": 1024,  # LLaMA2-70B decode: tokens in the KV cache
    "tp_overlap": 2,  # K: batch chunks per module of the overlapped (Domino-style) column
    "efficiency": 1.0,  # share of the concurrent compute that hides communication (1: ideal)
}

# Domino's models as checked below (Brown et al. 2020, table 2.1: layers x d_model, 128-wide heads at 6.7B,
# 13B)
GPT3_SHAPES = (Shape("GPT-3 2.7B", 32, 2560, 32), Shape("GPT-3 6.7B", 32, 4096, 32),
               Shape("GPT-3 13B", 40, 5120, 40))


def check_config(cfg):
    """ConfigError naming the key and value for anything predict cannot use."""
    if cfg["baseline"] not in BASELINES:
        raise ConfigError(f"baseline must be one of {', '.join(map(repr, BASELINES))}, got "
                          f"{cfg['baseline']!r}")
    for key in ("batch_size", "seq_len", "decode_batch", "decode_context", "tp_overlap"):
        if type(cfg[key]) is not int or cfg[key] < 1:
            raise ConfigError(f"{key} must be an int >= 1, got {cfg[key]!r}")
    for key in ("mfu", "efficiency"):
        if not 0 < cfg[key] <= 1:
            raise ConfigError(f"{key} must be a fraction in (0, 1], got {cfg[key]!r}")


def options(cfg):
    """The GPU tables' Options from predict's config and the named constants."""
    return Options(chunks=cfg["tp_overlap"], efficiency=cfg["efficiency"])


def speedup(variants, name, *, base="all tp"):
    return sum(variants[base]) / sum(variants[name])


def domino_runs(cfg, opts, *, async_grad):
    """train_variants of Domino's grid (GPT-3 shapes, tp 8, NVLink, sequence 2048, micro-batch 4, 8, 16)."""
    return [train_variants(s, tp=8, link=LINKS[0], tokens=b * 2048, seq_len=2048, mfu=cfg["mfu"], opts=opts,
                           async_grad=async_grad) for s in GPT3_SHAPES for b in (4, 8, 16)]


def published_checks(cfg, opts):
    """The model's numbers beside the published ones (NVLink, H100): Domino's TP share of a training step and
    its speedup over Megatron-LM on GPT-3 shapes at tp 8 (seq 2048, micro-batch 4, 8, 16: assumed), and Ladder
    Residual's decode speedup on the 70B shape at tp 8, batch 1 and over batch 1-64. Domino's speedup is
    checked twice: against Megatron-LM with its asynchronous input-gradient all-reduce (the published
    comparison: both sides hide backward communication) and against the blocking baseline (the check as first
    made). Every check is returned, whatever its error. [(what, published, model)]."""
    K = opts.chunks
    blocking, megatron = domino_runs(cfg, opts, async_grad=False), domino_runs(cfg, opts, async_grad=True)
    share = [v["all tp"][1] / sum(v["all tp"]) for v in blocking]
    exposed_share = [v["all tp"][1] / sum(v["all tp"]) for v in megatron]
    ladder = [speedup(decode_variants(LLAMA_70B, context=cfg["decode_context"], batch=b, tp=8, link=LINKS[0],
                                      opts=opts), "ladder", base="blocking") for b in (1, 4, 16, 64)]
    best = lambda runs, name: max(speedup(v, name) for v in runs)  # noqa: E731
    bound = lambda runs: max(sum(v["all tp"]) / v["all tp"][0] for v in runs)  # noqa: E731
    pub, pub_share = const("domino_speedup"), (const("domino_share_low"), const("domino_share_high"))
    return [("Domino: TP communication share of a training step (range; all time in collectives, blocking)",
             pub_share, (min(share), max(share))),
            ("Domino: exposed TP communication share of Megatron's step (range; async backward)",
             pub_share, (min(exposed_share), max(exposed_share))),
            (f"Domino: best speedup over Megatron-LM (model: tp_overlap={K} fwd + bwd vs async backward)",
             pub, best(megatron, f"overlap K={K}")),
            ("Domino: best speedup over Megatron-LM if all TP communication were hidden (the bound)",
             pub, bound(megatron)),
            (f"Domino, as first checked: best speedup over blocking (tp_overlap={K} fwd + bwd, no async)",
             pub, best(blocking, f"overlap K={K}")),
            ("Domino, as first checked: the bound over blocking", pub, bound(blocking)),
            ("Ladder Residual: 70B decode speedup, tp 8, batch 1", const("ladder_speedup"), ladder[0]),
            ("Ladder Residual: 70B decode speedup over batch 1-64 (range)",
             (const("ladder_speedup_low"), const("ladder_speedup_high")), (min(ladder), max(ladder))),
            *torchtitan_checks(link=LINKS[0], peak=const("h100_bf16_flops"), mfu=cfg["mfu"],
                               efficiency=opts.efficiency)]


def figure_variants(chunks=2):
    """{way key: its train_variants key} of every way the cost model prices but the baselines
    (tpcomm/experiments/ways.py): the trade-off figure's and the answer's; the tp_overlap way named by the
    chunks assumed ('tp_overlap=4' at 4)."""
    return {w.key.replace("tp_overlap=2", f"tp_overlap={chunks}"): w.price.label.format(chunks=chunks)
            for w in ways.WAYS if w.price and w.category != "baseline"}


FIGURE_SHAPE = TABLE_SHAPES[1]  # the 1.3B shape (24 x 2048) at tp 8
LINK_ALIASES = {"nvlink": LINKS[0], "ib": LINKS[1], "infiniband": LINKS[1],
                **{lk.name.lower(): lk for lk in LINKS}}


def predicted_speedups(link_name, baseline="megatron", *, cfg=None):
    """{variant name: predicted step speedup over the baseline} for the trade-off figure: the 1.3B
    shape (24 x 2048) at tp 8, on link_name ('nvlink' or 'ib', or a LINKS name), baseline 'megatron'
    (all 'tp' with Megatron's async input-gradient all-reduce) or 'blocking', at `python comm_model.py
    predict`'s assumptions (cfg: its defaults unless given; tp_overlap=2 is the default's chunk
    count). Names: figure_variants' keys."""
    cfg = {**PREDICT_DEFAULTS, **(cfg or {}), "baseline": baseline}
    check_config(cfg)
    link = LINK_ALIASES.get(link_name.lower()) if isinstance(link_name, str) else None
    if link is None:
        raise ValueError(f"link_name must be one of {', '.join(map(repr, ['nvlink', 'ib']))}, got "
                         f"{link_name!r}")
    opts = options(cfg)
    v = train_variants(FIGURE_SHAPE, tp=8, link=link, tokens=cfg["batch_size"] * cfg["seq_len"],
                       seq_len=cfg["seq_len"], mfu=cfg["mfu"], opts=opts, async_grad=baseline == "megatron")
    return {name: speedup(v, key) for name, key in figure_variants(opts.chunks).items()}


def error(predicted, measured):
    return 100 * (predicted - measured) / measured
