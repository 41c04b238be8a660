"""
Train GPT or DistributedGPT, nanoGPT style. Single process:
$ python train.py config/train_shakespeare_char.py --device=cpu --compile=False
Data parallel on one node (4 GPUs):
$ torchrun --standalone --nproc_per_node=4 train.py config/train_gpt2.py
Real tensor parallel (dp=2 x tp=2 on CPU):
$ torchrun --standalone --nproc_per_node=4 train.py config/train_shakespeare_char_spd.py --tp_mode=real
Multi-node: torchrun --nnodes=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 ...
"""

import json
import math
import os
import pickle
import sys
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (MODEL_TYPES, autocast_context, build_model, clean_state_dict, load_checkpoint, make_grad_scaler,
                    pick_device, pick_dtype, save_checkpoint, setup_runtime)
from configurator import ConfigError, configure, exit_on_config_error, save_config
from model import PRETRAINED_SIZES, GPT
from parallel import check_layout, init_parallel, shutdown

DEFAULTS = dict(
    # I/O
    out_dir="out",
    eval_interval=2000,
    log_interval=1,
    eval_iters=200,
    eval_only=False,
    always_save_checkpoint=True,
    init_from="scratch",  # 'scratch' | 'resume' | 'gpt2' | 'gpt2-medium' | 'gpt2-large' | 'gpt2-xl'
    # wandb
    wandb_log=False,
    wandb_project="owt",
    wandb_run_name="gpt2",
    # data
    dataset="openwebtext",
    data_dir=None,  # None: data/<dataset> next to this script
    gradient_accumulation_steps=5 * 8,  # global: divided over data-parallel ranks
    batch_size=12,  # micro-batch size per rank
    block_size=1024,
    # model
    model_type="gpt",  # 'gpt' | 'distributed_gpt'
    n_layer=12,
    n_head=12,
    n_embd=768,
    dropout=0.0,
    bias=False,
    tp_size=1,  # shards per layer (DistributedGPT)
    block_types=None,  # 'tp' | 'spd' | 'parallel' per layer (a list), or one for every layer; None = all 'tp'
    tp_mode="simulated",  # 'simulated' (one process holds every shard) | 'real' (torchrun, one shard per rank)
    # AdamW
    learning_rate=6e-4,
    max_iters=600000,
    weight_decay=1e-1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # 0.0 disables
    # learning rate schedule
    decay_lr=True,
    warmup_iters=2000,
    lr_decay_iters=600000,
    min_lr=6e-5,
    # system
    backend=None,  # None: 'nccl' on CUDA, 'gloo' on CPU
    device="auto",  # 'auto' | 'cpu' | 'cuda' | 'cuda:1' | 'mps'
    dtype="auto",  # 'auto' | 'float32' | 'bfloat16' | 'float16'
    compile=True,
    seed=1337,
)


def validate(cfg):
    """Every check a user can fail, before any work starts."""
    positive = ("batch_size", "block_size", "n_layer", "n_head", "n_embd", "tp_size",
                "gradient_accumulation_steps", "eval_iters", "eval_interval", "log_interval")
    for key in positive:
        if cfg[key] < 1:
            raise ConfigError(f"{key} must be >= 1, got {cfg[key]}")
    if cfg["max_iters"] < 0:
        raise ConfigError(f"max_iters must be >= 0, got {cfg['max_iters']}")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {cfg['dropout']}")
    if cfg["model_type"] not in MODEL_TYPES:
        raise ConfigError(f"model_type must be one of {MODEL_TYPES}, got {cfg['model_type']!r}")
    if cfg["init_from"] not in ("scratch", "resume") and cfg["init_from"] not in PRETRAINED_SIZES:
        raise ConfigError(f"init_from must be 'scratch', 'resume' or one of {sorted(PRETRAINED_SIZES)}, "
                          f"got {cfg['init_from']!r}")
    if cfg["n_embd"] % cfg["n_head"]:
        raise ConfigError(f"n_embd ({cfg['n_embd']}) must be divisible by n_head ({cfg['n_head']})")
    if cfg["model_type"] == "distributed_gpt":
        from tensor_parallel_model import validate_tp_args

        validate_tp_args(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                         tp_size=cfg["tp_size"], block_types=cfg["block_types"])
    elif cfg["tp_size"] != 1 or cfg["block_types"] is not None or cfg["tp_mode"] != "simulated":
        raise ConfigError(f"tp_size/block_types/tp_mode need model_type='distributed_gpt', "
                          f"got model_type={cfg['model_type']!r}, tp_size={cfg['tp_size']}, "
                          f"block_types={cfg['block_types']}, tp_mode={cfg['tp_mode']!r}")
    dp, tp = check_layout(tp_size=cfg["tp_size"], tp_mode=cfg["tp_mode"])
    if cfg["gradient_accumulation_steps"] % dp:
        raise ConfigError(f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) must be divisible "
                          f"by the number of data-parallel ranks ({dp})")
    data_dir = cfg["data_dir"] or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", cfg["dataset"])
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise ConfigError(f"dataset {cfg['dataset']!r}: {path} not found "
                              f"(run python data/{cfg['dataset']}/prepare.py)")
        n = os.path.getsize(path) // 2
        if n <= cfg["block_size"] + 1:
            raise ConfigError(f"dataset {cfg['dataset']!r}: {split}.bin has {n} tokens, "
                              f"fewer than block_size+2 ({cfg['block_size'] + 2})")
    if cfg["init_from"] == "resume" and not os.path.isfile(os.path.join(cfg["out_dir"], "ckpt.pt")):
        raise ConfigError(f"init_from='resume' but there is no checkpoint at "
                          f"{os.path.join(cfg['out_dir'], 'ckpt.pt')}")
    return data_dir, dp, tp


def read_meta_vocab(data_dir):
    meta_path = os.path.join(data_dir, "meta.pkl")
    if not os.path.exists(meta_path):
        return None
    with open(meta_path, "rb") as f:
        return pickle.load(f)["vocab_size"]


class Batches:
    """Random crops from a uint16 memmap. Each (iteration, micro-step) has its own seed, so a resumed run
    and a run split over data-parallel ranks see exactly the batches of one uninterrupted process."""

    def __init__(self, data_dir, *, block_size, batch_size, seed, device):
        self.data_dir, self.block_size, self.batch_size = data_dir, block_size, batch_size
        self.seed, self.device = seed, device

    def get(self, split, it, micro):
        # recreate the memmap every batch to avoid a memory leak (nanoGPT issue)
        data = np.memmap(os.path.join(self.data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
        key = [self.seed, {"train": 0, "val": 1}[split], it + 1, micro]  # it = -1 for evaluation
        g = torch.Generator().manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))
        ix = torch.randint(len(data) - self.block_size - 1, (self.batch_size,), generator=g)
        x = torch.stack([torch.from_numpy(data[i:i + self.block_size].astype(np.int64)) for i in ix.tolist()])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + self.block_size].astype(np.int64)) for i in ix.tolist()])
        if self.device.startswith("cuda"):
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)


def get_lr(it, cfg):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it > cfg["lr_decay_iters"]:
        return cfg["min_lr"]
    ratio = (it - cfg["warmup_iters"]) / max(1, cfg["lr_decay_iters"] - cfg["warmup_iters"])
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg["min_lr"] + coeff * (cfg["learning_rate"] - cfg["min_lr"])


def all_reduce_mean(value, pd, device):
    """Mean of a Python float over data-parallel ranks (tp ranks of a replica hold the same value)."""
    if pd.dp == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, group=pd.dp_group)
    return t.item() / pd.dp


class MetricsLog:
    """Append-only JSON lines in out_dir/metrics.jsonl, so plots never need wandb."""

    def __init__(self, out_dir, *, enabled):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.enabled = enabled

    def write(self, **record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


@exit_on_config_error
def main(argv):
    cfg = configure(DEFAULTS, argv)
    data_dir, dp, tp = validate(cfg)
    device = pick_device(cfg["device"])
    device_type = "cuda" if device.startswith("cuda") else device
    dtype = pick_dtype(cfg["dtype"], device_type)

    # model arguments, checked against the dataset and a checkpoint before any work
    meta_vocab = read_meta_vocab(data_dir)
    model_args = {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout",
                                      "tp_size", "block_types")}
    model_args["vocab_size"] = meta_vocab if meta_vocab is not None else 50304
    checkpoint = None
    if cfg["init_from"] == "resume":
        checkpoint = load_checkpoint(cfg["out_dir"])
        for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"):
            model_args[k] = checkpoint["model_args"][k]  # the architecture comes from the checkpoint
    elif cfg["init_from"] in PRETRAINED_SIZES:
        model_args.update(PRETRAINED_SIZES[cfg["init_from"]], vocab_size=50257, block_size=1024, bias=True)
        if cfg["block_size"] > 1024:
            raise ConfigError(f"block_size ({cfg['block_size']}) exceeds GPT-2's 1024")
    if meta_vocab is not None and meta_vocab > model_args["vocab_size"]:
        raise ConfigError(f"dataset {cfg['dataset']!r} has vocab_size {meta_vocab}, "
                          f"larger than the model's vocab_size {model_args['vocab_size']}")
    if cfg["block_size"] > model_args["block_size"]:
        raise ConfigError(f"block_size ({cfg['block_size']}) exceeds the checkpoint's ({model_args['block_size']})")
    if cfg["model_type"] == "distributed_gpt":
        from tensor_parallel_model import validate_tp_args

        validate_tp_args(n_layer=model_args["n_layer"], n_head=model_args["n_head"], n_embd=model_args["n_embd"],
                         tp_size=cfg["tp_size"], block_types=cfg["block_types"])

    pd = init_parallel(dp=dp, tp=tp, device_type=device_type, backend=cfg["backend"])
    try:
        train(cfg, pd, data_dir, device, device_type, dtype, model_args, checkpoint)
    finally:
        shutdown(pd)


def train(cfg, pd, data_dir, device, device_type, dtype, model_args, checkpoint):
    if pd.distributed and device_type == "cuda":
        device = f"cuda:{pd.local_rank}"
    master = pd.is_master
    grad_accum = cfg["gradient_accumulation_steps"] // pd.dp
    tokens_per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    if master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        save_config(cfg, cfg["out_dir"])
        print(f"tokens per iteration: {tokens_per_iter:,} (dp={pd.dp}, tp={cfg['tp_size']} {cfg['tp_mode']}, "
              f"grad_accum per rank={grad_accum}, device={device}, dtype={dtype})")
    setup_runtime(device_type, cfg["seed"])  # same seed on every rank: identical initial weights

    # model
    iter_num, best_val_loss = 0, 1e9
    model = build_model(cfg["model_type"], model_args, pd=pd)
    distributed_model = cfg["model_type"] == "distributed_gpt"
    if cfg["init_from"] == "resume":
        load_model_state(model, clean_state_dict(checkpoint["model"]), distributed_model)
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    elif cfg["init_from"] in PRETRAINED_SIZES:
        gpt = GPT.from_pretrained(cfg["init_from"], dict(dropout=cfg["dropout"]))
        load_model_state(model, gpt.state_dict(), distributed_model)
        del gpt
    if cfg["block_size"] < model.config.block_size:
        model.crop_block_size(cfg["block_size"])
        model_args["block_size"] = cfg["block_size"]
    model.to(device)
    if master:
        print(f"model: {cfg['model_type']}, {model.get_num_params() / 1e6:.2f}M parameters")

    scaler = make_grad_scaler(device_type, dtype, pd)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), device_type)
    if cfg["init_from"] == "resume":
        load_optimizer_state(model, optimizer, checkpoint["optimizer"], distributed_model)
        torch.set_rng_state(checkpoint["rng_state"])
    checkpoint = None  # free memory

    raw_model = model
    if cfg["compile"]:
        if master:
            print("compiling the model... (takes a ~minute)")
        model = torch.compile(model)
    if pd.dp > 1:
        model = DDP(model, process_group=pd.dp_group,
                    device_ids=[pd.local_rank] if device_type == "cuda" else None)

    ctx = autocast_context(device_type, dtype)
    batches = Batches(data_dir, block_size=cfg["block_size"], batch_size=cfg["batch_size"], seed=cfg["seed"],
                      device=device)
    metrics = MetricsLog(cfg["out_dir"], enabled=master)

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ("train", "val"):
            # eval batch k is done by dp rank k % dp; the mean over ranks equals one process doing all of them
            losses = [0.0, 0]
            for k in range(pd.dp_rank, cfg["eval_iters"], pd.dp):
                X, Y = batches.get(split, -1, k)
                with ctx:
                    _, loss = model(X, Y)
                losses[0] += loss.item()
                losses[1] += 1
            t = torch.tensor(losses, dtype=torch.float64, device=device)
            if pd.dp > 1:
                torch.distributed.all_reduce(t, group=pd.dp_group)
            out[split] = (t[0] / t[1]).item()
        model.train()
        return out

    wandb = None
    if cfg["wandb_log"] and master:
        import wandb

        wandb.init(project=cfg["wandb_project"], name=cfg["wandb_run_name"], config=cfg)

    micro_offset = pd.dp_rank * grad_accum  # this rank's share of the global micro-batches
    t0 = time.time()
    local_iter_num, running_mfu = 0, -1.0
    comm = None
    while True:
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr

        if iter_num % cfg["eval_interval"] == 0:
            losses = estimate_loss()
            if master:
                print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                metrics.write(iter=iter_num, train_loss=losses["train"], val_loss=losses["val"], lr=lr)
                if wandb is not None:
                    wandb.log({"iter": iter_num, "train/loss": losses["train"], "val/loss": losses["val"], "lr": lr,
                               "mfu": running_mfu * 100})
            if losses["val"] < best_val_loss or cfg["always_save_checkpoint"]:
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > 0 and not cfg["eval_only"]:
                    ckpt = {
                        "model": model_state(raw_model, distributed_model),
                        "optimizer": optimizer_state(raw_model, optimizer, distributed_model),
                        "model_args": model_args,
                        "model_type": cfg["model_type"],
                        "iter_num": iter_num,
                        "best_val_loss": best_val_loss,
                        "config": cfg,
                        "rng_state": torch.get_rng_state(),
                    }
                    if master:
                        print(f"saving checkpoint to {cfg['out_dir']}")
                        save_checkpoint(ckpt, cfg["out_dir"])
        if cfg["eval_only"]:
            break

        # forward/backward with gradient accumulation; DDP syncs gradients on the last micro-step only
        if distributed_model:
            raw_model.comm.counter.reset()
        loss_sum = 0.0
        for micro_step in range(grad_accum):
            X, Y = batches.get("train", iter_num, micro_offset + micro_step)
            if pd.dp > 1:
                model.require_backward_grad_sync = micro_step == grad_accum - 1
            with ctx:
                _, loss = model(X, Y)
                loss = loss / grad_accum
            loss_sum += loss.item()
            scaler.scale(loss).backward()
        if distributed_model:
            raw_model.sync_replicated_grads()
            comm = raw_model.comm.counter.report(micro_steps=grad_accum, tokens=cfg["batch_size"] * cfg["block_size"])
        if cfg["grad_clip"] != 0.0:
            scaler.unscale_(optimizer)
            clip = raw_model.clip_grad_norm_ if distributed_model else (
                lambda m: torch.nn.utils.clip_grad_norm_(raw_model.parameters(), m))
            clip(cfg["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        lossf = all_reduce_mean(loss_sum, pd, device)
        if not math.isfinite(lossf):
            if master:
                print(f"error: loss is {lossf} at iter {iter_num}; stopping. The last good checkpoint "
                      f"(if any) is kept in {cfg['out_dir']}", file=sys.stderr)
            raise SystemExit(1)

        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % cfg["log_interval"] == 0 and master:
            if local_iter_num >= 5:  # let the training loop settle a bit
                mfu = raw_model.estimate_mfu(cfg["batch_size"] * grad_accum, dt, device=device)
                if mfu is not None:
                    running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            mfu_str = f"{running_mfu * 100:.2f}%" if running_mfu >= 0 else "n/a"
            tok_s = tokens_per_iter / dt
            comm_str = (f", all-reduces fwd {comm['fwd_allreduces']} bwd {comm['bwd_allreduces']}"
                        if comm is not None else "")
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, tok/s {tok_s:,.0f}, "
                  f"mfu {mfu_str}{comm_str}")
            metrics.write(iter=iter_num, loss=lossf, lr=lr, dt_ms=dt * 1000, tokens_per_s=tok_s,
                          mfu=running_mfu if running_mfu >= 0 else None, **(comm or {}))
        iter_num += 1
        local_iter_num += 1
        if iter_num > cfg["max_iters"]:
            break
    if wandb is not None:
        wandb.finish()


def model_state(raw_model, distributed_model):
    """The checkpoint's weights, always in GPT's unsharded layout."""
    return raw_model.gpt_state_dict() if distributed_model else raw_model.state_dict()


def load_model_state(model, gpt_state_dict, distributed_model):
    if distributed_model:
        model.load_gpt_state_dict(gpt_state_dict)
    else:
        model.load_state_dict(gpt_state_dict)


def optimizer_state(raw_model, optimizer, distributed_model):
    return raw_model.gpt_optimizer_state(optimizer) if distributed_model else optimizer.state_dict()


def load_optimizer_state(raw_model, optimizer, state, distributed_model):
    if distributed_model:
        raw_model.load_gpt_optimizer_state(optimizer, state)
    else:
        optimizer.load_state_dict(state)


if __name__ == "__main__":
    main(sys.argv[1:])
