"""
`python comm_model.py predict`: the cost model's tables (tpcomm/costmodel/cost_model.py holds the equations
and constants): the checks against published figures, the training step per shape, tp and network, every
speedup against both baselines, the LLaMA2-70B decode latency and sequence parallelism's activation memory.
"""

from tpcomm.costmodel.collective_matmul_cost import BF16
from tpcomm.costmodel.cost_model import (BASELINES, CONSTANTS, LINKS, LLAMA_70B, TABLE_SHAPES,
                                         activation_bytes, check_config, const, decode_modules,
                                         decode_variants, error, options, predicted_speedups,
                                         published_checks, speedup, train_variants)
from tpcomm.experiments import ways


def predict(cfg):
    """The checks against published figures, then the GPU tables: training step time per model shape, tp and
    network against the chosen baseline, every speedup against both baselines, and LLaMA2-70B decode latency,
    with blocking, overlapped, delayed, shrunk and dropped syncs; sequence parallelism's activation memory;
    every constant with its source."""
    check_config(cfg)
    opts = options(cfg)
    print_published(cfg, opts)
    print_training(cfg, opts)
    print_both_baselines(cfg, opts)
    print_decode(cfg, opts)
    print_memory(cfg)
    print("\nConstants:")
    for name, c in CONSTANTS.items():
        print(f"- `{name}` = {c.value:g}{' ' + c.unit if c.unit else ''}: {c.source}")


def print_published(cfg, opts):
    print("## Checked against published figures (H100 SXM, NVLink, tp 8), before any new prediction\n")
    print(f"Domino: GPT-3 2.7B, 6.7B and 13B shapes, sequence 2048, micro-batch 4, 8 and 16, MFU "
          f"{cfg['mfu']:.0%}; Ladder: the 70B decode shape below, context {cfg['decode_context']}, batch "
          "1, 4, 16, 64. Overlap " f"efficiency {opts.efficiency:g}. Every check is printed with its error; "
          "a range's error at each end. Domino compares against Megatron-LM, whose backward already hides "
          "each input-gradient all-reduce behind its weight-gradient GEMM: the rows 'over Megatron-LM' "
          "model that; the rows 'as first checked' compare against a blocking baseline instead.\n")
    print("| figure | published | model | error |")
    print("|---|---:|---:|---:|")
    for what, published, model in published_checks(cfg, opts):
        one = "{:.0%}" if min(published if isinstance(published, tuple) else [published]) < 1 else "{:.2f}x"
        if isinstance(published, tuple):
            shown_p, shown_m = (" - ".join(one.format(x) for x in pair) for pair in (published, model))
            err = ", ".join(f"{end} {error(m, p):+.1f}%" for end, m, p in zip(("low", "high"), model,
                                                                              published))
        else:
            shown_p, shown_m, err = (one.format(published), one.format(model),
                                     f"{error(model, published):+.1f}%")
        print(f"| {what} | {shown_p} | {shown_m} | {err} |")


BASELINE_WORDS = {"megatron": "Megatron-LM's default all 'tp': 2L blocking forward all-reduces, and 2L "
                  "backward ones each issued asynchronously and hidden behind its column-parallel layer's "
                  "weight-gradient GEMM (c_attn 6 d^2, c_fc 8 d^2 FLOPs a token); every variant keeps "
                  "that rule for the backward all-reduces it keeps", "blocking": "all 'tp' with every "
                  "all-reduce blocking (4L); no variant hides a backward all-reduce behind its own wgrad "
                  "GEMM (the numbers this repository printed before the Megatron baseline)"}


def grid_ways():
    """The grid's variants: every way gpu-node times and the cost model prices, all 'tp' aside, in the table
    of ways' order (tpcomm/experiments/ways.py): a new way with a price and a gpu-node row is a new column."""
    return [w for w in ways.WAYS if w.price and w.node and w.price.term != "baseline"]


def column_names(K):
    """The grid's column of each grid way: its price label, tp_overlap's with the chunk count K filled in."""
    return list(dict.fromkeys(w.price.label.format(chunks=K) for w in grid_ways()))


def print_training(cfg, opts):
    """Training step per shape, tp and network: the chosen baseline's step, then
    the speedup of each variant."""
    tokens, K, base = cfg["batch_size"] * cfg["seq_len"], opts.chunks, cfg["baseline"]
    print(f"\n## Training step, H100 SXM bf16, MFU {cfg['mfu']:.0%}, micro-batch {cfg['batch_size']} x "
          f"{cfg['seq_len']} = {tokens:,} tokens per tp group, baseline {base}\n")
    legend = "; ".join(f"{w.price.label.format(chunks=K)}: {w.node.what}" for w in grid_ways())
    print(f"Baseline (--baseline={base}): {BASELINE_WORDS[base]}. Speedup = baseline step / the variant's "
          "step, " f"each variant as tpcomm/costmodel/cost_model.py prices it (overlap: tp_overlap={K} on "
          "every module, forward and backward; compressed syncs: forward reductions quantized, backward "
          "bf16). Columns, from the " f"table of ways (tpcomm/experiments/ways.py): {legend}.\n")
    names = column_names(K)
    print("| model | params | tp | network | compute ms | blocking step ms | megatron step ms | comm share | "
          + " | ".join(names) + " |")
    print("|---|---:|---:|---|---:|---:|---:|---:|" + "---:|" * len(names))
    skipped = []
    for shape in TABLE_SHAPES:
        for tp in (2, 4, 8):
            if shape.n_head % tp:
                skipped.append(f"{shape.name} at tp {tp} ({shape.n_head} heads)")
                continue
            for link in LINKS:
                kw = dict(tp=tp, link=link, tokens=tokens, seq_len=cfg["seq_len"], mfu=cfg["mfu"], opts=opts)
                blocking, megatron = (train_variants(shape, **kw, async_grad=a) for a in (False, True))
                v = megatron if base == "megatron" else blocking
                compute, comm = blocking["all tp"]
                print(f"| {shape.name} | {shape.params / 1e6:,.0f}M | {tp} | {link.name} | "
                      f"{compute * 1e3:.2f} | {(compute + comm) * 1e3:.2f} | "
                      f"{sum(megatron['all tp']) * 1e3:.2f} | {comm / (compute + comm):.1%} | " + " | "
                      "".join(f"{speedup(v, n):.2f}x" for n in names) + " |")
    print("\ncomm share: all time in collectives over the blocking step.")
    if skipped:
        print(f"Not shown: {', '.join(skipped)}: tp must divide the heads.")


def print_both_baselines(cfg, opts):
    """The figure's variants (1.3B, tp 8) and the table's tp 8 rows, each speedup against both baselines."""
    print("\n## Predicted speedups against both baselines (1.3B (24 x 2048), tp 8; `predicted_speedups`)\n")
    print("Each cell: speedup over Megatron's all 'tp' (async backward) / over the blocking all 'tp'. Names "
          "as the quality runs' (tpcomm.experiments.readings.pattern_name); all-ladder delays forward and "
          "backward all-reduces (the repo's ladder with tp_async_grad=True), all-ladder-fwd-only the "
          "forward ones (tp_async_grad=False); fp8 and int8 move the same bytes.\n")
    both = {link.name: {b: predicted_speedups(key, b, cfg=cfg) for b in BASELINES}
            for key, link in (("nvlink", LINKS[0]), ("ib", LINKS[1]))}
    print("| variant | " + " | ".join(f"{name}: megatron / blocking" for name in both) + " |")
    print("|---|" + "---:|" * len(both))
    for variant in next(iter(both.values()))["megatron"]:
        print(f"| {variant} | " + " | ".join(f"{s['megatron'][variant]:.2f}x / {s['blocking'][variant]:.2f}x"
                                              for s in both.values()) + " |")


def print_decode(cfg, opts):
    """Per-token decode latency of the LLaMA2-70B shape at tp 8: each variant's ms/token and speedup."""
    tp, batch = 8, cfg["decode_batch"]
    names = ("blocking", "ladder", "int8", "int8 2shot", "all spd")
    print(f"\n## Decode, LLaMA2-70B shape (80 layers, d 8192, GQA 8 KV heads, MLP 3 x d x 28672, 70B "
          f"params), tp {tp}, batch {batch}, context {cfg['decode_context']}, bf16\n")
    print("Per token: each module's weights/tp (attention: also its KV cache) read from HBM at the datasheet "
          f"bandwidth, then its all-reduce of batch x d x 2 B = {batch * LLAMA_70B.n_embd * BF16:,} B. "
          "blocking: all 'tp', 160 all-reduces; ladder: each hides behind the next module's reads; int8: "
          "one_shot exchange (an all-gather), int8 2shot: tp_comm_exchange='two_shot' (all-to-all + "
          "all-gather); all spd: 80 all-reduces. tp_overlap is left out: at decode a chunk re-reads the "
          "weights.")
    attn, mlp, _ = decode_modules(LLAMA_70B, context=cfg["decode_context"], batch=batch, tp=tp,
                                  hbm_bw=opts.hbm_bw)
    print(f"Reads per GPU: {attn * 1e6:.1f} us per attention module, {mlp * 1e6:.1f} us per MLP module.\n")
    print("| network | HBM reads ms | one all-reduce us | " + " | ".join(f"{n} ms/token" for n in names)
          + " | " + " | ".join(f"speedup: {n}" for n in names[1:]) + " |")
    print("|---|---:|---:|" + "---:|" * (2 * len(names) - 1))
    for link in LINKS:
        v = decode_variants(LLAMA_70B, context=cfg["decode_context"], batch=batch, tp=tp, link=link,
                            opts=opts)
        memory, comm = v["blocking"]
        print(f"| {link.name} | {memory * 1e3:.2f} | {comm / 160 * 1e6:.1f} | "
              + " | ".join(f"{sum(v[n]) * 1e3:.2f}" for n in names) + " | "
              + " | ".join(f"{speedup(v, n, base='blocking'):.2f}x" for n in names[1:]) + " |")
    target = const("spd_paper_saving")
    # saving = L t / (memory + 2 L t) = target  =>  t = target * memory / (L (1 - 2 target))
    needed = target * memory / (80 * (1 - 2 * target))
    print(f"\nThe SPD paper reports about {target:.0%} lower latency for LLaMA2-70B on 8 GPUs; this model "
          "gives " f"{target:.0%} when one all-reduce costs {needed * 1e6:.1f} us. HBM read at the datasheet "
          "rate makes the memory time a lower bound, so each saving above is an upper bound for its "
          "all-reduce time.")


def print_memory(cfg):
    """Activation memory per layer with and without sequence parallelism, at the
    training table's micro-batch."""
    s, b = cfg["seq_len"], cfg["batch_size"]
    print(f"\n## Activation memory per layer and GPU, sequence {s}, micro-batch {b}, 16-bit, no "
          "recomputation\n")
    print("tp: s b h (10 + 24/t + 5 a s / (h t)) bytes; with sequence parallelism s b h (34/t + 5 a s / (h "
          "t)): the LayerNorm and dropout regions' 10 s b h split over the t ranks too (arXiv 2205.05198, "
          "section 4).\n")
    print("| model | tp | tp MiB | tp + sp MiB | saved |")
    print("|---|---:|---:|---:|---:|")
    for shape in TABLE_SHAPES:
        for tp in (2, 8):
            if shape.n_head % tp:
                continue
            a, b_sp = (activation_bytes(seq=s, batch=b, d=shape.n_embd, heads=shape.n_head, tp=tp,
                                        sequence_parallel=on) for on in (False, True))
            print(f"| {shape.name} | {tp} | {a / 2 ** 20:,.0f} | {b_sp / 2 ** 20:,.0f} | {1 - b_sp / a:.0%} "
                  "|")
