r"""
Train GPT or DistributedGPT, nanoGPT style. Single process:
$ python train.py config/train_shakespeare_char.py --device=cpu --compile=False
Data parallel on one node (4 GPUs):
$ torchrun --standalone --nproc_per_node=4 train.py config/train_gpt2.py
Real tensor parallel (dp=2 x tp=2 on CPU; the global micro-batches split over the 2 replicas):
$ torchrun --standalone --nproc_per_node=4 train.py config/train_shakespeare_char_spd.py --tp_mode=real \
      --gradient_accumulation_steps=2
Multi-node: torchrun --nnodes=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 ...
Pipeline stages (pp x dp x tp; here pp 2 x dp 2 x tp 2 real, 1F1B over gradient_accumulation_steps/dp micro-batches):
$ torchrun --standalone --nproc_per_node=8 train.py config/train_shakespeare_char_spd.py --tp_mode=real --tp_size=2 \
      --pp_size=2 --pp_schedule=1f1b --gradient_accumulation_steps=8 --compile=False
FSDP instead of DDP over the data-parallel ranks (parameters, gradients and AdamW state sharded over dp; composes
with real tp), building on the meta device so no rank ever holds the whole model, vocabulary-parallel loss:
$ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py --model_type=distributed_gpt \
      --tp_size=2 --tp_mode=real --data_parallel=fsdp --init_device=meta --loss_parallel=True

Resume (--init_from=resume) takes the model from out_dir/ckpt.pt: its type, sizes, GELU form and block pattern.
A command line or config file that explicitly sets one of those to another value is refused; tp_size, tp_mode,
the process layout, dropout, block_size (smaller only: the model is cropped) and the training settings may change
(tp_size, dropout and block_size are the checkpoint's unless set).
max_iters=N runs steps 0..N (N+1 steps), as nanoGPT does.
"""

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from tpcomm import trace as comm_trace
from tpcomm import sharded_checkpoint
from tpcomm.runtime import RunError, RunLock, autocast_context, exit_on_run_error, make_grad_scaler, pick_device, pick_dtype, setup_runtime
from tpcomm.checkpoint import (CHECKPOINT_NAME, checkpoint_model, clean_state_dict, load_checkpoint, make_checkpoint,
                               remove_stale_temp_files, save_checkpoint)
from tpcomm.build import MODEL_TYPES, build_model
from configurator import ConfigError, configure, exit_on_config_error, save_config
from tpcomm.data_parallel import DATA_PARALLEL, INIT_DEVICES, parallelize, set_gradient_sync
from data.vocab import load_vocab
from model import GELU_FORMS, GPT2_FIXED, PRETRAINED_SIZES, GPT
from tpcomm.parallel_dims import ParallelDims, check_layout, init_parallel, shutdown
from tensor_parallel_model import TP_COMM_OPTIONS

DEFAULTS = dict(
    # I/O
    out_dir="out",
    eval_interval=2000,
    log_interval=1,
    eval_iters=200,
    eval_only=False,
    always_save_checkpoint=True,
    trace=None,  # a file path: profile step trace_iter into a Chrome trace of every collective (tpcomm/trace.py)
    trace_iter=5,  # the step traced (after a few, so start-up is not in it)
    checkpoint_format="full",  # 'full': out_dir/ckpt.pt, GPT layout, gathered | 'sharded': out_dir/ckpt_sharded (DCP)
    init_from="scratch",  # 'scratch' | 'resume' | 'gpt2' | 'gpt2-medium' | 'gpt2-large' | 'gpt2-xl'
    overwrite=False,  # a fresh run (scratch, gpt2*) into an out_dir holding another run's checkpoint: refused unless
    # True, which removes that checkpoint (ckpt.pt, ckpt_sharded) at the start so the folder holds one run
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
    gelu_approximate="none",  # 'none' (exact, nanoGPT's) | 'tanh' (GPT-2's; forced by init_from=gpt2*)
    tp_size=1,  # shards per layer (DistributedGPT)
    block_types=None,  # 'tp' | 'spd' | 'parallel' per layer (a list), or one for every layer; None = all 'tp'
    tp_mode="simulated",  # 'simulated' (one process holds every shard) | 'real' (torchrun, one shard per rank)
    loss_parallel=False,  # distributed_gpt: wte/lm_head sharded by vocabulary, vocab-parallel cross-entropy
    # distributed_gpt: how the syncs move (none changes the weights; docs/overlap.md, docs/compression.md)
    tp_async_grad=False,  # f's backward all-reduce asynchronous, hidden behind the weight gradient (docs/overlap.md)
    tp_overlap=1,  # K > 1: each tp/spd block's batch in K chunks, chunk k's all-reduce overlapping chunk k+1
    sequence_parallel=False,  # Megatron sequence parallelism: reduce-scatter + all-gather instead of all-reduce
    tp_comm_dtype=None,  # None (off) | 'bf16' | 'fp8' | 'int8': block-quantized partial sums in every g reduction
    tp_comm_block=32,  # values per absmax scale (tp_comm_dtype)
    tp_comm_exchange="one_shot",  # 'one_shot': all-gather the compressed partials | 'two_shot': reduce-scatter + all-gather
    # AdamW
    learning_rate=6e-4,
    max_iters=600000,  # steps 0..max_iters: max_iters + 1 steps, as in nanoGPT
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
    # data parallelism and memory
    data_parallel="ddp",  # 'ddp' (replicas, gradients all-reduced) | 'fsdp' (FSDP2: params/grads/AdamW sharded over dp)
    init_device="default",  # 'default' (build whole, then shard) | 'meta' (each rank allocates only what it holds)
    # pipeline parallelism (tpcomm/pipeline.py): world = pp_size x dp x tp, micro-batches per step = the dp rank's share
    # of gradient_accumulation_steps
    pp_size=1,  # pipeline stages of contiguous layers
    pp_schedule="1f1b",  # 'gpipe' | '1f1b' | 'interleaved_1f1b'
    pp_virtual_stages=1,  # stages per pp rank (interleaved_1f1b)
    pp_layers=None,  # layers per stage, a list of pp_size x pp_virtual_stages ints; None: balanced by count
)

# what a checkpoint (or GPT-2) fixes about the model, and a command line may not contradict on resume
CHECKPOINT_FORMATS = ("full", "sharded")
MODEL_KEYS = ("model_type", "n_layer", "n_head", "n_embd", "bias", "gelu_approximate", "block_types")
FULL_SCAN_TOKENS = 128 << 20  # data files up to this many tokens are scanned whole for their largest id


# ---------------------------------------------------------------------------------------------------------------
# configuration: every check a user can fail, once, before any work (nothing is written until all pass)

@dataclass
class Setup:
    """The checked configuration of a launch, and the weights it starts from."""
    data_dir: str
    dp: int
    tp: int
    pp: int
    device: str
    device_type: str
    dtype: str
    model_type: str
    model_args: dict  # nanoGPT's 7 GPTConfig fields, gelu_approximate, and tp_size/block_types (distributed_gpt)
    checkpoint: Optional[dict] = None  # init_from='resume'
    pretrained: Optional[dict] = None  # init_from=gpt2*: GPT-2's state dict


def explicit_keys(cfg, argv):
    """The keys the user set: every --key=value on the command line, and every key a config file changed from its
    default (a file that sets a key to its default value is not told apart from leaving it alone)."""
    given = {arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--") and "=" in arg}
    return given | {k for k in cfg if cfg[k] != DEFAULTS[k]}


def check_settings(cfg):
    """Ranges and choices of the plain settings."""
    positive = ("batch_size", "block_size", "n_layer", "n_head", "n_embd", "tp_size", "pp_size", "pp_virtual_stages",
                "gradient_accumulation_steps", "eval_iters", "eval_interval", "log_interval")
    for key in positive:
        if cfg[key] < 1:
            raise ConfigError(f"{key} must be >= 1, got {cfg[key]}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "seed", "learning_rate", "min_lr", "weight_decay",
                "grad_clip"):
        if cfg[key] < 0:
            raise ConfigError(f"{key} must be >= 0, got {cfg[key]}")
    for key in ("beta1", "beta2"):
        if not 0.0 <= cfg[key] < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {cfg[key]}")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {cfg['dropout']}")
    if cfg["model_type"] not in MODEL_TYPES:
        raise ConfigError(f"model_type must be one of {MODEL_TYPES}, got {cfg['model_type']!r}")
    if cfg["gelu_approximate"] not in GELU_FORMS:
        raise ConfigError(f"gelu_approximate must be one of {GELU_FORMS}, got {cfg['gelu_approximate']!r}")
    if cfg["data_parallel"] not in DATA_PARALLEL:
        raise ConfigError(f"data_parallel must be one of {DATA_PARALLEL}, got {cfg['data_parallel']!r}")
    if cfg["init_device"] not in INIT_DEVICES:
        raise ConfigError(f"init_device must be one of {INIT_DEVICES}, got {cfg['init_device']!r}")
    if cfg["init_from"] not in ("scratch", "resume") and cfg["init_from"] not in PRETRAINED_SIZES:
        raise ConfigError(f"init_from must be 'scratch', 'resume' or one of {sorted(PRETRAINED_SIZES)}, "
                          f"got {cfg['init_from']!r}")
    if os.path.exists(cfg["out_dir"]) and not os.path.isdir(cfg["out_dir"]):
        raise ConfigError(f"out_dir {cfg['out_dir']!r} exists and is not a directory")
    if cfg["trace"] is not None:
        folder = os.path.dirname(os.path.abspath(str(cfg["trace"])))
        if not isinstance(cfg["trace"], str) or not cfg["trace"] or not os.path.isdir(folder):
            raise ConfigError(f"trace must be a file path in an existing folder, got {cfg['trace']!r}")
        if not isinstance(cfg["trace_iter"], int) or not 0 <= cfg["trace_iter"] <= cfg["max_iters"]:
            raise ConfigError(f"trace_iter must be an iteration in 0..max_iters ({cfg['max_iters']}), "
                              f"got {cfg['trace_iter']!r}")
    if cfg["checkpoint_format"] not in CHECKPOINT_FORMATS:
        raise ConfigError(f"checkpoint_format must be one of {CHECKPOINT_FORMATS}, got {cfg['checkpoint_format']!r}")
    if cfg["init_from"] == "resume":
        full = os.path.join(cfg["out_dir"], CHECKPOINT_NAME)
        if cfg["checkpoint_format"] == "full" and not os.path.isfile(full):
            hint = (" (there is a sharded one: resume with checkpoint_format='sharded', or convert it with python "
                    "-m tpcomm.sharded_checkpoint OUT_DIR)" if sharded_checkpoint.has_sharded(cfg["out_dir"]) else "")
            raise ConfigError(f"init_from='resume' but there is no checkpoint at {full}{hint}")
        if cfg["checkpoint_format"] == "sharded" and not sharded_checkpoint.has_sharded(cfg["out_dir"]):
            raise ConfigError(f"init_from='resume' with checkpoint_format='sharded' but there is no sharded "
                              f"checkpoint at {sharded_checkpoint.sharded_path(cfg['out_dir'])}")
    elif not cfg["overwrite"]:
        found = previous_checkpoints(cfg["out_dir"])
        if found:
            raise ConfigError(f"out_dir {cfg['out_dir']!r} holds another run's checkpoint ({found[0]}); a fresh run "
                              f"(init_from={cfg['init_from']!r}) would leave it beside its own config and metrics: "
                              f"continue that run with --init_from=resume, use another out_dir, or give "
                              f"--overwrite=True to replace it")


def previous_checkpoints(out_dir):
    """The checkpoints an earlier run left in out_dir: ckpt.pt and the ckpt_sharded link (or folder)."""
    paths = (os.path.join(out_dir, CHECKPOINT_NAME), sharded_checkpoint.sharded_path(out_dir))
    return [p for p in paths if os.path.lexists(p)]


def expand_block_types(block_types, n_layer):
    kinds = "tp" if block_types is None else block_types
    return [kinds] * n_layer if isinstance(kinds, str) else list(kinds)


def adopt_model(cfg, explicit, *, source, model_type, spec):
    """Take the model from a checkpoint or GPT-2 (`spec`): cfg's model keys become the source's; one the user set
    explicitly to another value is an error naming the key and both values."""
    given = dict(cfg, block_types=expand_block_types(cfg["block_types"], cfg["n_layer"]))
    wanted = dict(spec, model_type=model_type or cfg["model_type"])
    for key in MODEL_KEYS:
        if key not in wanted or (key == "block_types" and wanted["model_type"] != "distributed_gpt"):
            continue
        if key in explicit and given[key] != wanted[key]:
            raise ConfigError(f"{key}={given[key]!r} contradicts {source}'s {key}={wanted[key]!r}; "
                              f"drop the setting (the model comes from {source})")
        cfg[key] = wanted[key]
    if wanted["model_type"] == "distributed_gpt" and "tp_size" not in explicit and "tp_size" in spec:
        cfg["tp_size"] = spec["tp_size"]  # may change on resume (checkpoints are GPT-layout); kept unless set
    if wanted["model_type"] == "distributed_gpt" and "loss_parallel" not in explicit and "loss_parallel" in spec:
        cfg["loss_parallel"] = spec["loss_parallel"]  # likewise
    if "dropout" not in explicit and "dropout" in spec:
        cfg["dropout"] = spec["dropout"]  # may change on resume; kept unless set
    if cfg["block_size"] > spec["block_size"]:
        if "block_size" in explicit:
            raise ConfigError(f"block_size ({cfg['block_size']}) exceeds {source}'s ({spec['block_size']})")
        cfg["block_size"] = spec["block_size"]


def check_model(cfg):
    """The model's shape and parallel settings, with the values the run will use."""
    if cfg["n_embd"] % cfg["n_head"]:
        raise ConfigError(f"n_embd ({cfg['n_embd']}) must be divisible by n_head ({cfg['n_head']})")
    if cfg["model_type"] == "distributed_gpt":
        from tensor_parallel_model import validate_tp_args

        validate_tp_args(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                         tp_size=cfg["tp_size"], block_types=cfg["block_types"])
        check_sync_options(cfg)
        from tpcomm.compression import validate_compression

        validate_compression(tp_comm_dtype=cfg["tp_comm_dtype"], tp_comm_block=cfg["tp_comm_block"],
                             n_embd=cfg["n_embd"], tp_size=cfg["tp_size"], sequence_parallel=cfg["sequence_parallel"],
                             tp_comm_exchange=cfg["tp_comm_exchange"])
    elif cfg["tp_size"] != 1 or cfg["block_types"] is not None or cfg["tp_mode"] != "simulated":
        raise ConfigError(f"tp_size/block_types/tp_mode need model_type='distributed_gpt', "
                          f"got model_type={cfg['model_type']!r}, tp_size={cfg['tp_size']}, "
                          f"block_types={cfg['block_types']}, tp_mode={cfg['tp_mode']!r}")
    elif cfg["loss_parallel"]:
        raise ConfigError(f"loss_parallel=True needs model_type='distributed_gpt' (it shards wte/lm_head over the "
                          f"tensor-parallel shards), got model_type={cfg['model_type']!r}")
    else:
        changed = {k: cfg[k] for k in TP_COMM_OPTIONS if cfg[k] != DEFAULTS[k]}
        if changed:
            raise ConfigError(f"{', '.join(f'{k}={v!r}' for k, v in changed.items())} needs "
                              f"model_type='distributed_gpt', got model_type={cfg['model_type']!r}")


def check_sync_options(cfg):
    """tp_overlap and sequence_parallel (docs/overlap.md), with the batch this run will use."""
    from tensor_parallel_model import validate_sync_options

    validate_sync_options(tp_overlap=cfg["tp_overlap"], sequence_parallel=cfg["sequence_parallel"],
                          block_types=expand_block_types(cfg["block_types"], cfg["n_layer"]))
    if cfg["batch_size"] % cfg["tp_overlap"]:
        raise ConfigError(f"tp_overlap ({cfg['tp_overlap']}) must divide batch_size ({cfg['batch_size']}): each "
                          f"chunk is whole sequences")
    if cfg["sequence_parallel"] and cfg["batch_size"] * cfg["block_size"] % cfg["tp_size"]:
        raise ConfigError(f"sequence_parallel=True needs batch_size x block_size ({cfg['batch_size']} x "
                          f"{cfg['block_size']}) divisible by tp_size ({cfg['tp_size']})")


def check_pipeline(cfg, explicit, *, dp, tp, dtype):
    """pp_size > 1: the pipeline layout (pipeline.validate_pp_layout) and what does not run with it yet."""
    from tpcomm.pipeline import SCHEDULES, validate_pp_layout

    if cfg["pp_schedule"] not in SCHEDULES:
        raise ConfigError(f"pp_schedule must be one of {list(SCHEDULES)}, got {cfg['pp_schedule']!r}")
    if cfg["pp_size"] == 1:
        if cfg["pp_virtual_stages"] != 1 or cfg["pp_layers"] is not None:
            raise ConfigError(f"pp_virtual_stages ({cfg['pp_virtual_stages']}) and pp_layers ({cfg['pp_layers']}) "
                              f"need pp_size > 1")
        return
    validate_pp_layout(world=cfg["pp_size"] * dp * tp, pp_size=cfg["pp_size"], tp=tp, n_layer=cfg["n_layer"],
                       schedule=cfg["pp_schedule"], n_microbatches=cfg["gradient_accumulation_steps"] // dp,
                       virtual_stages=cfg["pp_virtual_stages"], pp_layers=cfg["pp_layers"],
                       keys=dict(schedule="pp_schedule", virtual_stages="pp_virtual_stages",
                                 n_microbatches="micro-batches per replica (gradient_accumulation_steps / dp)"))
    unsupported = dict(data_parallel=cfg["data_parallel"] == "fsdp", init_device=cfg["init_device"] == "meta",
                       loss_parallel=bool(cfg["loss_parallel"]), sequence_parallel=cfg["sequence_parallel"] is True,
                       checkpoint_format=cfg["checkpoint_format"] == "sharded", dtype=dtype == "float16",
                       compile=cfg["compile"] and "compile" in explicit)
    for key, bad in unsupported.items():
        if bad:
            value = dtype if key == "dtype" else cfg[key]
            raise ConfigError(f"{key}={value!r} does not run with pp_size={cfg['pp_size']} (pipeline stages run "
                              f"DDP, fp32/bf16, full checkpoints, no torch.compile)")
    cfg["compile"] = False  # the default (True) is not applied to pipeline stages


def check_data(cfg, data_dir, vocab_size):
    """train.bin and val.bin: present, whole uint16 tokens, longer than a block, every id < vocab_size. Files up to
    FULL_SCAN_TOKENS tokens are scanned whole for their largest id; larger ones (OpenWebText) in 1024 evenly spaced
    chunks of 64K tokens, a sample that catches a wrong tokenizer but not a single stray id."""
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise ConfigError(f"dataset {cfg['dataset']!r}: {path} not found "
                              f"(run python data/{cfg['dataset']}/prepare.py)")
        size = os.path.getsize(path)
        if size % 2:
            raise ConfigError(f"dataset {cfg['dataset']!r}: {path} has an odd number of bytes ({size}); "
                              f"token files hold uint16 ids (2 bytes each): truncated or not a token file")
        n = size // 2
        if n <= cfg["block_size"] + 1:
            raise ConfigError(f"dataset {cfg['dataset']!r}: {split}.bin has {n} tokens, "
                              f"fewer than block_size+2 ({cfg['block_size'] + 2})")
        data = np.memmap(path, dtype=np.uint16, mode="r")
        if n <= FULL_SCAN_TOKENS:
            top = int(data.max())
        else:
            chunk = 1 << 16
            top = max(int(data[s:s + chunk].max()) for s in np.linspace(0, n - chunk, 1024).astype(np.int64))
        if top >= vocab_size:
            raise ConfigError(f"dataset {cfg['dataset']!r}: {path} holds token id {top}, but the model's "
                              f"vocab_size is {vocab_size}")


def load_pretrained(name, *, dropout):
    try:
        return GPT.from_pretrained(name, dict(dropout=dropout)).state_dict()
    except OSError as e:  # no network and no Hugging Face cache
        raise ConfigError(f"init_from={name!r}: cannot load the pretrained weights "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def prepare(argv):
    """(cfg, Setup): the configuration resolved and checked. Reads the checkpoint (resume) or GPT-2's weights."""
    cfg = configure(DEFAULTS, argv)
    explicit = explicit_keys(cfg, argv)
    check_settings(cfg)
    device = pick_device(cfg["device"])
    device_type = "cuda" if device.startswith("cuda") else device
    dtype = pick_dtype(cfg["dtype"], device_type)
    data_dir = cfg["data_dir"] or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", cfg["dataset"])
    vocab = load_vocab(data_dir) if os.path.isdir(data_dir) else None
    meta_vocab = vocab["vocab_size"] if vocab is not None else None

    # the model: from the checkpoint, from GPT-2, or from the configuration
    checkpoint = pretrained = None
    if cfg["init_from"] == "resume":
        checkpoint = (load_checkpoint(cfg["out_dir"]) if cfg["checkpoint_format"] == "full"
                      else sharded_checkpoint.load_sharded_meta(cfg["out_dir"]))  # sharded: no tensors yet
        model_type, spec = checkpoint_model(checkpoint)
        adopt_model(cfg, explicit, source="the checkpoint", model_type=model_type, spec=spec)
        vocab_size = spec["vocab_size"]
    elif cfg["init_from"] in PRETRAINED_SIZES:
        spec = dict(PRETRAINED_SIZES[cfg["init_from"]], **GPT2_FIXED)
        adopt_model(cfg, explicit, source=cfg["init_from"], model_type=None, spec=spec)
        vocab_size = spec["vocab_size"]
    else:
        vocab_size = meta_vocab if meta_vocab is not None else 50304  # GPT-2's 50257 padded to a multiple of 64
    check_model(cfg)
    dp, tp = check_layout(tp_size=cfg["tp_size"], tp_mode=cfg["tp_mode"], pp_size=cfg["pp_size"])
    if checkpoint is not None and "layout" in checkpoint:  # a sharded checkpoint loads into its own tp layout only
        sharded_checkpoint.check_resumable(checkpoint["layout"], dict(
            tp_size=cfg["tp_size"] if cfg["model_type"] == "distributed_gpt" else 1, tp_real=tp > 1,
            loss_parallel=bool(cfg["loss_parallel"]), block_size=cfg["block_size"]), cfg["out_dir"])
    if cfg["gradient_accumulation_steps"] % dp:
        raise ConfigError(f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) must be divisible "
                          f"by the number of data-parallel ranks ({dp})")
    check_pipeline(cfg, explicit, dp=dp, tp=tp, dtype=dtype)
    if meta_vocab is not None and meta_vocab > vocab_size:
        raise ConfigError(f"dataset {cfg['dataset']!r} has vocab_size {meta_vocab}, "
                          f"larger than the model's vocab_size {vocab_size}")
    check_data(cfg, data_dir, vocab_size)
    if cfg["init_from"] in PRETRAINED_SIZES:  # last: the download is the slow part
        pretrained = load_pretrained(cfg["init_from"], dropout=cfg["dropout"])

    model_args = {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "dropout",
                                      "gelu_approximate", "tp_size", "block_types", "loss_parallel",
                                      *TP_COMM_OPTIONS)}
    model_args.update(vocab_size=vocab_size, block_size=spec["block_size"] if cfg["init_from"] != "scratch"
                      else cfg["block_size"])
    setup = Setup(data_dir=data_dir, dp=dp, tp=tp, pp=cfg["pp_size"], device=device, device_type=device_type,
                  dtype=dtype, model_type=cfg["model_type"], model_args=model_args, checkpoint=checkpoint,
                  pretrained=pretrained)
    return cfg, setup


# ---------------------------------------------------------------------------------------------------------------
# data, learning rate, metrics

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
    """JSON lines in out_dir/metrics.jsonl (one record per logged step and per evaluation), so plots never need
    wandb. Written by the master rank only."""

    def __init__(self, out_dir, *, enabled):
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.enabled = enabled

    def write(self, **record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def truncate(self, iter_num):
        """Drop the records of iterations >= iter_num (a resumed run writes them again), atomically."""
        if not self.enabled or not os.path.isfile(self.path):
            return
        with open(self.path) as f:
            lines = f.readlines()
        keep = []
        for line in lines:
            try:
                if json.loads(line)["iter"] >= iter_num:
                    continue
            except (ValueError, KeyError, TypeError):  # a torn last line of a killed run
                continue
            keep.append(line if line.endswith("\n") else line + "\n")
        with open(self.path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(self.path + ".tmp", self.path)


# ---------------------------------------------------------------------------------------------------------------
# the run

@dataclass
class Run:
    """What the training loop works on; built once by start_run."""
    cfg: dict
    pd: ParallelDims
    device: str
    model: torch.nn.Module  # what runs forward: raw_model, compiled and/or wrapped in DDP (or FSDP-sharded)
    raw_model: GPT  # GPT or DistributedGPT: the interface at the end of class GPT
    pipe: object  # pp_size > 1: this rank's pipeline.Pipeline (it runs the steps), else None
    sync_module: torch.nn.Module  # what gradient sync is switched on (DDP wrapper, FSDP module, or the model)
    model_type: str
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


def load_optimizer_state(raw_model, optimizer, state):
    """A checkpoint's optimizer state; how the optimizer runs (fused, foreach) stays this run's own, so a
    checkpoint written on CUDA resumes on CPU."""
    own = optimizer.param_groups
    groups = [dict(g, **{k: o[k] for k in ("fused", "foreach", "capturable") if k in o})
              for g, o in zip(state["param_groups"], own)]
    raw_model.load_gpt_optimizer_state(optimizer, dict(state, param_groups=groups))


def cropped(state_dict, block_size):
    """A GPT-layout state dict with the position embeddings of the first block_size positions (crop_block_size)."""
    wpe = state_dict["transformer.wpe.weight"]
    return dict(state_dict, **{"transformer.wpe.weight": wpe[:block_size]}) if wpe.size(0) > block_size \
        else state_dict


def tidy_out_dir(cfg):
    """Before a run writes into out_dir (the master, holding its lock): the temp files of checkpoint writes that were
    killed (their writer is dead) go, with a warning; a fresh run with overwrite=True removes the checkpoint of the
    run it replaces, so the folder never holds one run's config beside another's checkpoint."""
    stale = remove_stale_temp_files(cfg["out_dir"])
    if stale:
        sys.stderr.write(f"warning: removed {len(stale)} stale temporary checkpoint file(s) of killed writes: "
                         f"{', '.join(stale)}\n")
    if cfg["init_from"] != "resume" and cfg["overwrite"]:
        previous = previous_checkpoints(cfg["out_dir"])
        if previous:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(cfg["out_dir"], CHECKPOINT_NAME))
            sharded_checkpoint.remove_sharded(cfg["out_dir"])
            print(f"overwrite=True: removed the previous run's checkpoint ({', '.join(previous)})")


def resume_state(checkpoint, cfg, pd, *, model, state, optimizer, scaler, device, device_type):
    """A checkpoint's optimizer state (sharded: loaded in place), loss scaler and RNGs; (iter_num, best_val_loss)."""
    if "layout" in checkpoint:  # sharded
        sharded_checkpoint.load_sharded(model, optimizer, cfg["out_dir"], pd)
        for group, saved in zip(optimizer.param_groups, checkpoint["param_groups"]):
            group.update({k: v for k, v in saved.items() if k not in ("params", "fused", "foreach", "capturable")})
    else:
        load_optimizer_state(state, optimizer, checkpoint["optimizer"])
    if checkpoint.get("scaler") and scaler.is_enabled():
        scaler.load_state_dict(checkpoint["scaler"])
    if "rng_state" in checkpoint:  # nanoGPT's checkpoints have none
        torch.set_rng_state(checkpoint["rng_state"])
    if "cuda_rng_state" in checkpoint and device_type == "cuda":
        torch.cuda.set_rng_state(checkpoint["cuda_rng_state"], device)
    return int(checkpoint["iter_num"]), float(checkpoint["best_val_loss"])


def start_run(cfg, setup, pd):
    """Build the model (from scratch, a checkpoint or GPT-2), the optimizer and the data, as nanoGPT's train.py.
    The model is built whole on the device (init_device='default') or on the meta device and materialised after
    FSDP has sharded it, each rank allocating only its own part (init_device='meta'); checkpoint or GPT-2 weights
    are loaded before DDP/FSDP (default) or after materialising (meta). Either way the weights are the same."""
    device = f"cuda:{pd.local_rank}" if pd.distributed and setup.device_type == "cuda" else setup.device
    grad_accum = cfg["gradient_accumulation_steps"] // pd.dp
    tokens_per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    if pd.is_master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        tidy_out_dir(cfg)
        save_config(cfg, cfg["out_dir"])
        pp = f"pp={pd.pp} {cfg['pp_schedule']}, " if pd.pp > 1 else ""
        print(f"tokens per iteration: {tokens_per_iter:,} ({pp}dp={pd.dp}, tp={cfg['tp_size']} {cfg['tp_mode']}, "
              f"grad_accum per rank={grad_accum}, device={device}, dtype={setup.dtype}, "
              f"data_parallel={cfg['data_parallel']}, init_device={cfg['init_device']})")
    setup_runtime(setup.device_type, cfg["seed"])  # same seed on every rank: identical initial weights

    # model: built (whole, or on the meta device), weights loaded, DDP-wrapped or FSDP-sharded, compiled
    checkpoint = setup.checkpoint
    sharded = checkpoint is not None and "layout" in checkpoint  # loaded in place once the model is sharded
    weights = clean_state_dict(checkpoint["model"]) if checkpoint is not None and not sharded else setup.pretrained
    setup.pretrained = None  # free memory
    meta = cfg["init_device"] == "meta"
    model = build_model(setup.model_type, setup.model_args, pd=pd, init_device=cfg["init_device"])
    if weights is not None and not meta:
        model.load_gpt_state_dict(weights)
    if cfg["block_size"] < model.config.block_size:  # before sharding: it replaces the wpe parameter
        model.crop_block_size(cfg["block_size"])
    if not meta and pd.pp == 1:  # pipeline stages: each rank moves only its own stages (Pipeline)
        model.to(device)
    if cfg["compile"] and pd.is_master:
        print("compiling the model... (takes a ~minute)")
    pipe = None
    if pd.pp > 1:  # every rank holds the whole model (on the CPU) and runs its stages' part (DDP over dp per stage)
        from tpcomm.pipeline import Pipeline

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
        print(f"model: {setup.model_type}, {model.get_num_params() / 1e6:.2f}M parameters")

    # optimizer (over the sharded parameters under FSDP) and loss scaler; on resume also their state and the RNGs
    scaler = make_grad_scaler(setup.device_type, setup.dtype, pd, data_parallel=cfg["data_parallel"])
    state = pipe or model  # what holds this rank's parameters: GPT-layout state, optimizer, clipping
    optimizer = state.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), setup.device_type)
    iter_num, best_val_loss = 0, 1e9
    if checkpoint is not None:
        iter_num, best_val_loss = resume_state(checkpoint, cfg, pd, model=model, state=state, optimizer=optimizer,
                                               scaler=scaler, device=device, device_type=setup.device_type)
        setup.checkpoint = None  # free memory

    metrics = MetricsLog(cfg["out_dir"], enabled=pd.is_master)
    metrics.truncate(iter_num)  # a resumed run must not leave two records of one iteration
    return Run(cfg=cfg, pd=pd, device=device, model=run_model, raw_model=model, pipe=pipe, sync_module=sync_module,
               model_type=setup.model_type, optimizer=optimizer, scaler=scaler,
               ctx=autocast_context(setup.device_type, setup.dtype),
               batches=Batches(setup.data_dir, block_size=cfg["block_size"], batch_size=cfg["batch_size"],
                               seed=cfg["seed"], device=device),
               metrics=metrics, grad_accum=grad_accum, micro_offset=pd.dp_rank * grad_accum,
               iter_num=iter_num, best_val_loss=best_val_loss, dtype=setup.dtype)


def eval_losses(run, split, ks, n):
    """(sum, count) of the losses of eval batches ks of a split; batches k >= n only keep the collectives in step
    (repeated, not counted). Under pp the batches go through the schedule, m at a time."""
    if run.pipe is None:
        losses = [0.0, 0]
        for k in ks:
            X, Y = run.batches.get(split, -1, k if k < n else run.pd.dp_rank % n)
            with run.ctx:
                _, loss = run.model(X, Y)
            if k < n:
                losses[0] += loss.item()
                losses[1] += 1
        return losses
    m = run.pipe.m
    batches = [run.batches.get(split, -1, k if k < n else run.pd.dp_rank % n) for k in ks]
    counted = torch.tensor([k < n for k in ks], dtype=torch.float64, device=run.device)
    per_batch = torch.cat([run.pipe.eval_losses(batches[i:i + m], ctx=run.ctx) for i in range(0, len(ks), m)])
    return [(per_batch * counted).sum().item(), int(counted.sum().item())]


@torch.no_grad()
def evaluate(run):
    """Mean loss over eval_iters batches of each split. Eval batch k is done by dp rank k % dp; the mean over ranks
    equals one process doing all of them. Under FSDP every forward is a collective over dp (the parameters are
    gathered), so each rank runs as many: a rank out of batches repeats its first one and does not count it. Under
    pp every schedule call runs m micro-batches and ends with collectives over pp: each rank runs as many rounds of
    m, filled up the same way."""
    out = {}
    state = run.pipe or run.model
    state.train(False)
    dp, n = run.pd.dp, run.cfg["eval_iters"]
    per_rank = -(-n // dp)  # ceil(n / dp) batches on the busiest rank
    rounds = per_rank if run.cfg["data_parallel"] == "fsdp" else None
    if run.pipe is not None:  # whole schedule calls of m micro-batches
        rounds = -(-per_rank // run.pipe.m) * run.pipe.m
    for split in ("train", "val"):
        ks = range(run.pd.dp_rank, n if rounds is None else rounds * dp, dp)
        t = torch.tensor(eval_losses(run, split, ks, n), dtype=torch.float64, device=run.device)
        if run.pd.dp > 1:
            torch.distributed.all_reduce(t, group=run.pd.dp_group)
        out[split] = (t[0] / t[1]).item()
    state.train(True)
    return out


def save(run):
    """checkpoint_format='full': write out_dir/ckpt.pt in GPT layout: every rank joins the gather (a collective
    under real tp and under FSDP, whose shards are gathered whole), the master writes. 'sharded': every rank writes
    the shards it holds to out_dir/ckpt_sharded (tpcomm/sharded_checkpoint.py), nothing is gathered."""
    sharded = run.cfg["checkpoint_format"] == "sharded"
    checkpoint = make_checkpoint(run.pipe or run.raw_model, run.optimizer, run.scaler, model_type=run.model_type,
                                 iter_num=run.iter_num, best_val_loss=run.best_val_loss, config=run.cfg,
                                 tensors=not sharded)
    if sharded:
        if run.pd.is_master:
            print(f"saving sharded checkpoint to {sharded_checkpoint.sharded_path(run.cfg['out_dir'])}")
        sharded_checkpoint.save_sharded(run.raw_model, run.optimizer, checkpoint, run.cfg["out_dir"], run.pd)
    elif run.pd.is_master:
        print(f"saving checkpoint to {run.cfg['out_dir']}")
        save_checkpoint(checkpoint, run.cfg["out_dir"])
    run.saved_iter = run.iter_num


def train_step(run):
    """One optimizer step over the global batch. Returns (mean loss, seconds the step took, collectives report)."""
    cfg, raw_model = run.cfg, run.raw_model
    if run.pipe is not None:
        return pipeline_step(run)
    t0 = time.perf_counter()
    raw_model.reset_comm_counts()
    # forward backward update, with gradient accumulation; DDP/FSDP sync gradients on the last micro-step only
    loss_sum = 0.0
    for micro_step in range(run.grad_accum):
        micro = run.micro_offset + micro_step  # global micro-batch index: keys the batch and the dropout masks
        X, Y = run.batches.get("train", run.iter_num, micro)
        raw_model.seed_dropout(cfg["seed"], run.iter_num, micro)
        set_gradient_sync(run.sync_module, enabled=micro_step == run.grad_accum - 1)
        with run.ctx:
            _, loss = run.model(X, Y)
            loss = loss / run.grad_accum  # scale the loss to account for gradient accumulation
        loss_sum += loss.item()
        run.scaler.scale(loss).backward()
    raw_model.sync_replicated_grads()  # real tp: parameters every shard holds get their summed gradient
    comm = raw_model.comm_report(micro_steps=run.grad_accum, tokens=cfg["batch_size"] * cfg["block_size"])
    # clip the gradient
    if cfg["grad_clip"] != 0.0:
        run.scaler.unscale_(run.optimizer)
        raw_model.clip_grad_norm_(cfg["grad_clip"])
    # step the optimizer and the scaler (if training in fp16)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    lossf = all_reduce_mean(loss_sum, run.pd, run.device)
    return lossf, time.perf_counter() - t0, comm


def pipeline_step(run):
    """train_step under pp: this replica's micro-batches through the schedule (which also syncs the gradients: over
    dp, the tied embedding, tp-replicated parameters), then clip and update as one process would."""
    cfg, pipe = run.cfg, run.pipe
    t0 = time.perf_counter()
    pipe.reset_comm_counts()
    batches = [run.batches.get("train", run.iter_num, run.micro_offset + j) for j in range(run.grad_accum)]
    lossf = pipe.step(batches, dropout_key=(cfg["seed"], run.iter_num, run.micro_offset), ctx=run.ctx)
    comm = pipe.comm_report(tokens=cfg["batch_size"] * cfg["block_size"])
    if cfg["grad_clip"] != 0.0:
        pipe.clip_grad_norm_(cfg["grad_clip"])
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return lossf, time.perf_counter() - t0, comm


def stop_if_not_finite(run, what, value):
    """A non-finite loss stops the run before anything is saved: the last good checkpoint stays as it is."""
    if not math.isfinite(value):
        raise RunError(f"{what} loss is {value} at iter {run.iter_num}; stopping. The last good checkpoint "
                       f"(if any) is kept in {run.cfg['out_dir']}")


def eta(done, left, start):
    """Progress for the log line (plain text: a log file gets no progress-bar escape codes): the time left at the
    mean pace of this process's iterations so far, evaluations included."""
    seconds = round((time.perf_counter() - start) / max(done, 1) * left)
    return f"eta {seconds // 3600}h{seconds // 60 % 60:02d}m{seconds % 60:02d}s"


def train(run):
    """The training loop, as nanoGPT's: evaluate and checkpoint every eval_interval and at the last iteration
    (max_iters, before its step, as nanoGPT does when max_iters is a multiple of eval_interval), one step per
    iteration. Ends with a closing line."""
    cfg, master = run.cfg, run.pd.is_master
    tokens_per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    wandb = None
    if cfg["wandb_log"] and master:
        import wandb

        wandb.init(project=cfg["wandb_project"], name=cfg["wandb_run_name"], config=cfg)
    local_iter_num, running_mfu = 0, -1.0
    first_iter, last_eval = run.iter_num, None  # (iteration, losses) of the last evaluation
    loop_start = time.perf_counter()
    while True:
        # determine and set the learning rate for this iteration
        lr = get_lr(run.iter_num, cfg)
        for group in run.optimizer.param_groups:
            group["lr"] = lr

        # evaluate the loss on train/val sets and write checkpoints (never a non-finite model); always at the last
        # iteration, so a run ends evaluated and saved whatever eval_interval is
        if run.iter_num % cfg["eval_interval"] == 0 or run.iter_num == cfg["max_iters"]:
            losses = evaluate(run)
            last_eval = (run.iter_num, losses)
            if master:
                print(f"step {run.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                run.metrics.write(iter=run.iter_num, train_loss=losses["train"], val_loss=losses["val"], lr=lr)
                if wandb is not None:
                    wandb.log({"iter": run.iter_num, "train/loss": losses["train"], "val/loss": losses["val"],
                               "lr": lr, "mfu": running_mfu * 100})
            for split in ("train", "val"):
                stop_if_not_finite(run, f"{split} (evaluation)", losses[split])
            if losses["val"] < run.best_val_loss or cfg["always_save_checkpoint"]:
                run.best_val_loss = min(run.best_val_loss, losses["val"])
                if run.iter_num > 0 and not cfg["eval_only"]:
                    save(run)
        if cfg["eval_only"]:
            break

        # one training step: forward/backward with gradient accumulation, clip, update; timed on its own
        traced = cfg["trace"] is not None and run.iter_num == cfg["trace_iter"]
        trace = comm_trace.rank_path(cfg["trace"], run.pd.rank) if traced else None
        with comm_trace.trace_steps(trace, enabled=traced) as tracer, tracer.step():
            lossf, dt, comm = train_step(run)
        if traced and master:
            print(f"trace of step {run.iter_num}: {cfg['trace']}"
                  + (" (rank r: .rank<r> before the extension)" if run.pd.distributed else ""))
        stop_if_not_finite(run, "training", lossf)

        # logging
        if run.iter_num % cfg["log_interval"] == 0 and master:
            if local_iter_num >= 5:  # let the training loop settle a bit
                mfu = run.raw_model.estimate_mfu(cfg["batch_size"] * run.grad_accum, dt, device=run.device,
                                                   dtype=run.dtype)
                if mfu is not None:
                    mfu /= run.pd.pp  # a replica runs on pp times the devices of one stage group
                    running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            mfu_str = f"{running_mfu * 100:.2f}%" if running_mfu >= 0 else "n/a"
            tok_s = tokens_per_iter / dt
            comm_str = f", all-reduces fwd {comm['fwd_allreduces']} bwd {comm['bwd_allreduces']}" if comm else ""
            if "vocab_allreduces" in comm:
                comm_str += f", vocab {comm['vocab_allreduces']}"
            if "pp_bytes_per_token" in comm:
                comm_str += f", pp {comm['pp_bytes_per_token']:,.0f} B/token"
            print(f"iter {run.iter_num}/{cfg['max_iters']}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, "
                  f"tok/s {tok_s:,.0f}, mfu {mfu_str}{comm_str}, "
                  f"{eta(run.iter_num - first_iter + 1, cfg['max_iters'] - run.iter_num, loop_start)}")
            run.metrics.write(iter=run.iter_num, loss=lossf, lr=lr, dt_ms=dt * 1000, tokens_per_s=tok_s,
                              mfu=running_mfu if running_mfu >= 0 else None, **comm)
        run.iter_num += 1
        local_iter_num += 1

        # termination conditions: steps 0..max_iters, as nanoGPT
        if run.iter_num > cfg["max_iters"]:
            break
    if wandb is not None:
        wandb.finish()
    if master:
        print(closing_line(run, first_iter, last_eval))


def closing_line(run, first_iter, last_eval):
    """'done: ...': the steps run, the last evaluation, and the checkpoint this run left (or why none)."""
    cfg = run.cfg
    path = (sharded_checkpoint.sharded_path(cfg["out_dir"]) if cfg["checkpoint_format"] == "sharded"
            else os.path.join(cfg["out_dir"], CHECKPOINT_NAME))
    evaluated = f"val loss {last_eval[1]['val']:.4f} at iter {last_eval[0]}" if last_eval else "not evaluated"
    if cfg["eval_only"]:
        return f"done: evaluation only (eval_only=True), {evaluated}"
    if run.saved_iter is not None:
        saved = f"checkpoint {path} (iter {run.saved_iter})"
    elif last_eval is None or last_eval[0] == 0:
        saved = "no checkpoint (iteration 0 is never saved, as in nanoGPT)"
    else:
        saved = (f"no checkpoint written: val loss never improved on {run.best_val_loss:.4f} "
                 f"(always_save_checkpoint=False)")
    steps = run.iter_num - first_iter
    return f"done: {steps} step{'s' * (steps != 1)} (iters {first_iter}..{run.iter_num - 1}), {evaluated}, {saved}"


@exit_on_config_error
@exit_on_run_error
def main(argv):
    cfg, setup = prepare(argv)
    pd = init_parallel(dp=setup.dp, tp=setup.tp, pp=setup.pp, device_type=setup.device_type, backend=cfg["backend"])
    finished = False
    try:
        # one run per out_dir: the master holds the directory's lock for the whole run, before writing anything
        lock = RunLock(cfg["out_dir"], what="train.py run") if pd.is_master else contextlib.nullcontext()
        with lock:
            train(start_run(cfg, setup, pd))
        finished = True
    finally:
        shutdown(pd, finished=finished)


if __name__ == "__main__":
    main(sys.argv[1:])
