"""
Sync-Point Drop (arXiv 2502.20727, ICML 2025) the paper's way, on a trained checkpoint: measure each block's
sensitivity to dropping its attention all-reduce at a given tp_size, classify the blocks (insensitive: dropped
zero-shot; sensitive: block-to-block distillation; extremely sensitive: head grouping, then distillation), and
write the loss-vs-syncs curve, a table, a plot and the converted DistributedGPT checkpoint.

$ python spd.py --out_dir=out-shakespeare-char --tp_size=4
$ python spd.py --out_dir=out-gpt2 --tp_size=4 --distill_steps=1000 --kl_steps=200 --latency_json=lat.json
$ python sample.py --out_dir=out-shakespeare-char/spd       # the converted model

Everything is measured on one fixed set of validation batches (seeded), the same for every candidate;
all-reduce counts come from the model's own counters (comm_per_forward), never from a formula.
"""

import json
import os
import sys

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from tpcomm import ROOT
from tpcomm.convert.head_grouping import block_input, head_grouping, permute_heads_and_units
from tpcomm.train.runtime import RunLock, pick_device
from tpcomm.train.checkpoint import (CHECKPOINT_NAME, build_model_from_checkpoint, load_checkpoint,
                                     model_spec, save_checkpoint)
from tpcomm.errors import ConfigError
from tpcomm.configuration import configure, exit_on_config_error
from model import GPTConfig
from tensor_parallel_model import DistributedGPT
from tpcomm.model.block_types.registry import BLOCK_TYPES
from tpcomm.model.options import TPConfig, validate_tp_args

DEFAULTS = dict(
    out_dir="out",  # the trained checkpoint (out_dir/ckpt.pt); results go to out_dir/spd/
    tp_size=4,
    dataset="",  # '' = the checkpoint's own
    data_dir="",  # '' = the checkpoint's data_dir, else data/<dataset>
    device="cpu",
    seed=1337,
    eval_iters=20,  # fixed validation batches of batch_size x block_size tokens
    batch_size=8,
    block_size=0,  # 0 = the checkpoint's
    order="paper",  # sensitivity that orders and classifies the blocks: 'paper' (backward sweep) | 'single'
    tau_isb=0.01,  # loss increase (nats) below which a block is insensitive: dropped zero-shot
    tau_esb=0.1,  # at or above which it is extremely sensitive: head grouping, then distillation
    head_grouping=True,
    distill_steps=200,  # block-to-block distillation steps per sensitive block (0: none)
    distill_batch_size=8,
    distill_lr=3e-4,
    kl_steps=0,  # then distillation of the chosen conversion from the original model's logits (KL); 0: none
    kl_lr=1e-4,
    # blocks to convert in the checkpoint; -1: the most whose recovered loss is within max_loss_increase
    num_spd=-1,
    max_loss_increase=0.02,  # nats over the original model's validation loss
    latency_json="",  # optional: {"tp,spd,...": ms_per_token} measured per block pattern (see bench.py)
    # replace out_dir/spd/ckpt.pt if an earlier conversion left one (it may be trained since)
    overwrite=False,
)

ORDERS = ("paper", "single")
CLASSES = ("ISB", "SB", "ESB")  # insensitive, sensitive, extremely sensitive (the paper's names)


def check_spd_settings(cfg):
    """Every check that needs no file."""
    if not isinstance(cfg["tp_size"], int) or cfg["tp_size"] < 2:
        raise ConfigError(f"tp_size must be an int >= 2 (at tp_size 1 nothing is communicated), got "
                          f"{cfg['tp_size']!r}")
    for key in ("eval_iters", "batch_size", "distill_batch_size"):
        if cfg[key] < 1:
            raise ConfigError(f"{key} must be >= 1, got {cfg[key]}")
    for key in ("distill_steps", "kl_steps", "block_size", "seed"):
        if cfg[key] < 0:
            raise ConfigError(f"{key} must be >= 0, got {cfg[key]}")
    if cfg["order"] not in ORDERS:
        raise ConfigError(f"order must be one of {ORDERS}, got {cfg['order']!r}")
    if not cfg["tau_isb"] <= cfg["tau_esb"]:  # negative thresholds are meaningful: a drop may lower the loss
        raise ConfigError(f"need tau_isb <= tau_esb, got tau_isb={cfg['tau_isb']}, tau_esb={cfg['tau_esb']}")
    if cfg["num_spd"] < -1:
        raise ConfigError(f"num_spd must be -1 (auto) or a number of blocks, got {cfg['num_spd']}")
    for key in ("distill_lr", "kl_lr", "max_loss_increase"):
        if not cfg[key] >= 0:
            raise ConfigError(f"{key} must be >= 0, got {cfg[key]}")
    if cfg["latency_json"] and not os.path.isfile(cfg["latency_json"]):
        raise ConfigError(f"latency_json: no such file {cfg['latency_json']!r}")


def check_overwrite(out, cfg):
    """A conversion never replaces the checkpoint an earlier one wrote in `out` (it may have been trained
    since) unless the user asks: checked after every other input check, before anything is written."""
    if not isinstance(cfg["overwrite"], bool):
        raise ConfigError(f"overwrite must be True or False, got {cfg['overwrite']!r}")
    path = os.path.join(out, CHECKPOINT_NAME)
    if os.path.lexists(path) and not cfg["overwrite"]:
        raise ConfigError(f"overwrite=False but {path} exists (an earlier conversion, perhaps trained "
                          "since): give " f"--overwrite=True to replace it, or move it away")


def read_latencies(path, n_layer):
    """{pattern tuple: ms/token} from a JSON object whose keys are block patterns,
    'tp,spd,...' or letters 'TS..'."""
    if not path:
        return {}
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"latency_json: {path!r} is not JSON ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"latency_json: {path!r} must hold an object mapping block patterns to ms/token")
    letters = {kind[0].upper(): kind for kind in BLOCK_TYPES}
    out = {}
    for key, ms in raw.items():
        kinds = key.split(",") if "," in key else [letters.get(c.upper(), c) for c in key]
        kinds = [k.strip() for k in kinds]
        if len(kinds) != n_layer or any(k not in BLOCK_TYPES for k in kinds) or not isinstance(ms,
                                                                                               (int, float)):
            raise ConfigError(f"latency_json: entry {key!r}: {ms!r} is not a pattern of {n_layer} of "
                              f"{list(BLOCK_TYPES)} mapped to a number")
        out[tuple(kinds)] = float(ms)
    return out


def load_gpt(cfg, *, what="spd.py"):
    """(checkpoint, GPT): a 'gpt' checkpoint, or a 'distributed_gpt' one whose blocks are all 'tp' (exactly
    GPT). what: the tool, for the error messages."""
    checkpoint = load_checkpoint(cfg["out_dir"])  # a config that contradicts the weights: refused there
    model = build_model_from_checkpoint(checkpoint, dropout=0.0)
    if isinstance(model, DistributedGPT):
        if any(kind != "tp" for kind in model.config.block_types):
            raise ConfigError(f"the checkpoint's blocks are {model.config.block_types}; {what} converts a "
                              "GPT " f"(or an all-'tp' DistributedGPT, which is GPT)")
        model = model.to_gpt()
    c = model.config
    validate_tp_args(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, tp_size=cfg["tp_size"],
                     block_types=None)
    if cfg["num_spd"] > c.n_layer:
        raise ConfigError(f"num_spd ({cfg['num_spd']}) exceeds the checkpoint's number of blocks, n_layer "
                          f"({c.n_layer}); give at most {c.n_layer}, or -1 to choose by max_loss_increase")
    return checkpoint, model.eval()


def find_data(cfg, checkpoint, *, train=None):
    """The directory holding val.bin (and train.bin if `train`; None: if cfg
    distills), as train.py finds it."""
    trained = checkpoint.get("config") or {}  # the training run's config
    dataset = cfg["dataset"] or trained.get("dataset") or ""
    data_dir = cfg["data_dir"] or (trained.get("data_dir") if not cfg["dataset"] else None) or \
        os.path.join(ROOT, "data", dataset)
    train = cfg["distill_steps"] or cfg["kl_steps"] if train is None else train
    need = ["val.bin"] + (["train.bin"] if train else [])
    for name in need:
        if not os.path.isfile(os.path.join(data_dir, name)):
            raise ConfigError(f"no {name} in {data_dir!r} (dataset={dataset!r}); give --dataset or "
                              "--data_dir")
    return data_dir


def token_batches(path, *, n, batch_size, block_size, seed):
    """n batches (n, batch_size, block_size) of inputs and targets, random crops of a
    uint16 token file, seeded."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if len(data) <= block_size + 1:
        raise ConfigError(f"{path} has {len(data)} tokens, too few for block_size {block_size}")
    ix = np.random.default_rng(seed).integers(0, len(data) - block_size - 1, size=(n, batch_size))
    x = np.stack([[data[i:i + block_size] for i in row] for row in ix]).astype(np.int64)
    y = np.stack([[data[i + 1:i + 1 + block_size] for i in row] for row in ix]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


# ---------- the converted models ----------

def distributed(gpt, state, tp_size, pattern):
    """DistributedGPT with block pattern `pattern` and the GPT-layout weights `state`."""
    config = TPConfig(**{k: getattr(gpt.config, k) for k in GPTConfig.__dataclass_fields__}, tp_size=tp_size,
                      block_types=list(pattern))
    model = DistributedGPT(config)
    model.load_gpt_state_dict(state)
    return model.to(gpt.lm_head.weight.device).eval()


@torch.no_grad()
def mean_loss(model, X, Y):
    return sum(model(x, y)[1].item() for x, y in zip(X, Y)) / len(X)


def fwd_allreduces(model, idx):
    return int(model.comm_per_forward(idx)["fwd_allreduces"])


class Evaluator:
    """Validation loss of (pattern, weights) on the fixed batches, each candidate computed once."""

    def __init__(self, gpt, tp_size, X, Y, bar):
        self.gpt, self.tp, self.X, self.Y, self.bar = gpt, tp_size, X, Y, bar
        self.cache = {}

    def __call__(self, pattern, state, tag="original"):
        key = (tuple(pattern), tag)
        if key not in self.cache:
            self.cache[key] = mean_loss(distributed(self.gpt, state, self.tp, pattern), self.X, self.Y)
        self.bar.update(1)
        return self.cache[key]


def spd_pattern(n_layer, spd_layers):
    return tuple("spd" if i in spd_layers else "tp" for i in range(n_layer))


def sensitivities(evaluate, state, n_layer):
    """Per block i, the validation-loss increase from dropping its attention sync (zero-shot): single[i]: only
    block i is 'spd'; paper[i]: block i becomes 'spd' with the blocks after it already 'spd' and those before
    it 'tp' (the backward sweep; the paper[i] sum to the all-'spd' model's increase)."""
    base = evaluate(spd_pattern(n_layer, ()), state)
    single = [evaluate(spd_pattern(n_layer, {i}), state) - base for i in range(n_layer)]
    suffix = [evaluate(spd_pattern(n_layer, set(range(i, n_layer))), state) for i in range(n_layer)] + [base]
    paper = [suffix[i] - suffix[i + 1] for i in range(n_layer)]
    return base, single, paper


def mixed(state, recovered, pattern):
    """Weights for `pattern`: the recovered (grouped, distilled) weights of its 'spd' blocks, the
    original weights elsewhere (a distilled block was trained as an 'spd' block; as a 'tp' block its
    original weights are exact)."""
    out = dict(state)
    for i, kind in enumerate(pattern):
        if kind == "spd":
            out.update(block_keys(recovered, i))
    return out


def classify(s, tau_isb, tau_esb):
    return "ISB" if s < tau_isb else "SB" if s < tau_esb else "ESB"


# ---------- recovery ----------

def block_keys(state, layer):
    p = f"transformer.h.{layer}."
    return {k: v for k, v in state.items() if k.startswith(p)}


@torch.no_grad()
def b2b_loss(gpt, block, layer, X):
    """Mean over batches of the MSE between the 'spd' block's output and the original block's, on X."""
    total = 0.0
    for idx in X:
        x = block_input(gpt, idx, layer)
        target = gpt.transformer.h[layer](x)
        B, T, C = x.shape
        total += F.mse_loss(block(x.view(B * T, C), None, T)[0], target.view(B * T, C)).item()
    return total / len(X)


def distill_block(gpt, state, layer, tp_size, train_X, heldout_X, *, lr, desc=""):
    """Block-to-block distillation (the paper's recovery of a sensitive block): block `layer` as an 'spd'
    block, starting from `state`, trained alone to reproduce the original block's output (MSE) on the original
    model's block inputs. Returns (the block's new GPT-layout weights, held-out MSE before, after)."""
    model = distributed(gpt, state, tp_size, spd_pattern(gpt.config.n_layer, {layer}))
    block = model.transformer.h[layer]
    before = b2b_loss(gpt, block, layer, heldout_X)
    optimizer = torch.optim.AdamW(block.parameters(), lr=lr, weight_decay=0.0)
    for idx in tqdm(train_X, desc=desc, leave=False, file=sys.stderr):
        x = block_input(gpt, idx, layer)
        with torch.no_grad():
            target = gpt.transformer.h[layer](x)
        B, T, C = x.shape
        loss = F.mse_loss(block(x.view(B * T, C), None, T)[0], target.view(B * T, C))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    after = b2b_loss(gpt, block, layer, heldout_X)
    return block_keys(model.gpt_state_dict(), layer), before, after


def kl_to_teacher(student, teacher, idx):
    """Mean over tokens of KL(teacher || student) of the next-token distributions."""
    t = F.log_softmax(teacher(idx, idx)[0].flatten(0, 1), dim=-1)  # with targets: logits at every position
    s = F.log_softmax(student(idx, idx)[0].flatten(0, 1), dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def distill_kl(gpt, state, tp_size, pattern, train_X, heldout_X, *, lr):
    """Distillation from the original model's logits: the converted model's 'spd' blocks (only those
    train) fitted to the original model's next-token distributions (KL). Returns (new GPT-layout state,
    held-out KL before, after)."""
    model = distributed(gpt, state, tp_size, pattern)
    params = [p for i,
              kind in enumerate(pattern) if kind == "spd" for p in model.transformer.h[i].parameters()]

    def heldout():
        with torch.no_grad():
            return sum(kl_to_teacher(model, gpt, idx).item() for idx in heldout_X) / len(heldout_X)

    before = heldout()
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    for idx in tqdm(train_X, desc="KL distillation", leave=False, file=sys.stderr):
        loss = kl_to_teacher(model, gpt, idx)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.gpt_state_dict(), before, heldout()


# ---------- the run ----------

def choose_num_spd(cfg, curve, base):
    if cfg["num_spd"] >= 0:
        return cfg["num_spd"]  # at most n_layer: load_gpt checked it
    ok = [row["spd_blocks"] for row in curve if row["recovered_loss"] <= base + cfg["max_loss_increase"]]
    return max(ok)


def write_table(path, result):
    kept = {None: "", True: "yes", False: "no"}
    lines = [f"# Sync-Point Drop of {result['out_dir']} at tp_size {result['tp_size']}", "", f"Original "
             f"validation loss {result['base_loss']:.4f} ({result['eval_tokens']:,} tokens, "
             f"{result['eval_iters']} fixed batches). Loss increases in nats; classes by the "
             f"'{result['order']}' sensitivity: ISB < {result['tau_isb']} <= SB < {result['tau_esb']} <= "
             "ESB.", "", "## Per block", "", "| block | single Δ | paper Δ | class | head grouping Δ | "
             "recovered Δ | B2B MSE before | after | kept |", "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f=".4f": "" if v is None else format(v, f)  # noqa: E731
    for b in result["blocks"]:
        lines.append(f"| {b['block']} | {fmt(b['single'])} | {fmt(b['paper'])} | {b['class']} | "
                     f"{fmt(b['grouped'])} | {fmt(b['recovered'])} | {fmt(b['mse_before'], '.3g')} | "
                     f"{fmt(b['mse_after'], '.3g')} | {kept[b['b2b_kept']]} |")
    lines += ["", "## Greedy curve (blocks dropped in order of increasing sensitivity)", "", "| SPD blocks | "
              "pattern | fwd all-reduces | zero-shot loss | recovered loss | decode ms/token |",
              "|---|---|---|---|---|---|"]
    for row in result["curve"]:
        lines.append(f"| {row['spd_blocks']} | {''.join(k[0].upper() for k in row['pattern'])} | "
                     f"{row['fwd_allreduces']} | {row['zero_shot_loss']:.4f} | {row['recovered_loss']:.4f} | "
                     f"{fmt(row['ms_per_token'], '.3f')} |")
    c = result["conversion"]
    lines += ["", "## Conversion written", "",
              f"{c['spd_blocks']} SPD blocks, {c['fwd_allreduces']} forward all-reduces "
              f"(all-'tp': {result['curve'][0]['fwd_allreduces']}); pattern {c['pattern']}.", "",
              "| stage | val loss | gap to original | gap closed |", "|---|---|---|---|"]
    for stage in c["stages"]:
        lines.append(f"| {stage['stage']} | {stage['loss']:.4f} | {stage['gap']:.4f} | "
                     f"{fmt(stage['closed'], '.1%')} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(path, result):
    """The figure (tpcomm/figures/command_figures.draw_spd) and its data file beside it."""
    from tpcomm.figures import command_figures

    data = command_figures.spd_data(result)
    command_figures.write(command_figures.draw_spd(data), path, data)


def converted_checkpoint(checkpoint, gpt, state, tp_size, pattern, spd_dir, loss):
    """The input checkpoint's dict with the converted model: model_type 'distributed_gpt' and
    its block pattern; a fresh (empty) optimizer state, so train.py --init_from=resume can
    fine-tune it from iteration 0."""
    model = distributed(gpt, state, tp_size, pattern)
    run = dict(checkpoint.get("config") or {})
    optimizer = model.configure_optimizers(run.get("weight_decay", 0.1), run.get("learning_rate", 6e-4),
                                           (run.get("beta1", 0.9), run.get("beta2", 0.95)), "cpu")
    model_args, model_options = model_spec("distributed_gpt", model)
    run.update(out_dir=spd_dir, init_from="resume", model_type="distributed_gpt", tp_size=tp_size,
               block_types=list(pattern))
    out = dict(checkpoint, model=model.gpt_state_dict(), optimizer=model.gpt_optimizer_state(optimizer),
               model_args=model_args, model_type="distributed_gpt", model_options=model_options,
               iter_num=0, best_val_loss=loss, config=run)
    out.pop("scaler", None)
    return out


def train_tokens(cfg, data_dir, *, n, seed, block_size, device):
    """n batches of distillation inputs from train.bin (distill_batch_size x block_size), seeded."""
    X, _ = token_batches(os.path.join(data_dir, "train.bin"), n=n, batch_size=cfg["distill_batch_size"],
                         block_size=block_size, seed=seed)
    return X.to(device)


def classify_blocks(cfg, evaluate, state, n_layer, bar):
    """Step 1: each block's sensitivity, the simple measure and the paper's backward sweep, and its class.
    Returns (base loss, single, paper, the sensitivity that orders and classifies, classes)."""
    base, single, paper = sensitivities(evaluate, state, n_layer)
    by = paper if cfg["order"] == "paper" else single
    classes = [classify(s, cfg["tau_isb"], cfg["tau_esb"]) for s in by]
    n_grouped = sum(c == "ESB" for c in classes) if cfg["head_grouping"] else 0
    bar.total += sum(c != "ISB" for c in classes) + n_grouped  # the per-block checks of step 2
    bar.refresh()
    return base, single, paper, by, classes


def recover_blocks(cfg, gpt, state, evaluate, X, heldout, train_X, *, base, single, paper, classes):
    """Step 2: recovery per block, independent of the other blocks (block-to-block targets are the
    original's): head grouping for the extremely sensitive, then distillation for every sensitive one
    (train_X: None for none). Returns (the per-block rows, the recovered GPT-layout weights)."""
    n_layer, tp = gpt.config.n_layer, cfg["tp_size"]
    recovered = dict(state)
    blocks = []
    for i in range(n_layer):
        one = spd_pattern(n_layer, {i})
        row = dict(block=i, single=single[i], paper=paper[i], **{"class": classes[i]}, grouped=None,
                   recovered=None, mse_before=None, mse_after=None, b2b_kept=None, head_perm=None)
        if classes[i] == "ESB" and cfg["head_grouping"]:
            head_perm, unit_perm = head_grouping(gpt, i, tp, X[0])
            recovered = permute_heads_and_units(recovered, {i: (head_perm, unit_perm)},
                                                n_head=gpt.config.n_head)
            row["head_perm"] = head_perm
            row["grouped"] = evaluate(one, mixed(state, recovered, one), "grouped") - base
        if classes[i] != "ISB" and train_X is not None:
            new, row["mse_before"], row["mse_after"] = distill_block(
                gpt, recovered, i, tp, train_X, heldout, lr=cfg["distill_lr"], desc=f"B2B block {i}")
            row["b2b_kept"] = row["mse_after"] < row["mse_before"]  # never keep a block it made worse
            if row["b2b_kept"]:
                recovered.update(new)
        if classes[i] != "ISB":
            row["recovered"] = evaluate(one, mixed(state, recovered, one), "recovered") - base
        blocks.append(row)
    return blocks, recovered


def greedy_curve(gpt, state, recovered, evaluate, tp, order, probe, latencies):
    """Step 3: drop syncs in `order` (increasing sensitivity), k = 0..n_layer blocks: the all-reduces kept
    (counted on `probe`), zero-shot and recovered losses, and the measured latency if given."""
    curve = []
    for k in range(gpt.config.n_layer + 1):
        pattern = spd_pattern(gpt.config.n_layer, set(order[:k]))
        model = distributed(gpt, state, tp, pattern)
        curve.append(dict(spd_blocks=k, pattern=list(pattern), fwd_allreduces=fwd_allreduces(model, probe),
                          zero_shot_loss=evaluate(pattern, state),
                          recovered_loss=evaluate(pattern, mixed(state, recovered, pattern), "recovered"),
                          ms_per_token=latencies.get(pattern)))
    return curve


def final_conversion(cfg, gpt, state, recovered, chosen, X, Y, heldout, kl_X, *, base):
    """Step 4: the chosen curve point's weights, then optional KL distillation of the whole
    converted model (kl_X: None for none). Returns (GPT-layout weights, their validation loss, the
    stages table, the KL before/after)."""
    pattern = tuple(chosen["pattern"])
    final, final_loss = mixed(state, recovered, pattern), chosen["recovered_loss"]
    gap0 = chosen["zero_shot_loss"] - base

    def stage(name, loss, recovery=True):
        gap = loss - base
        return dict(stage=name, loss=loss, gap=gap, closed=(1 - gap / gap0) if recovery and gap0 > 0
                    else None)

    stages = [stage("original (all 'tp')", base, False), stage("zero-shot SPD", chosen["zero_shot_loss"],
                                                               False), stage("head grouping + block-to-block "
                                                                             "distillation", final_loss)]
    kl = None
    if kl_X is not None:
        final, kl_before, kl_after = distill_kl(gpt, final, cfg["tp_size"], pattern, kl_X, heldout,
                                                lr=cfg["kl_lr"])
        final_loss = mean_loss(distributed(gpt, final, cfg["tp_size"], pattern), X, Y)
        stages.append(stage("+ KL distillation from the original's logits", final_loss))
        kl = dict(before=kl_before, after=kl_after)
    return final, final_loss, stages, kl


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    check_spd_settings(cfg)
    device = pick_device(cfg["device"])
    checkpoint, gpt = load_gpt(cfg)
    n_layer, tp = gpt.config.n_layer, cfg["tp_size"]
    latencies = read_latencies(cfg["latency_json"], n_layer)
    data_dir = find_data(cfg, checkpoint)
    block_size = cfg["block_size"] or gpt.config.block_size
    if block_size > gpt.config.block_size:
        raise ConfigError(f"block_size ({block_size}) exceeds the checkpoint's ({gpt.config.block_size})")
    spd_dir = os.path.join(cfg["out_dir"], "spd")
    check_overwrite(spd_dir, cfg)
    torch.manual_seed(cfg["seed"])
    gpt.to(device)
    X, Y = (t.to(device) for t in token_batches(os.path.join(data_dir, "val.bin"), n=cfg["eval_iters"],
                                                  batch_size=cfg["batch_size"], block_size=block_size,
                                                  seed=cfg["seed"]))
    heldout = X[:max(1, min(4, len(X)))]
    state = {k: v.detach() for k, v in gpt.state_dict().items()}

    with RunLock(spd_dir, what="spd.py run"):
        # evaluations: base, n single, n suffixes, per-block checks (added in step 1), 2 (n + 1) curve points
        bar = tqdm(total=1 + 2 * n_layer + 2 * (n_layer + 1), desc="evaluations", file=sys.stderr)
        evaluate = Evaluator(gpt, tp, X, Y, bar)
        base, single, paper, by, classes = classify_blocks(cfg, evaluate, state, n_layer, bar)
        train_X = train_tokens(cfg, data_dir, n=cfg["distill_steps"], seed=cfg["seed"] + 1,
                               block_size=block_size, device=device) if cfg["distill_steps"] else None
        blocks, recovered = recover_blocks(cfg, gpt, state, evaluate, X, heldout, train_X, base=base,
                                           single=single, paper=paper, classes=classes)
        order = sorted(range(n_layer), key=lambda i: by[i])
        curve = greedy_curve(gpt, state, recovered, evaluate, tp, order, X[0][:1, :8], latencies)
        bar.close()

        k = choose_num_spd(cfg, curve, base)
        chosen = curve[k]
        kl_X = train_tokens(cfg, data_dir, n=cfg["kl_steps"], seed=cfg["seed"] + 2, block_size=block_size,
                            device=device) if cfg["kl_steps"] and k > 0 else None
        final, final_loss, stages, kl = final_conversion(cfg, gpt, state, recovered, chosen, X, Y, heldout,
                                                         kl_X, base=base)
        pattern = tuple(chosen["pattern"])
        result = dict(out_dir=cfg["out_dir"], tp_size=tp, order=cfg["order"], tau_isb=cfg["tau_isb"],
                      tau_esb=cfg["tau_esb"], eval_iters=cfg["eval_iters"],
                      eval_tokens=cfg["eval_iters"] * cfg["batch_size"] * block_size, base_loss=base,
                      blocks=blocks, curve=curve, kl=kl, settings=cfg,
                      conversion=dict(spd_blocks=k, pattern=list(pattern),
                                      fwd_allreduces=chosen["fwd_allreduces"],
                                      stages=stages))
        with open(os.path.join(spd_dir, "spd.json"), "w") as f:
            json.dump(result, f, indent=2)
        write_table(os.path.join(spd_dir, "spd.md"), result)
        write_plot(os.path.join(spd_dir, "spd.png"), result)
        save_checkpoint(converted_checkpoint(checkpoint, gpt, final, tp, pattern, spd_dir, final_loss),
                        spd_dir)
    print(open(os.path.join(spd_dir, "spd.md")).read())
    print(f"wrote {spd_dir}/spd.md, spd.json, spd.png and {CHECKPOINT_NAME} (sample it: python sample.py "
          f"--out_dir={spd_dir})")


if __name__ == "__main__":
    main(sys.argv[1:])
