"""
Ladder Residual (arXiv 2501.06589) on a trained checkpoint, the paper's adaptation of a trained model: the
upper half of the blocks become 'ladder' blocks (each module reads the stream from before the previous
module's output is added, so that output's all-reduce overlaps this module's compute), evaluated zero-shot,
then the whole converted model retrained briefly on the training data. A control retrains the original
(all-'tp') model the same way, so the recovery is not mistaken for the extra training. Run through spd.py:

$ python spd.py --block=ladder --out_dir=out-shakespeare-char --tp_size=4 --retrain_steps=200
$ python sample.py --out_dir=out-shakespeare-char/ladder       # the converted model

Every loss is measured on one fixed set of validation batches (seeded), the same for every model; all-reduce
counts come from the model's own counters (comm_per_forward).
"""

import json
import os
import sys

import torch
from tqdm import tqdm

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_on_config_error
from tpcomm.train.checkpoint import CHECKPOINT_NAME, save_checkpoint
from tpcomm.train.runtime import RunLock, pick_device
from tpcomm.convert.sync_point_drop import (check_overwrite, converted_checkpoint, distributed, find_data,
                                            load_gpt, mean_loss, token_batches)

DEFAULTS = dict(
    out_dir="out",  # the trained checkpoint (out_dir/ckpt.pt); results go to out_dir/ladder/
    tp_size=4,  # the converted model's tp_size (the ladder's math does not depend on it; its all-reduces do)
    dataset="",  # '' = the checkpoint's own
    data_dir="",  # '' = the checkpoint's data_dir, else data/<dataset>
    device="cpu",
    seed=1337,
    eval_iters=20,  # fixed validation batches of batch_size x block_size tokens
    batch_size=8,
    block_size=0,  # 0 = the checkpoint's
    # how many of the top blocks become 'ladder'; -1: the upper half (the paper's), n_layer // 2
    ladder_layers=-1,
    retrain_steps=200,  # AdamW steps on train.bin of the whole converted model (0: zero-shot only)
    retrain_batch_size=8,
    # constant, after retrain_steps // 10 steps of linear warmup; gradients clipped to norm 1
    retrain_lr=3e-4,
    control=True,  # also retrain the original model the same way (same batches, steps, learning rate)
    # replace out_dir/ladder/ckpt.pt if an earlier conversion left one (it may be trained since)
    overwrite=False,
)


def check_ladder_settings(cfg):
    """Every check that needs no file."""
    if not isinstance(cfg["tp_size"], int) or cfg["tp_size"] < 1:
        raise ConfigError(f"tp_size must be a positive int, got {cfg['tp_size']!r}")
    for key in ("eval_iters", "batch_size", "retrain_batch_size"):
        if cfg[key] < 1:
            raise ConfigError(f"{key} must be >= 1, got {cfg[key]}")
    for key in ("retrain_steps", "block_size", "seed"):
        if cfg[key] < 0:
            raise ConfigError(f"{key} must be >= 0, got {cfg[key]}")
    if cfg["ladder_layers"] < -1 or cfg["ladder_layers"] == 0:
        raise ConfigError(f"ladder_layers must be -1 (the upper half) or a number of blocks >= 1 (0 would "
                          "write a " f"'ladder' checkpoint with no ladder block), got {cfg['ladder_layers']}")
    if not cfg["retrain_lr"] >= 0:
        raise ConfigError(f"retrain_lr must be >= 0, got {cfg['retrain_lr']}")


def ladder_pattern(n_layer, k):
    """The top k blocks 'ladder', the rest 'tp' (k = -1: the upper half, n_layer // 2)."""
    k = n_layer // 2 if k == -1 else k
    return ("tp",) * (n_layer - k) + ("ladder",) * k


def comm_counts(model, probe):
    """(forward all-reduces, of them issued asynchronously) of one pass, measured."""
    report = model.comm_per_forward(probe)
    return int(report["fwd_allreduces"]), int(report.get("async_allreduces", 0))


def retrain(gpt, state, tp_size, pattern, batches, *, lr):
    """The whole model of `pattern` trained on `batches` ((X, Y) each (n, B, T)) with AdamW:
    linear warmup over the first tenth of the steps, then constant lr, gradients clipped to
    norm 1. Returns its GPT-layout weights."""
    model = distributed(gpt, state, tp_size, pattern).train()
    optimizer = model.configure_optimizers(0.1, lr, (0.9, 0.95), next(model.parameters()).device.type)
    X, Y = batches
    warmup = max(1, len(X) // 10)
    for step, (x, y) in enumerate(tqdm(list(zip(X, Y)), desc=f"retrain "
                                       f"{''.join(k[0].upper() for k in pattern)}", leave=False,
                                       file=sys.stderr)):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        model.clip_grad_norm_(1.0)
        optimizer.step()
    return model.eval().gpt_state_dict()


def convert(cfg, gpt, X, Y, train, probe):
    """The rows of the result: original, ladder zero-shot, ladder retrained, original retrained (control); and
    the retrained ladder's weights (None without retraining)."""
    n_layer, tp = gpt.config.n_layer, cfg["tp_size"]
    state = {k: v.detach() for k, v in gpt.state_dict().items()}
    original, ladder = ("tp",) * n_layer, ladder_pattern(n_layer, cfg["ladder_layers"])

    def row(name, pattern, weights, steps):
        model = distributed(gpt, weights, tp, pattern)
        fwd, overlapped = comm_counts(model, probe)
        return dict(model=name, pattern=list(pattern), retrain_steps=steps, fwd_allreduces=fwd,
                    async_allreduces=overlapped, loss=mean_loss(model, X, Y))

    rows = [row("original", original, state, 0), row("ladder, zero-shot", ladder, state, 0)]
    final = None
    if train is not None:
        steps = len(train[0])
        final = retrain(gpt, state, tp, ladder, train, lr=cfg["retrain_lr"])
        rows.append(row("ladder, retrained", ladder, final, steps))
        if cfg["control"]:
            rows.append(row("original, retrained (control)", original,
                            retrain(gpt, state, tp, original, train, lr=cfg["retrain_lr"]), steps))
    return rows, final


def write_table(path, result):
    rows = result["rows"]
    base = rows[0]["loss"]
    lines = [f"# Ladder Residual conversion of {result['out_dir']} at tp_size {result['tp_size']}", "",
             f"Top {result['ladder_layers']} of {result['n_layer']} blocks 'ladder'. Validation loss on "
             f"{result['eval_tokens']:,} tokens ({result['eval_iters']} fixed batches); retraining: "
             f"{result['retrain_steps']} AdamW steps of {result['retrain_tokens_per_step']:,} tokens, lr "
             f"{result['retrain_lr']}.", "",
             "| model | pattern (T = tp, L = ladder) | fwd all-reduces (async) | retrain steps | val loss | "
             "gap to original |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {''.join(k[0].upper() for k in r['pattern'])} | "
                     f"{r['fwd_allreduces']} ({r['async_allreduces']}) | {r['retrain_steps']} | "
                     f"{r['loss']:.4f} | {r['loss'] - base:+.4f} |")
    by = {r["model"]: r["loss"] for r in rows}
    if "ladder, retrained" in by:
        # the gap that retraining closes, measured against the original trained as long (the control) when
        # there is one: retraining also lowers the original's loss, and that part is not the ladder's recovery
        ref, name = by.get("original, retrained (control)",
                           base), "the control" if len(rows) > 3 else "the original"
        gap0, gap1 = by["ladder, zero-shot"] - base, by["ladder, retrained"] - ref
        lines += ["", f"Zero-shot gap {gap0:+.4f} nats to the original; after retraining {gap1:+.4f} to "
                  f"{name}" + (f" ({1 - gap1 / gap0:.1%} of the zero-shot gap closed)." if gap0 > 0 else ".")]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    check_ladder_settings(cfg)
    device = pick_device(cfg["device"])
    checkpoint, gpt = load_gpt(dict(cfg, num_spd=-1), what="spd.py --block=ladder")
    n_layer = gpt.config.n_layer
    if cfg["ladder_layers"] > n_layer:
        raise ConfigError(f"ladder_layers ({cfg['ladder_layers']}) exceeds the checkpoint's number of "
                          "blocks, n_layer " f"({n_layer}); give at most {n_layer}, or -1 for the upper half")
    if ladder_pattern(n_layer, cfg["ladder_layers"]).count("ladder") == 0:
        raise ConfigError(f"ladder_layers=-1 (the upper half) of n_layer={n_layer} is no block: give "
                          "ladder_layers=1")
    data_dir = find_data(cfg, checkpoint, train=cfg["retrain_steps"] > 0)
    block_size = cfg["block_size"] or gpt.config.block_size
    if block_size > gpt.config.block_size:
        raise ConfigError(f"block_size ({block_size}) exceeds the checkpoint's ({gpt.config.block_size})")
    out = os.path.join(cfg["out_dir"], "ladder")
    check_overwrite(out, cfg)
    torch.manual_seed(cfg["seed"])
    gpt.to(device)
    X, Y = (t.to(device) for t in token_batches(os.path.join(data_dir, "val.bin"), n=cfg["eval_iters"],
                                                  batch_size=cfg["batch_size"], block_size=block_size,
                                                  seed=cfg["seed"]))
    train = None
    if cfg["retrain_steps"]:
        train = tuple(t.to(device) for t in token_batches(
            os.path.join(data_dir, "train.bin"), n=cfg["retrain_steps"], batch_size=cfg["retrain_batch_size"],
            block_size=block_size, seed=cfg["seed"] + 1))
    with RunLock(out, what="spd.py --block=ladder run"):
        rows, final = convert(cfg, gpt, X, Y, train, X[0][:1, :8])
        pattern = rows[1]["pattern"]
        result = dict(out_dir=cfg["out_dir"], tp_size=cfg["tp_size"], n_layer=n_layer,
                      ladder_layers=pattern.count("ladder"), eval_iters=cfg["eval_iters"],
                      eval_tokens=cfg["eval_iters"] * cfg["batch_size"] * block_size,
                      retrain_steps=cfg["retrain_steps"], retrain_lr=cfg["retrain_lr"],
                      retrain_tokens_per_step=cfg["retrain_batch_size"] * block_size, rows=rows, settings=cfg)
        with open(os.path.join(out, "ladder.json"), "w") as f:
            json.dump(result, f, indent=2)
        write_table(os.path.join(out, "ladder.md"), result)
        weights = final if final is not None else {k: v.detach() for k, v in gpt.state_dict().items()}
        loss = rows[1 if final is None else 2]["loss"]  # the ladder model written: zero-shot or retrained
        save_checkpoint(converted_checkpoint(checkpoint, gpt, weights, cfg["tp_size"], pattern, out, loss),
                        out)
    print(open(os.path.join(out, "ladder.md")).read())
    print(f"wrote {out}/ladder.md, ladder.json and {CHECKPOINT_NAME} (sample it: python sample.py "
          f"--out_dir={out})")


# python -m tpcomm.convert.ladder_conversion --out_dir=... is spd.py --block=ladder --out_dir=...
if __name__ == "__main__":
    main(sys.argv[1:])
