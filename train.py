r"""
Train GPT or DistributedGPT, nanoGPT style. Single process:
$ python train.py config/train_shakespeare_char.py --device=cpu --compile=False
Data parallel on one node (4 GPUs):
$ torchrun --standalone --nproc_per_node=4 train.py config/train_gpt2.py
Real tensor parallel (dp=2 x tp=2 on CPU; the global micro-batches split over the 2 replicas):
$ torchrun --standalone --nproc_per_node=4 train.py config/train_shakespeare_char_spd.py --tp_mode=real \
      --gradient_accumulation_steps=2
Multi-node: torchrun --nnodes=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 ... Pipeline
stages (pp x dp x tp; here pp 2 x dp 2 x tp 2 real, 1F1B over gradient_accumulation_steps/dp micro-batches):
$ torchrun --standalone --nproc_per_node=8 \
      train.py config/train_shakespeare_char_spd.py --tp_mode=real --tp_size=2 \
      --pp_size=2 --pp_schedule=1f1b --gradient_accumulation_steps=8 --compile=False
FSDP instead of DDP over the data-parallel ranks (parameters, gradients and AdamW state sharded over dp;
composes with real tp), building on the meta device so no rank ever holds the whole model,
vocabulary-parallel loss:
$ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py --model_type=distributed_gpt \
      --tp_size=2 --tp_mode=real --data_parallel=fsdp --init_device=meta --loss_parallel=True
Two nodes of 8 GPUs, hybrid sharding (HSDP): FSDP within each node (dp_shard = GPUs per node / tp), replicas
across the nodes, so only the gradient all-reduce between the two replicas crosses the network:
$ torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 \
      --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 train.py \
      config/train_gpt2.py --data_parallel=fsdp --dp_shard=8

Resume (--init_from=resume) takes the model from out_dir/ckpt.pt: its type, sizes, GELU form and block
pattern. A command line or config file that explicitly sets one of those to another value is refused; tp_size,
tp_mode, the process layout, dropout, block_size (smaller only: the model is cropped) and the training
settings may change (tp_size, dropout and block_size are the checkpoint's unless set). max_iters=N runs steps
0..N (N+1 steps), as nanoGPT does.
"""

import contextlib
import math
import sys
import time

import torch

from tpcomm.configuration import exit_on_config_error
from tpcomm.bench import trace as comm_trace
from tpcomm.parallel.data_parallel import set_gradient_sync
from tpcomm.train.metrics import eta
from tpcomm.parallel.parallel_dims import init_parallel, shutdown
from tpcomm.train.runtime import DeviceClock, RunError, RunLock, exit_on_run_error
from tpcomm.train.train_config import prepare
from tpcomm.train.training import all_reduce_mean, closing_line, evaluate, save, start_run


# ------------------------------------------------------------------------------------------------------------
# the learning rate and the step

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


def train_step(training, *, report=True):
    """One optimizer step over the global batch. Returns (the loss: its micro-steps' parts, read by read_loss;
    collectives report, or None when not `report`: reading it waits for the device's collectives, so the loop
    asks for it at log steps only). Under pp the pipeline runs the step (Pipeline.pipelined_step)."""
    cfg, raw_model = training.cfg, training.raw_model
    if training.pipe is not None:
        first = training.micro_offset
        batches = [training.batches.get("train", training.iter_num, first + j)
                   for j in range(training.grad_accum)]
        lossf, comm = training.pipe.pipelined_step(batches, training.optimizer,
                                                   dropout_key=(cfg["seed"], training.iter_num,
                                                                training.micro_offset), ctx=training.ctx,
                                                   grad_clip=cfg["grad_clip"], tokens=cfg["batch_size"]
                                                   * cfg["block_size"])
        return lossf, comm
    raw_model.reset_comm_counts()
    # forward backward update, with gradient accumulation; DDP/FSDP sync gradients on the last micro-step only
    loss_parts = []  # each micro-step's loss, on the device: no sync per micro-step
    for micro_step in range(training.grad_accum):
        # global micro-batch index: keys the batch and the dropout masks
        micro = training.micro_offset + micro_step
        X, Y = training.batches.get("train", training.iter_num, micro)
        raw_model.seed_dropout(cfg["seed"], training.iter_num, micro)
        set_gradient_sync(training.sync_module, enabled=micro_step == training.grad_accum - 1)
        with training.ctx:
            _, loss = training.model(X, Y)
            loss = loss / training.grad_accum  # scale the loss to account for gradient accumulation
        loss_parts.append(loss.detach())
        training.scaler.scale(loss).backward()
    raw_model.sync_replicated_grads()  # real tp: parameters every shard holds get their summed gradient
    comm = raw_model.comm_report(micro_steps=training.grad_accum,
                                 tokens=cfg["batch_size"] * cfg["block_size"]) if report else None
    # clip the gradient
    if cfg["grad_clip"] != 0.0:
        training.scaler.unscale_(training.optimizer)
        raw_model.clip_grad_norm_(cfg["grad_clip"])
    # step the optimizer and the scaler (if training in fp16)
    training.scaler.step(training.optimizer)
    training.scaler.update()
    training.optimizer.zero_grad(set_to_none=True)
    return loss_parts, comm


def read_loss(training, loss):
    """The step's mean loss as a float, the same on every rank: the micro-steps' parts summed in order (as
    float64, so the number is the one a per-micro-step .item() would give), then averaged over the dp ranks (a
    collective: every rank calls it at the same steps). Under pp the pipeline has read it already."""
    if isinstance(loss, float):
        return loss
    total = 0.0
    for part in torch.stack(loss).tolist():
        total += part
    return all_reduce_mean(total, training.pd, training.device)


def stop_if_not_finite(training, what, value):
    """A non-finite loss stops the run before anything is saved: the last good checkpoint stays as it is."""
    if not math.isfinite(value):
        raise RunError(f"{what} loss is {value} at iter {training.iter_num}; stopping. The last good "
                       "checkpoint " f"(if any) is kept in {training.cfg['out_dir']}")


# ------------------------------------------------------------------------------------------------------------
# the loop

def start_wandb(cfg, master):
    """wandb's run on the master rank when wandb_log is on (None otherwise); its
    own errors end in one line."""
    if not (cfg["wandb_log"] and master):
        return None
    import wandb

    try:
        wandb.init(project=cfg["wandb_project"], name=cfg["wandb_run_name"], config=cfg)
    except Exception as e:  # noqa: BLE001 (no API key, no network, ...: wandb's own errors, one line)
        raise RunError(f"wandb_log=True: wandb.init failed ({type(e).__name__}: "
                       f"{str(e).strip().splitlines()[0][:200]}); `wandb login`, WANDB_MODE=offline, or "
                       f"--wandb_log=False") from None
    return wandb


def evaluate_and_save(training, lr, wandb, running_mfu, *, stepped):
    """Evaluate the loss on train/val and write a checkpoint when it is the best (or always_save_checkpoint),
    never a non-finite model, and only once this process has trained a step (`stepped`): a resume writes
    nothing before it has shown it can step. Returns the losses."""
    cfg = training.cfg
    losses = evaluate(training)
    if training.pd.is_master:
        print(f"step {training.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        training.metrics.write(iter=training.iter_num, train_loss=losses["train"], val_loss=losses["val"],
                               lr=lr)
        if wandb is not None:
            wandb.log({"iter": training.iter_num, "train/loss": losses["train"], "val/loss": losses["val"],
                       "lr": lr, "mfu": running_mfu * 100})
    for split in ("train", "val"):
        stop_if_not_finite(training, f"{split} (evaluation)", losses[split])
    if losses["val"] < training.best_val_loss or cfg["always_save_checkpoint"]:
        training.best_val_loss = min(training.best_val_loss, losses["val"])
        if stepped and not cfg["eval_only"]:
            save(training)
    return losses


def evals_left(iter_num, cfg):
    """Evaluations after iteration iter_num: each multiple of eval_interval up to max_iters, and max_iters."""
    every, last = cfg["eval_interval"], cfg["max_iters"]
    return max(0, last // every - iter_num // every) + (1 if last % every and iter_num < last else 0)


def log_step(training, *, lossf, dt, lr, comm, running_mfu, steps_here, first_iter, loop_start, evals):
    """The master's log line and metrics row for a log step; returns the running MFU (nanoGPT's smoothing,
    from the sixth step of this process on)."""
    cfg = training.cfg
    if steps_here >= 5:  # let the training loop settle a bit
        mfu = training.raw_model.estimate_mfu(cfg["batch_size"] * training.grad_accum, dt,
                                              device=training.device, dtype=training.dtype)
        if mfu is not None:
            mfu /= training.pd.pp  # a replica runs on pp times the devices of one stage group
            running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
    mfu_str = f"{running_mfu * 100:.2f}%" if running_mfu >= 0 else "n/a"
    tok_s = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"] / dt
    comm_str = f", all-reduces fwd {comm['fwd_allreduces']} bwd {comm['bwd_allreduces']}" if comm else ""
    if "vocab_allreduces" in comm:
        comm_str += f", vocab {comm['vocab_allreduces']}"
    if "pp_bytes_per_token" in comm:
        comm_str += f", pp {comm['pp_bytes_per_token']:,.0f} B/token"
    left = eta(training.iter_num - first_iter + 1, cfg["max_iters"] - training.iter_num, loop_start,
               eval_seconds=evals[1], evals=evals[0], evals_left=evals_left(training.iter_num, cfg))
    print(f"iter {training.iter_num}/{cfg['max_iters']}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, "
          f"tok/s {tok_s:,.0f}, mfu {mfu_str}{comm_str}, {left}")
    training.metrics.write(iter=training.iter_num, loss=lossf, lr=lr, dt_ms=dt * 1000, tokens_per_s=tok_s,
                           mfu=running_mfu if running_mfu >= 0 else None, **comm)
    return running_mfu


def train(training):
    """The training loop, as nanoGPT's: evaluate and checkpoint every eval_interval and at the last iteration
    (max_iters, before its step, as nanoGPT does when max_iters is a multiple of eval_interval), one step per
    iteration. Ends with a closing line."""
    cfg, master = training.cfg, training.pd.is_master
    wandb = start_wandb(cfg, master)
    local_iter_num, running_mfu = 0, -1.0
    # (iteration, losses) of the last evaluation
    first_iter, last_eval, evals = training.iter_num, None, (0, 0.0)
    loop_start = time.perf_counter()
    # ms/iter, tokens/s and MFU: the device-synchronised time since the last log line, evaluation and saving
    # left out, over the steps since: queued work counts where it ran, and the host syncs at log steps only
    clock = DeviceClock(training.device)
    interval_start, interval_steps = clock.now(), 0
    while True:
        # determine and set the learning rate for this iteration
        lr = get_lr(training.iter_num, cfg)
        for group in training.optimizer.param_groups:
            group["lr"] = lr

        # evaluate and checkpoint; always at the last iteration, so a run ends evaluated and saved whatever
        # eval_interval is
        if training.iter_num % cfg["eval_interval"] == 0 or training.iter_num == cfg["max_iters"]:
            if last_eval is None and master:  # so a long first evaluation is not taken for a hang
                print(f"evaluating: {cfg['eval_iters']} batches of {cfg['batch_size']} x {cfg['block_size']} "
                      "tokens from each of train and val (eval_iters sets how many)")
            paused, host = clock.now(), time.perf_counter()
            last_eval = (training.iter_num, evaluate_and_save(training, lr, wandb, running_mfu,
                                                              stepped=training.iter_num > first_iter))
            interval_start += clock.now() - paused  # the step time leaves evaluation and saving out
            evals = (evals[0] + 1, evals[1] + time.perf_counter() - host)  # (count, seconds): the ETA's
        if cfg["eval_only"]:
            break

        # one training step: forward/backward with gradient accumulation, clip, update (no host sync but a log
        # step's)
        traced = cfg["trace"] is not None and training.iter_num == cfg["trace_iter"]
        trace = comm_trace.rank_path(cfg["trace"], training.pd.rank) if traced else None
        logged = training.iter_num % cfg["log_interval"] == 0
        with comm_trace.trace_steps(trace, enabled=traced) as tracer, tracer.step():
            loss, comm = train_step(training, report=logged)
        interval_steps += 1
        if traced and master:
            print(f"trace of step {training.iter_num}: {cfg['trace']}"
                  + (" (rank r: .rank<r> before the extension)" if training.pd.distributed else ""))

        # logging: the loss is read (a device sync, a dp all-reduce) at log steps only, as nanoGPT does; a
        # non-finite one stops the run (evaluation checks its own before any checkpoint is written)
        if logged:
            dt = (clock.now() - interval_start) / interval_steps  # seconds per step over the interval
            lossf = read_loss(training, loss)
            stop_if_not_finite(training, "training", lossf)
            if master:
                running_mfu = log_step(training, lossf=lossf, dt=dt, lr=lr, comm=comm,
                                       running_mfu=running_mfu, steps_here=local_iter_num,
                                       first_iter=first_iter, loop_start=loop_start, evals=evals)
            interval_start, interval_steps = clock.now(), 0
        training.iter_num += 1
        local_iter_num += 1

        # termination conditions: steps 0..max_iters, as nanoGPT
        if training.iter_num > cfg["max_iters"]:
            break
    if wandb is not None:
        wandb.finish()
    if master:
        print(closing_line(training, first_iter, last_eval))


@exit_on_config_error
@exit_on_run_error
def main(argv):
    cfg, setup = prepare(argv)
    pd = init_parallel(dp=setup.dp, tp=setup.tp, pp=setup.pp, dp_shard=setup.dp_shard,
                       device_type=setup.device_type, backend=cfg["backend"])
    finished = False
    try:
        # one run per out_dir: the master holds the directory's lock for the whole run, before writing
        # anything
        lock = RunLock(cfg["out_dir"], what="train.py run") if pd.is_master else contextlib.nullcontext()
        with lock:
            train(start_run(cfg, setup, pd))
        finished = True
    finally:
        shutdown(pd, finished=finished)


if __name__ == "__main__":
    main(sys.argv[1:])
