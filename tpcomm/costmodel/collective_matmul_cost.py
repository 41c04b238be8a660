"""
The cost of collective matmul (tp_collective_matmul; tpcomm/tp/collective_matmul.py runs it): sequence
parallelism's all-gather before a column-parallel GEMM and reduce-scatter after a row-parallel GEMM, each a
ring of tp steps whose tp - 1 transfers run beside partial GEMMs (PyTorch's async TP in torchtitan;
Transformer Engine's tp-comm-overlap).

    transfer  x = alpha + (n / tp) / B        one step: one token chunk of the (N, d) buffer, n bytes whole,
                                              at the ring's bus bandwidth B (a ring all-gather's step moves
                                              n/tp per rank)
    gemm      g = F / (tp * peak * e_part)    one step's partial GEMM: 1/tp of this rank's GEMM of F FLOPs, at
                                              the partial GEMM's own efficiency e_part (1/tp of the tokens: a
                                              thinner GEMM)
    exposed   (tp - 1) * max(0, x - eta * g)  per ring; the first step's GEMM (all-gather) or the last
                                              (reduce-scatter) has no transfer beside it
    lost      F / peak * (1/e_part - 1/mfu)   compute the split GEMM loses against the whole one, run at the
                                              compute model's mfu (0 when e_part = mfu, the default until a
                                              GPU measures it)

Per module, forward: one all-gather ring over its column GEMM, one reduce-scatter ring over its row GEMM;
backward the same two rings over the input-gradient GEMMs (same FLOPs), the weight-gradient GEMMs not split.
docs/cost_model.md has the check against torchtitan's published async-TP speedups (torchtitan_checks).
"""

from collections import Counter
from typing import NamedTuple

BF16 = 2  # bytes per value: the GPU predictions move the residual stream in bf16 (tp_comm's autocast dtype)


def ring_exposed(gemm_flops, nbytes, *, tp, alpha, busbw, peak, partial_eff, efficiency):
    """Exposed seconds of one ring: tp - 1 transfers of nbytes / tp, each beside one partial GEMM of
    gemm_flops / tp (gemm_flops: this rank's whole GEMM), at overlap efficiency `efficiency`."""
    if tp == 1:
        return 0.0
    transfer = alpha + nbytes / tp / busbw
    gemm = gemm_flops / tp / (peak * partial_eff)
    return (tp - 1) * max(0.0, transfer - efficiency * gemm)


def collective_matmul_time(module_gemms, nbytes, *, tp, alpha, busbw, peak, mfu, efficiency, partial_eff=None,
                           recompute=False):
    """Seconds a training micro-step loses to collective matmul: exposed ring transfers plus the compute
    the split GEMMs lose. module_gemms: per module (column GEMM FLOPs, row GEMM FLOPs) of one rank over
    the micro-batch; nbytes: one module's (N, d) buffer. recompute: the forward runs twice (full
    activation checkpointing)."""
    partial_eff = mfu if partial_eff is None else partial_eff
    fwd = sum(k * (ring_exposed(c, nbytes, tp=tp, alpha=alpha, busbw=busbw, peak=peak,
                                partial_eff=partial_eff,
                                efficiency=efficiency)
                   + ring_exposed(r, nbytes, tp=tp, alpha=alpha, busbw=busbw, peak=peak,
                                  partial_eff=partial_eff,
                                  efficiency=efficiency))
              # the layers' modules repeat: each distinct one once
              for (c, r), k in Counter(module_gemms).items())
    # per pass of the split GEMMs
    split = sum(c + r for c, r in module_gemms) / peak * (1 / partial_eff - 1 / mfu)
    passes = 3 if recompute else 2  # forward (again under recomputation), and the input-gradient GEMMs
    return passes * (fwd + split)


def sp_blocking_time(n_modules, nbytes, *, tp, alpha, busbw, recompute=False):
    """Plain sequence parallelism with every collective blocking (torchtitan's vanilla TP): per module an
    all-gather and a reduce-scatter forward, the same backward, each alpha + (tp-1)/tp n / B."""
    one = alpha + (tp - 1) / tp * nbytes / busbw
    return (3 if recompute else 2) * n_modules * 2 * one


class LlamaShape(NamedTuple):
    """A Llama 3 model for the torchtitan check: GQA attention, SwiGLU MLP of three d x ffn weights."""
    name: str
    n_layer: int
    d: int
    n_head: int
    n_kv_heads: int
    ffn: int
    vocab: int = 128256

    @property
    def params(self):
        hd = self.d // self.n_head
        attn = 2 * self.d * self.d + 2 * self.d * self.n_kv_heads * hd
        return self.n_layer * (attn + 3 * self.d * self.ffn) + 2 * self.vocab * self.d

    def gemm_flops_per_token(self):
        """((attention column, attention row), (MLP column, MLP row)) forward FLOPs per
        token, whole model width."""
        hd = self.d // self.n_head
        return ((2 * self.d * (self.d + 2 * self.n_kv_heads * hd), 2 * self.d * self.d),
                (2 * self.d * 2 * self.ffn, 2 * self.d * self.ffn))


# Meta's Llama 3 / 3.1 model card and paper (arXiv 2407.21783, table 3): 8B 32 x 4096, 32 heads, 8 KV heads,
# FFN 14336; 70B 80 x 8192, 64 heads, 8 KV heads, FFN 28672; vocabulary 128256
LLAMA3_8B = LlamaShape("Llama 3.1 8B", 32, 4096, 32, 8, 14336)
LLAMA3_70B = LlamaShape("Llama 3.1 70B", 80, 8192, 64, 8, 28672)

# torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (June 2025, Grand Teton H100 96 GB at 500 W,
# NVLink within the node, tp 8, torch.compile, sequence 8192 (torchtitan's Llama 3 default)): async TP over
# vanilla TP, bf16 (shape, published speedup, local batch, full activation checkpointing: forward recomputed)
TORCHTITAN_ASYNC_TP = ((LLAMA3_70B, 1.09, 16, True),  # 256 H100s, FSDP 32 x TP 8, full AC, local batch 16
                       (LLAMA3_8B, 1.10, 12, False))  # 64 H100s, FSDP 8 x TP 8, per-op SAC, local batch 12
TORCHTITAN_SEQ = 8192


def llama_step(shape, *, tp, link, tokens, seq_len, peak, mfu, partial_eff, efficiency, recompute):
    """(compute s, vanilla TP's blocking SP communication s, collective matmul's lost s) of one training step
    of `tokens` tokens on a tp group: compute (6 N + 12 L d T) FLOPs a token (plus 2 N recomputed under full
    AC) over tp GPUs at mfu of their peak."""
    per_token = 6 * shape.params + 12 * shape.n_layer * shape.d * seq_len + (2 * shape.params if recompute
                                                                             else 0)
    compute = per_token * tokens / (tp * peak * mfu)
    nbytes = tokens * shape.d * BF16
    gemms = [(c * tokens / tp, r * tokens / tp) for c, r in shape.gemm_flops_per_token()] * shape.n_layer
    kw = dict(tp=tp, alpha=link.alpha, busbw=link.busbw)
    sp = sp_blocking_time(2 * shape.n_layer, nbytes, recompute=recompute, **kw)
    ring = collective_matmul_time(gemms, nbytes, peak=peak, mfu=mfu, partial_eff=partial_eff,
                                  efficiency=efficiency, recompute=recompute, **kw)
    return compute, sp, ring


def torchtitan_checks(*, link, peak, mfu, partial_eff=None, efficiency=1.0):
    """[(what, published speedup, model speedup)] of torchtitan's bf16 async-TP runs: vanilla
    TP's step (compute + blocking SP collectives) over collective matmul's (compute + exposed
    transfers + the split GEMMs' loss)."""
    out = []
    for shape, published, batch, recompute in TORCHTITAN_ASYNC_TP:
        compute, sp, ring = llama_step(shape, tp=8, link=link, tokens=batch * TORCHTITAN_SEQ,
                                       seq_len=TORCHTITAN_SEQ, peak=peak, mfu=mfu, partial_eff=partial_eff,
                                       efficiency=efficiency, recompute=recompute)
        out.append((f"torchtitan async TP: {shape.name}, tp 8, bf16, local batch {batch} x {TORCHTITAN_SEQ}"
                    f"{', full AC' if recompute else ''}: speedup over vanilla TP", published,
                    (compute + sp) / (compute + ring)))
    return out


def gpt_gemm_flops_per_token(d):
    """((attention column c_attn, row c_proj), (MLP column c_fc, row c_proj)) forward FLOPs per token of a
    GPT-2 block of width d: 6 d^2, 2 d^2, 8 d^2, 8 d^2."""
    return ((6 * d * d, 2 * d * d), (8 * d * d, 8 * d * d))


def gpt_collective_matmul(n_layer, d, *, tp, link, tokens, peak, mfu, efficiency, partial_eff=None):
    """Seconds collective matmul leaves of a GPT training micro-step's communication on a tp
    group (the 'collective matmul' row of cost_model.train_variants): every 'tp' block's four
    rings forward and backward."""
    gemms = [(c * tokens / tp, r * tokens / tp) for c, r in gpt_gemm_flops_per_token(d)] * n_layer
    return collective_matmul_time(gemms, tokens * d * BF16, tp=tp, alpha=link.alpha, busbw=link.busbw,
                                  peak=peak, mfu=mfu, efficiency=efficiency, partial_eff=partial_eff)
