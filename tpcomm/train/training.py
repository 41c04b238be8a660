"""
A training run's state and its phases that are not the step: start_run builds it (the model from scratch, a
checkpoint or GPT-2; DDP/FSDP or pipeline stages; the optimizer, and on resume its state and the RNGs; the
data), evaluate and save are the loop's evaluation and checkpoint phases, closing_line its last words.
train.py's loop works on a Training.
"""

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch

from tpcomm.errors import ConfigError
from tpcomm.configuration import save_config
from data.vocab import load_vocab
from model import GPT
from tpcomm.train import sharded_checkpoint
from tpcomm.train.batches import Batches
from tpcomm.train.build import model_from_config
from tpcomm.train.checkpoint import (CHECKPOINT_NAME, clean_state_dict, make_checkpoint,
                                     remove_stale_temp_files, save_checkpoint)
from tpcomm.parallel.data_parallel import parallelize
from tpcomm.train.metrics import MetricsLog
from tpcomm.parallel.parallel_dims import ParallelDims
from tpcomm.train.runtime import autocast_context, make_grad_scaler, setup_runtime
from tpcomm.train.train_config import previous_checkpoints, vocab_chars


def load_optimizer_state(owner, optimizer, state, *, path):
    """A checkpoint's optimizer state; how the optimizer runs (fused, foreach) stays this run's
    own, so a checkpoint written on CUDA resumes on CPU. A state that does not fit this model's
    parameters (another count of groups or entries, a moment of another shape) is a ConfigError
    naming the path, before any step."""
    own = optimizer.param_groups
    groups = [dict(g, **{k: o[k] for k in ("fused", "foreach", "capturable") if k in o})
              for g, o in zip(state["param_groups"], own)]
    try:
        owner.load_gpt_optimizer_state(optimizer, dict(state, param_groups=groups))
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
        raise ConfigError(f"checkpoint {path}: its optimizer state does not fit the model "
                          f"({type(e).__name__}: {str(e)[:120]}); refusing to resume from it") from None
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value) and value.dim() > 0 and value.shape != p.shape:
                    raise ConfigError(f"checkpoint {path}: its optimizer's {key} has shape "
                                      f"{tuple(value.shape)} for a parameter of shape {tuple(p.shape)}; "
                                      "refusing to resume from it")


def resume_state(checkpoint, cfg, pd, *, model, owner, optimizer, scaler, device, device_type):
    """A checkpoint's optimizer state (sharded: loaded in place), loss scaler and RNGs; (iter_num,
    best_val_loss). owner: what holds this rank's parameters (the model, or the pipeline under pp)."""
    if "layout" in checkpoint:  # sharded
        sharded_checkpoint.load_sharded(model, optimizer, cfg["out_dir"], pd)
        for group, saved in zip(optimizer.param_groups, checkpoint["param_groups"]):
            group.update({k: v for k, v in saved.items() if k not in ("params", "fused", "foreach",
                                                                      "capturable")})
    else:
        load_optimizer_state(owner, optimizer, checkpoint["optimizer"],
                             path=os.path.join(cfg["out_dir"], CHECKPOINT_NAME))
    if checkpoint.get("scaler") and scaler.is_enabled():
        scaler.load_state_dict(checkpoint["scaler"])
    if "rng_state" in checkpoint:  # nanoGPT's checkpoints have none
        torch.set_rng_state(checkpoint["rng_state"])
    if "cuda_rng_state" in checkpoint and device_type == "cuda":
        torch.cuda.set_rng_state(checkpoint["cuda_rng_state"], device)
    return int(checkpoint["iter_num"]), float(checkpoint["best_val_loss"])


@dataclass
class Training:
    """What the training loop works on (the model, its optimizer, the data, the counters); built once by
    start_run."""
    cfg: dict
    pd: ParallelDims
    device: str
    model: torch.nn.Module  # what runs forward: raw_model, compiled and/or wrapped in DDP (or FSDP-sharded)
    raw_model: GPT  # GPT or DistributedGPT: the interface at the end of class GPT
    pipe: object  # pp_size > 1: this rank's pipeline.Pipeline (it runs the steps and evaluation), else None
    sync_module: torch.nn.Module  # what gradient sync is switched on (DDP wrapper, FSDP module, or the model)
    optimizer: torch.optim.Optimizer
    scaler: object  # torch.amp.GradScaler (a no-op unless fp16)
    ctx: object  # autocast context
    batches: Batches
    metrics: MetricsLog
    grad_accum: int  # micro-batches per step on this rank
    micro_offset: int  # global index of this rank's first micro-batch
    iter_num: int = 0
    best_val_loss: float = 1e9
    saved_iter: Optional[int] = None  # the iteration of the last checkpoint this run wrote
    dtype: str = "float32"  # the training precision: MFU's peak depends on it
    # a character dataset's vocabulary, saved so a resume can check its data
    vocab_chars: Optional[str] = None


def cropped(state_dict, block_size):
    """A GPT-layout state dict with the position embeddings of the first block_size
    positions (crop_block_size)."""
    wpe = state_dict["transformer.wpe.weight"]
    return dict(state_dict, **{"transformer.wpe.weight": wpe[:block_size]}) if wpe.size(0) > block_size \
        else state_dict


def tidy_out_dir(cfg):
    """Before a run writes into out_dir (the master, holding its lock): the temp files of
    checkpoint writes that were killed (their writer is dead) go, with a warning; a fresh run
    with overwrite=True removes the checkpoint of the run it replaces, so the folder never holds
    one run's config beside another's checkpoint."""
    stale = remove_stale_temp_files(cfg["out_dir"])
    if stale:
        sys.stderr.write(f"warning: removed {len(stale)} stale temporary checkpoint file(s) of killed "
                         "writes: " f"{', '.join(stale)}\n")
    if cfg["init_from"] != "resume" and cfg["overwrite"]:
        previous = previous_checkpoints(cfg["out_dir"])
        if previous:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(cfg["out_dir"], CHECKPOINT_NAME))
            sharded_checkpoint.remove_sharded(cfg["out_dir"])
            print(f"overwrite=True: removed the previous run's checkpoint ({', '.join(previous)})")


def start_run(cfg, setup, pd):
    """Build the model (from scratch, a checkpoint or GPT-2), the optimizer and the data, as nanoGPT's
    train.py. The model is built whole on the device (init_device='default'; weights loaded before DDP/FSDP)
    or on the meta device and materialised after FSDP has sharded it (init_device='meta'; each rank allocates
    its own part, then the weights load): the same weights either way."""
    device = f"cuda:{pd.local_rank}" if pd.distributed and setup.device_type == "cuda" else setup.device
    grad_accum = cfg["gradient_accumulation_steps"] // pd.dp
    tokens_per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    if pd.is_master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        pp = f"pp={pd.pp} {cfg['pp_schedule']}, " if pd.pp > 1 else ""
        hsdp = f" (hsdp: {pd.dp_replicate} replicas x dp_shard {pd.dp_shard})" if pd.hsdp else ""
        print(f"tokens per iteration: {tokens_per_iter:,} ({pp}dp={pd.dp}{hsdp}, tp={cfg['tp_size']} "
              f"{cfg['tp_mode']}, grad_accum per rank={grad_accum}, device={device}, "
              f"dtype={setup.dtype}, data_parallel={cfg['data_parallel']}, "
              f"init_device={cfg['init_device']})")
    setup_runtime(setup.device_type, cfg["seed"])  # same seed on every rank: identical initial weights

    # model: built (whole, or on the meta device), weights loaded, DDP-wrapped or FSDP-sharded, compiled
    checkpoint = setup.checkpoint
    sharded = checkpoint is not None and "layout" in checkpoint  # loaded in place once the model is sharded
    weights = (clean_state_dict(checkpoint["model"]) if checkpoint is not None and not sharded
               else setup.pretrained)
    setup.pretrained = None  # free memory
    meta = cfg["init_device"] == "meta"
    model = model_from_config(setup.model_config, pd=pd, init_device=cfg["init_device"])
    if weights is not None and not meta:
        model.load_gpt_state_dict(weights)
    if cfg["block_size"] < model.config.block_size:  # before sharding: it replaces the wpe parameter
        model.crop_block_size(cfg["block_size"])
    if not meta and pd.pp == 1:  # pipeline stages: each rank moves only its own stages (Pipeline)
        model.to(device)
    if cfg["compile"] and pd.is_master:
        print("compiling the model... (takes a ~minute)")
    pipe = None
    # every rank holds the whole model (on the CPU) and runs its stages' part (DDP over dp per stage)
    if pd.pp > 1:
        from tpcomm.parallel.pipeline import Pipeline

        pipe = Pipeline(model, pd, schedule=cfg["pp_schedule"], n_microbatches=grad_accum,
                        batch_size=cfg["batch_size"] * grad_accum, seq_len=cfg["block_size"],
                        virtual_stages=cfg["pp_virtual_stages"], pp_layers=cfg["pp_layers"], device=device)
        run_model = sync_module = None
    else:
        run_model, sync_module = parallelize(model, pd, kind=cfg["data_parallel"], device=device,
                                             device_type=setup.device_type, meta=meta, compile=cfg["compile"],
                                             dtype=setup.dtype)
    if weights is not None and meta:
        model.load_gpt_state_dict(cropped(weights, model.config.block_size))
    del weights
    if pd.is_master:
        print(f"model: {cfg['model_type']}, {model.get_num_params() / 1e6:.2f}M parameters")

    # optimizer (over the sharded parameters under FSDP) and loss scaler; on resume also their state and the
    # RNGs
    scaler = make_grad_scaler(setup.device_type, setup.dtype, pd, data_parallel=cfg["data_parallel"])
    owner = pipe or model  # what holds this rank's parameters: GPT-layout state, optimizer, clipping
    optimizer = owner.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), setup.device_type)
    iter_num, best_val_loss = 0, 1e9
    if checkpoint is not None:
        iter_num, best_val_loss = resume_state(checkpoint, cfg, pd, model=model, owner=owner,
                                               optimizer=optimizer, scaler=scaler, device=device,
                                               device_type=setup.device_type)
        setup.checkpoint = None  # free memory

    if pd.is_master:  # only now, with everything read from the checkpoint and checked, does the run write
        tidy_out_dir(cfg)
        save_config(cfg, cfg["out_dir"])
    metrics = MetricsLog(cfg["out_dir"], enabled=pd.is_master)
    metrics.truncate(iter_num)  # a resumed run must not leave two records of one iteration
    return Training(cfg=cfg, pd=pd, device=device, model=run_model, raw_model=model, pipe=pipe,
                    sync_module=sync_module, optimizer=optimizer, scaler=scaler,
                    ctx=autocast_context(setup.device_type, setup.dtype),
                    batches=Batches(setup.data_dir, block_size=cfg["block_size"],
                                    batch_size=cfg["batch_size"],
                                    seed=cfg["seed"], device=device),
                    metrics=metrics, grad_accum=grad_accum, micro_offset=pd.dp_rank * grad_accum,
                    iter_num=iter_num, best_val_loss=best_val_loss, dtype=setup.dtype,
                    vocab_chars=vocab_chars(load_vocab(setup.data_dir)))


def eval_losses(training, split, ks, n):
    """(sum, count) of the losses of eval batches ks of a split; batches k >= n only keep the collectives in
    step (repeated, not counted). Under pp the batches go through the schedule (Pipeline.eval_loss_sum)."""
    batches = (training.batches.get(split, -1, k if k < n else training.pd.dp_rank % n) for k in ks)
    if training.pipe is not None:
        return training.pipe.eval_loss_sum(list(batches), counted=[k < n for k in ks], ctx=training.ctx)
    losses = [0.0, 0]
    for k, (X, Y) in zip(ks, batches):
        with training.ctx:
            _, loss = training.model(X, Y)
        if k < n:
            losses[0] += loss.item()
            losses[1] += 1
    return losses


@torch.no_grad()
def evaluate(training):
    """Mean loss over eval_iters batches of each split. Eval batch k is done by dp rank k % dp; the mean over
    ranks equals one process doing all of them. Under FSDP every forward is a collective over dp (the
    parameters are gathered), so each rank runs as many: a rank out of batches repeats its first one and does
    not count it. Under pp every schedule call runs m micro-batches and ends with collectives over pp: each
    rank runs as many rounds of m, filled up the same way."""
    out = {}
    owner = training.pipe or training.model
    owner.train(False)
    dp, n = training.pd.dp, training.cfg["eval_iters"]
    per_rank = -(-n // dp)  # ceil(n / dp) batches on the busiest rank
    rounds = per_rank if training.cfg["data_parallel"] == "fsdp" else None
    if training.pipe is not None:  # whole schedule calls of m micro-batches
        rounds = -(-per_rank // training.pipe.m) * training.pipe.m
    for split in ("train", "val"):
        ks = range(training.pd.dp_rank, n if rounds is None else rounds * dp, dp)
        t = torch.tensor(eval_losses(training, split, ks, n), dtype=torch.float64, device=training.device)
        if training.pd.dp > 1:
            torch.distributed.all_reduce(t, group=training.pd.dp_group)
        out[split] = (t[0] / t[1]).item()
    owner.train(True)
    return out


def save(training):
    """checkpoint_format='full': write out_dir/ckpt.pt in GPT layout: every rank joins the gather (a
    collective under real tp and under FSDP, whose shards are gathered whole), the master writes.
    'sharded': every rank writes the shards it holds to out_dir/ckpt_sharded
    (tpcomm/train/sharded_checkpoint.py), nothing is gathered."""
    sharded = training.cfg["checkpoint_format"] == "sharded"
    checkpoint = make_checkpoint(training.pipe or training.raw_model, training.optimizer, training.scaler,
                                 model_type=training.cfg["model_type"], iter_num=training.iter_num,
                                 best_val_loss=training.best_val_loss, config=training.cfg,
                                 tensors=not sharded)
    if training.vocab_chars is not None:
        checkpoint["vocab_chars"] = training.vocab_chars
    if sharded:
        if training.pd.is_master:
            print(f"saving sharded checkpoint to {sharded_checkpoint.sharded_path(training.cfg['out_dir'])}")
        sharded_checkpoint.save_sharded(training.raw_model, training.optimizer, checkpoint,
                                        training.cfg["out_dir"], training.pd)
    elif training.pd.is_master:
        print(f"saving checkpoint to {training.cfg['out_dir']}")
        save_checkpoint(checkpoint, training.cfg["out_dir"])
    training.saved_iter = training.iter_num


def all_reduce_mean(value, pd, device):
    """Mean of a Python float over data-parallel ranks (tp ranks of a replica hold the same value)."""
    if pd.dp == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, group=pd.dp_group)
    return t.item() / pd.dp


def closing_line(training, first_iter, last_eval):
    """'done: ...': the steps run, the last evaluation, and the checkpoint this run left (or why none)."""
    cfg = training.cfg
    path = (sharded_checkpoint.sharded_path(cfg["out_dir"]) if cfg["checkpoint_format"] == "sharded"
            else os.path.join(cfg["out_dir"], CHECKPOINT_NAME))
    evaluated = f"val loss {last_eval[1]['val']:.4f} at iter {last_eval[0]}" if last_eval else "not evaluated"
    if cfg["eval_only"]:
        return f"done: evaluation only (eval_only=True), {evaluated}"
    if training.saved_iter is not None:
        saved = f"checkpoint {path} (iter {training.saved_iter})"
    elif last_eval is None or last_eval[0] == 0:
        saved = "no checkpoint (iteration 0 is never saved, as in nanoGPT)"
    else:
        saved = (f"no checkpoint written: val loss never improved on {training.best_val_loss:.4f} "
                 f"(always_save_checkpoint=False)")
    steps = training.iter_num - first_iter
    return (f"done: {steps} step{'s' * (steps != 1)} (iters {first_iter}..{training.iter_num - 1}), "
            f"{evaluated}, {saved}")
