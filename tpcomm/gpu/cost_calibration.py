"""
`make gpu-check`'s cost_calibration section (tpcomm/gpu/gpu_check.py runs it; docs/gpu.md shows it): the
compute terms the cost model prices, measured where they run, each beside the model's term.

- blocks: one tp-8 shard of a block of the cost model's 1.3B shape (24 x 2048, 16 heads; 8 x 1024 tokens, its
  PREDICT_DEFAULTS), forward and backward, eager and torch.compile'd, in bf16: the shard's own modules
  (tpcomm/tp/sharded_layers.py: LN, its heads' attention, its columns of c_proj, LN, its hidden units of the
  MLP). The four block types run these same per-shard modules (they differ only in their syncs), so one shard
  block times them all. Beside each: the cost model's compute term, (24 d^2 + 4 d T)/tp FLOPs a token forward,
  twice that backward, at its MFU, and the efficiency the measurement implies (docs/gpu.json's
  blocks[].gemm_efficiency, which tpcomm/costmodel/cost_bands.py reads to narrow its GEMM-efficiency range).
- gemms: the shard's GEMMs whole and at 1/tp of the tokens (collective matmul's partial GEMMs), their
  efficiency.
- codecs: int8 and fp8 quantize + dequantize of one (N, d) partial sum (tpcomm.tp.compress.compression.Codec),
  beside the cost model's codec term (2n + 2 n_c bytes at HBM bandwidth plus two kernel launches).
The CPU rehearsal (--sizes=tiny) runs the same code at tiny sizes.
"""

import time

import torch

# the shape per gpu_check size: the cost model's 1.3B case on a GPU; a tiny one for the CPU rehearsal
CALIBRATION_SIZES = {"full": dict(n_embd=2048, n_head=16, tp=8, batch=8, seq=1024, iters=10),
                     "tiny": dict(n_embd=64, n_head=8, tp=8, batch=2, seq=16, iters=2)}


def timed(fn, device, iters):
    """Best-of seconds of fn() over iters calls after one warm-up (the device synchronised around each)."""
    from tpcomm.train.runtime import sync

    fn()
    best = float("inf")
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def shard_block(c, device):
    """(forward function of x (1, N, d), parameters) of one tp shard of a block: its
    real modules at local = 1."""
    from model import LayerNorm
    from tpcomm.model.options import TPConfig
    from tpcomm.tp.sharded_layers import ShardedAttention, ShardedMLP, layer_norm

    cfg = TPConfig(n_layer=1, n_head=c["n_head"], n_embd=c["n_embd"], tp_size=c["tp"], block_size=c["seq"],
                   bias=False)
    mods = torch.nn.ModuleDict(dict(ln_1=LayerNorm(c["n_embd"], bias=False), attn=ShardedAttention(cfg, 1),
                                    ln_2=LayerNorm(c["n_embd"], bias=False), mlp=ShardedMLP(cfg,
                                                                                            1))).to(device)

    def forward(x):
        x = x + mods["attn"].out(mods["attn"].heads(layer_norm(mods["ln_1"], x), c["seq"]))
        return x + mods["mlp"].out(mods["mlp"].hidden(layer_norm(mods["ln_2"], x)))

    return forward, mods


def block_rows(st, c, peak, mfu):
    """Forward and backward ms of the shard block, eager and compiled, beside the
    cost model's compute term."""
    device, ctx = st["device"], st["ctx"]
    forward, mods = shard_block(c, device)
    N, d, T, tp = c["batch"] * c["seq"], c["n_embd"], c["seq"], c["tp"]
    x = torch.randn(1, N, d, device=device, requires_grad=True)
    flops = (24 * d * d + 4 * d * T) / tp * N  # forward; backward twice it
    rows = []
    for mode in ("eager", "compiled"):
        fn = forward if mode == "eager" else torch.compile(forward, backend=st["size"]["compile_backend"])

        def fwd():
            with ctx:
                return fn(x)

        fwd_s = timed(fwd, device, c["iters"])
        bwd_s = timed(lambda: fwd().float().sum().backward(), device, c["iters"]) - fwd_s
        bwd_s = max(bwd_s, 1e-9)
        model_s = flops / (peak * mfu)
        rows.append(dict(type="shard block (tp, spd, parallel, ladder alike)", mode=mode, fwd_ms=fwd_s * 1e3,
                         bwd_ms=bwd_s * 1e3, model_fwd_ms=model_s * 1e3, model_bwd_ms=2 * model_s * 1e3,
                         gemm_efficiency=3 * flops / ((fwd_s + bwd_s) * peak)))
        mods.zero_grad(set_to_none=True)
    return rows


def gemm_rows(st, c, peak):
    """The shard's GEMMs (c_attn, c_fc columns; c_proj rows) at all N tokens and
    at N/tp: ms and efficiency."""
    device, dtype = st["device"], getattr(torch, st["size"]["dtype"])
    N, d, tp = c["batch"] * c["seq"], c["n_embd"], c["tp"]
    rows = []
    for name, k, n in (("c_attn", d, 3 * d // tp), ("attn c_proj", d // tp, d), ("c_fc", d, 4 * d // tp),
                       ("mlp c_proj", 4 * d // tp, d)):
        for tokens in (N, N // tp):
            a, b = torch.randn(tokens, k, device=device, dtype=dtype), torch.randn(k, n, device=device,
                                                                                   dtype=dtype)
            s = timed(lambda: a @ b, device, c["iters"])
            rows.append(dict(gemm=name, m=tokens, k=k, n=n, ms=s * 1e3,
                             efficiency=2 * tokens * k * n / (s * peak)))
    return rows


def codec_rows(st, c):
    """int8 and fp8 quantize + dequantize of one (N, d) bf16 partial sum, beside
    the cost model's codec term."""
    from tpcomm.tp.compress.compression import Codec
    from tpcomm.costmodel.cost_model import compressed_bytes, const

    device = st["device"]
    N, d = c["batch"] * c["seq"], c["n_embd"]
    x = torch.randn(N, d, device=device, dtype=torch.bfloat16)
    rows = []
    for dtype in ("int8", "fp8"):
        codec = Codec(dtype, 32)
        s = timed(lambda: codec.roundtrip(x), device, c["iters"])
        n, nc = N * d * 2, compressed_bytes(N * d)
        model_s = (2 * n + 2 * nc) / const("h100_hbm_bw") + 2 * const("kernel_launch")
        rows.append(dict(codec=dtype, values=N * d, ms=s * 1e3, model_ms=model_s * 1e3))
    return rows


def cost_calibration(st):
    """The section: blocks, gemms and codecs at the cost model's shape (tiny on the CPU rehearsal)."""
    from model import device_peak_flops
    from tpcomm.costmodel.cost_model import const

    c = CALIBRATION_SIZES[st["sizes"]]
    peak = device_peak_flops(st["device"], st["size"]["dtype"])
    # the CPU rehearsal has no peak: the H100's, so the code path runs (its efficiencies mean nothing, and
    # cost_bands reads efficiencies from a CUDA device's file only)
    peak_from = "device" if peak else "H100 datasheet (no peak for this device)"
    peak = peak or const("h100_bf16_flops")
    mfu = const("mfu")
    return dict(shape=c, peak_flops=peak, peak_from=peak_from, assumed_mfu=mfu,
                blocks=block_rows(st, c, peak, mfu), gemms=gemm_rows(st, c, peak), codecs=codec_rows(st, c))
