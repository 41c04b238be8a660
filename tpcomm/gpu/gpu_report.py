"""
`make gpu-check`'s outputs (tpcomm/gpu/gpu_check.py runs the check): docs/gpu.json and the
generated section of docs/gpu.md.
"""

import json
import os

from tpcomm.model.block_types.registry import BLOCK_TYPES

# the block types the GPU check runs (tpcomm/gpu/gpu_check.py): every registered type that runs each of its
# option cases, int8 compression among them ('caat' moves a channel slice, not blocks; its class says so:
# compressible)
COMPRESSIBLE_TYPES = tuple(kind for kind, cls in BLOCK_TYPES.items() if cls.compressible)
BEGIN, END = "<!-- gpu-check:begin (written by python -m tpcomm.gpu.gpu_check) -->", "<!-- gpu-check:end -->"



def code_state(git):
    """'8a5aaf4', '8a5aaf4 with uncommitted changes', or 'unnamed code' (no git) for a report's git record."""
    return "unnamed code" if not git else git["commit"][:7] + (" with uncommitted "
                                                               "changes" if git["dirty"] else "")


def read_report(path):
    """The gpu.json at path, or None (missing or unreadable: check_out_dir has refused one
    that is not gpu_check's)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def mergeable(base, new):
    """Whether a run of some sections (new) can replace those sections of base: a full check on
    a GPU of the same name and sizes (its other numbers stay; the page says which sections were
    rerun, when and at what code)."""
    return (isinstance(base, dict) and str(base.get("device", "")).startswith("cuda")
            and base.get("sizes") == new["sizes"] and base.get("device_name") == new["device_name"]
            and isinstance(base.get("sections"), dict))


def merge_sections(base, new):
    """base with new's sections in place of its own, and the rerun recorded (sections,
    date, code state, torch)."""
    rerun = dict(sections=list(new["sections"]), date=new["date"], git=new.get("git"), torch=new["torch"])
    return dict(base, sections={**base["sections"], **new["sections"]},
                reruns=[*base.get("reruns", []), rerun])


def write_json(obj, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def fmt(x, spec=".2f", none="n/a"):
    return none if x is None else format(x, spec)


def _failed(s, name, lines):
    """True (with its line added) when section `name` did not run or failed."""
    r = s.get(name)
    if r is None:
        lines.append(f"- `{name}`: not run")
    elif r.get("error"):
        lines.append(f"- `{name}`: **failed** ({r['error'][:300]})")
    else:
        return False
    return True


def _measured_tables(s):
    """The training step, simulated tp 8 and decode: one short table each."""
    lines = ["**GPT training step** (`gpt_train`, bf16 autocast, synthetic batch):", ""]
    if not _failed(s, "gpt_train", lines):
        r = s["gpt_train"]
        lines += [f"| GPT {r['params'] / 1e6:.1f}M, batch {r['batch_size']} x "
                  f"{r['tokens_per_iter'] // r['batch_size']} | ms/iter | tokens/s | MFU |",
                  "|---|---:|---:|---:|"]
        for mode in ("eager", "compiled"):
            m = r[mode]
            lines.append(f"| {mode} | {m['ms_per_iter']:.1f} | {m['tokens_per_s']:,.0f} | "
                         f"{fmt(m['mfu'] and 100 * m['mfu'], '.1f')}{'%' if m['mfu'] is not None else ''} |")
        lines += ["", f"torch.compile ({r['compile_backend']}): {r['compiled_graphs']} compiled graph(s), "
                      f"{r['graph_breaks']} graph break(s) (one graph expected)."]
    lines += ["", "**Simulated tensor parallelism, tp 8** (`sim_tp8`, eager, step time over GPT's in the "
              "same rounds):", ""]
    if not _failed(s, "sim_tp8", lines):
        r = s["sim_tp8"]
        lines += ["| model | ms/iter | / GPT |", "|---|---:|---:|", f"| GPT | {r['ms_per_iter']['gpt']:.1f} "
                  "| 1 |"]
        lines += [f"| all `{k}` | {r['ms_per_iter'][k]:.1f} | {r['ratio_to_gpt'][k]:.2f} "
                  "|" for k in r['ratio_to_gpt']]
    lines += ["", "**KV-cache decode** (`decode`, greedy, simulated tp 8):", ""]
    if not _failed(s, "decode", lines):
        r = s["decode"]
        lines += [f"| model | batch | prefill ms ({r['prompt_len']} tokens) | ms/token |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {'GPT' if row['model'] == 'gpt' else 'all `' + row['model'] + '`'} | {row['batch']} | "
                  f"{row['prefill_ms']:.2f} | {row['ms_per_token']:.3f} |" for row in r["rows"]]
    return lines


def _check_lines(s):
    """One line per check: real tp, the collective's sanity, bf16 identity, the cost
    model and its calibration."""
    lines = []
    if not _failed(s, "real_tp", lines):
        r = s["real_tp"]
        lines.append(f"- `real_tp`: real tp 2 (2 processes, {r['backend']}, one device) vs simulated, "
                     f"{r['steps']} AdamW steps, {r['dtype']}: largest loss difference "
                     f"{r['max_abs_diff']:.2e} (bound {r['tolerance']:g}): "
                     f"**{'ok' if r['ok'] else 'FAILED'}**")
        if r.get("options"):
            lines.append(f"  - options, {r['option_steps']} steps each: " + "; ".join(
                f"{name} ({o['dtype']}) {o['max_abs_diff']:.1e} (bound {o['tolerance']:g}, "
                f"{'ok' if o['ok'] else 'FAILED'})" for name, o in r["options"].items()))
    if not _failed(s, "comm_sanity", lines):
        r = s["comm_sanity"]
        lines.append(f"- `comm_sanity`: {r['mib']} MiB all-reduce ({r['backend']}, {r['ranks']} ranks): "
                     f"{r['in_collective_ms']:.2f} ms in the collective, step {r['step_ms']:.2f} ms, floor "
                     f"{r['floor_ms']:.3f} ms: **{'ok' if r['ok'] else 'FAILED'}**")
    if not _failed(s, "bf16_identity", lines):
        r = s["bf16_identity"]
        both = {**r["max_deviation"], **r.get("train_loss_deviation", {})}  # an older gpu.json has none
        worst = sorted(both.items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"- `bf16_identity`: zeroed c_proj under bf16 autocast, largest stream or training-loss "
                     "deviation " f"{r['worst']:.2e} ({', '.join(f'{k}: {v:.1e}' for k, v in worst)}): "
                     f"**{'ok' if r['ok'] else 'FAILED'}**")
    if not _failed(s, "cost_model", lines):
        r = s["cost_model"]
        line = (f"- `cost_model`: assumed MFU {100 * r['assumed_mfu']:.0f}%, measured "
                f"{fmt(r['measured_mfu'] and 100 * r['measured_mfu'], '.1f')}"
                f"{'%' if r['measured_mfu'] is not None else ''} ({r['measured_from'] or 'n/a'})")
        if "predicted_ms_per_iter" in r:
            line += (f"; its compute term predicts {r['predicted_ms_per_iter']:.1f} ms/iter for the measured "
                     f"{r['measured_ms_per_iter']:.1f} ({r['error_pct']:+.0f}%)")
        lines.append(line)
    if not _failed(s, "cost_calibration", lines):
        r = s["cost_calibration"]
        c = r["shape"]
        lines.append(f"- `cost_calibration`: one tp-{c['tp']} shard block of d {c['n_embd']}, {c['batch']} x "
                     f"{c['seq']} " "tokens (fwd / bwd ms, the cost model's at its MFU in brackets): " + "; "
                     "".join(f"{b['mode']} {b['fwd_ms']:.3f} / {b['bwd_ms']:.3f} ({b['model_fwd_ms']:.3f} / "
                             f"{b['model_bwd_ms']:.3f}), GEMM efficiency {100 * b['gemm_efficiency']:.1f}%"
                             for b in r["blocks"]) + "; quantize + dequantize " + "; "
                     "".join(f"{k['codec']} {k['ms']:.3f} ms ({k['model_ms']:.3f})" for k in r["codecs"]))
    return lines


def markdown(report):
    """The generated section of gpu.md: what ran where, then one short table or line per section."""
    s = report["sections"]
    lines = [f"Measured by `python -m tpcomm.gpu.gpu_check --sizes={report['sizes']}` on {report['date']}: "
             f"**{report['device_name']}**, torch {report['torch']}, CUDA {report['cuda'] or 'n/a'}, "
             f"peak {fmt(report['peak_flops'] and report['peak_flops'] / 1e12, '.0f')} TFLOP/s (dense "
             "bf16), " f"{report['total_s']:.0f} s in all, at {code_state(report.get('git'))}. Raw numbers: "
             "`gpu.json` beside " f"this file.", ""]
    for rerun in report.get("reruns", []):
        lines += [f"Rerun on {rerun['date']} at {code_state(rerun['git'])} (torch {rerun['torch']}), in "
                  "place of " f"the first run's: {', '.join(f'`{name}`' for name in rerun['sections'])}.", ""]
    lines += _measured_tables(s)
    lines += ["", "**Checks**:", ""]
    lines += _check_lines(s)
    return "\n".join(lines) + "\n"


def write_markdown(report, path):
    """Replace the generated section of `path` (between BEGIN and END), keeping the hand-written rest; a
    missing file gets a title and the section."""
    body = f"{BEGIN}\n{markdown(report)}{END}"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            text = head + body + rest.split(END, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n## Measured by `make gpu-check`\n\n" + body + "\n"
    else:
        text = f"# GPU check\n\n{body}\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
