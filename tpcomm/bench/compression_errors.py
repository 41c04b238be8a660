"""
The measured error of one compressed reduction (docs/compression.md, "Measured error of one
reduction"): each tp_comm_dtype and block size of tpcomm/tp/compress/compression.py applied to the
partial sums a GPT's MLP reduces (GPT-2's initialization, simulated tp) or to heavy-tailed synthetic
ones, relative to the exact fp64 sum.

    python -m tpcomm.bench.compression_errors gpt  # the table of docs/compression.md (~20 s); heavy:
                                                   # synthetic data
"""

import sys

import torch

from model import GPT, GPTConfig
from tensor_parallel_model import DistributedGPT
from tpcomm.tp.compress.compression import QMAX, Codec

ERROR_DTYPES, ERROR_BLOCKS, ERROR_TPS = ("bf16", "fp8", "int8"), (16, 32, 64, 128), (2, 4, 8)
ERROR_MODEL = dict(n_layer=4, n_head=16, n_embd=1024, block_size=128, vocab_size=50304, bias=True)


def mlp_partials(tp, *, seed=0, batch=4, model=ERROR_MODEL):
    """The MLP c_proj partial outputs (tp, N, C), fp32, of every layer of a GPT-initialized
    DistributedGPT (GPT-2's init, simulated tp) on random tokens: the partial sums an MLP's g
    reduces, as a list over layers."""
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(**model, dropout=0.0))
    dgpt = DistributedGPT.from_gpt(gpt, tp).eval()
    captured, plain = [], dgpt.group.sum_shards

    def capture(x):  # uncompressed, g sums with sum_shards (no backward runs: it is g's only use here)
        captured.append(x.detach().clone())
        return plain(x)

    dgpt.group.sum_shards = capture
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(model["vocab_size"], (batch, model["block_size"]), generator=g)
    with torch.no_grad():
        dgpt(idx)
    return captured[1::2]  # each 'tp' block reduces attention's partials, then the MLP's


def heavy_tailed_partials(tp, *, seed=0, n=512, C=1024):
    """Activation-like synthetic partials (tp, n, C): Student-t (3 degrees of freedom) values with 8 outlier
    channels 30x larger, the same channels on every shard (as trained LLMs' outlier features are)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(4, tp, n, C, generator=g)
    x = 0.05 * z[0] / (z[1:].square().mean(0)).sqrt()  # t_3 = z / sqrt(chi2_3 / 3)
    x[..., torch.randperm(C, generator=g)[:8]] *= 30
    return [x]


def relative_error(parts, codec):
    """||g(s) - sum_i s_i|| / ||sum_i s_i|| (Frobenius), g the codec's compressed reduction (one_shot: sum_i
    deq(s_i); two_shot: deq(q(that))), both sums in fp64 so only compression counts."""
    exact = parts.double().sum(0)
    got = codec.roundtrip(parts).double().sum(0)
    if codec.exchange == "two_shot":
        got = codec.roundtrip(got)
    return ((got - exact).norm() / exact.norm()).item()


def reduction_errors(*, dtypes=ERROR_DTYPES, blocks=ERROR_BLOCKS, tps=ERROR_TPS, source="gpt", seed=0,
                     two_shot_blocks=(32,)):
    """Rows {dtype, block, exchange, bytes_per_value, bytes_ratio (vs fp32), source, err_tp<t>: mean
    relative error over the layers}: one compressed reduction per dtype and block size at each tp,
    one_shot, and two_shot at two_shot_blocks. source 'gpt' (mlp_partials) or 'heavy'
    (heavy_tailed_partials). bf16 has no blocks: block None."""
    make = dict(gpt=mlp_partials, heavy=heavy_tailed_partials)[source]
    parts = {tp: make(tp, seed=seed) for tp in tps}
    rows = []
    for dtype in dtypes:
        settings = [(b, "one_shot") for b in (blocks if dtype in QMAX else [None])]
        settings += [(b, "two_shot") for b in (two_shot_blocks if dtype in QMAX else [None])]
        for block, exchange in settings:
            codec = Codec(dtype, block or 1, exchange)
            per_value = codec.payload_bytes(1 if block is None else block) / (block or 1)
            row = dict(source=source, dtype=dtype, block=block, exchange=exchange, bytes_per_value=per_value,
                       bytes_ratio=per_value / 4)
            for tp in tps:
                row[f"err_tp{tp}"] = sum(relative_error(p, codec) for p in parts[tp]) / len(parts[tp])
            rows.append(row)
    return rows


def error_table(rows):
    """reduction_errors rows as a markdown table."""
    tps = [k for k in rows[0] if k.startswith("err_tp")]
    head = ["data", "dtype", "block", "exchange", "bytes/value", "vs fp32",
            *[f"rel. error tp={k[6:]}" for k in tps]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["source"], r["dtype"], "-" if r["block"] is None else str(r["block"]), r["exchange"],
                 f"{r['bytes_per_value']:.4g}", f"{r['bytes_ratio']:.3f}", *[f"{r[k]:.2e}" for k in tps]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv):
    """python -m tpcomm.bench.compression_errors [gpt] [heavy]: the error table of
    docs/compression.md (both: no argument)."""
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        return 0
    for source in argv or ["gpt", "heavy"]:
        if source not in ("gpt", "heavy"):
            print(f"error: unknown data {source!r}; use gpt or heavy", file=sys.stderr)
            return 2
        print(error_table(reduction_errors(source=source)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
