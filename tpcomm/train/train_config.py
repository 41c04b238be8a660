"""
train.py's configuration: its options (DEFAULTS), and every check a user can fail, once, before
any work: nothing is written until all pass (prepare). A refusal is a ConfigError naming the
key and the value: one line, exit 2.
"""

import os
from dataclasses import dataclass
from typing import Optional

from tpcomm.errors import ConfigError
from tpcomm.configuration import configure
from data.vocab import load_vocab
from model import GPT2_FIXED, PRETRAINED_SIZES, GPT, GPTConfig
from tpcomm import ROOT
from tpcomm.train import sharded_checkpoint
from tpcomm.train.batches import check_data
from tpcomm.train.checkpoint import (CHECKPOINT_NAME, RESUME_FIELDS, check_fields, checkpoint_model,
                                     checkpoint_sync_options, load_checkpoint)
from tpcomm.parallel.data_parallel import DATA_PARALLEL, INIT_DEVICES
from tpcomm.train.output_path import check_output_file, written_by
from tpcomm.model.block_types.registry import option_defaults, option_fields
from tpcomm.model.options import (FUNCTION_SYNC_OPTIONS, MODEL_TYPES, TP_DEFAULTS, check_batch,
                                  expand_block_types, model_config, private_head)
from tpcomm.parallel.parallel_dims import check_backend, check_dp_shard, check_layout
from tpcomm.parallel.pipeline_config import SCHEDULE_NAMES, validate_pp_layout
from tpcomm.train.runtime import check_dtype, pick_device_and_dtype

DEFAULTS = dict(
    # I/O
    out_dir="out",
    eval_interval=2000,
    log_interval=1,
    eval_iters=200,
    eval_only=False,
    always_save_checkpoint=True,
    # a file path: profile step trace_iter into a Chrome trace of every collective (tpcomm/bench/trace.py)
    trace=None,
    trace_iter=5,  # the step traced (after a few, so start-up is not in it)
    # 'full': out_dir/ckpt.pt, GPT layout, gathered | 'sharded': out_dir/ckpt_sharded (DCP)
    checkpoint_format="full",
    init_from="scratch",  # 'scratch' | 'resume' | 'gpt2' | 'gpt2-medium' | 'gpt2-large' | 'gpt2-xl'
    # a fresh run (scratch, gpt2*) into an out_dir holding another run's checkpoint: refused unless
    overwrite=False,
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
    tp_size=TP_DEFAULTS["tp_size"],  # shards per layer (DistributedGPT)
    # 'tp' | 'spd' | 'parallel' | 'ladder' | 'caat' per layer (a list), or one for every layer; None = all
    # 'tp'
    block_types=TP_DEFAULTS["block_types"],
    # here too (defaults()): each block type's own options, e.g. caat_sync_fraction
    # (tpcomm/model/block_types/)
    # 'simulated' (one process holds every shard) | 'real' (torchrun, one shard per rank)
    tp_mode="simulated",
    # distributed_gpt: wte/lm_head sharded by vocabulary, vocab-parallel cross-entropy
    loss_parallel=TP_DEFAULTS["loss_parallel"],
    # distributed_gpt: how the syncs move (none changes the weights; docs/overlap.md, docs/compression.md)
    # f's backward all-reduce asynchronous, hidden behind the weight gradient (docs/overlap.md)
    tp_async_grad=TP_DEFAULTS["tp_async_grad"],
    # K > 1: each tp/spd block's batch in K chunks, chunk k's all-reduce overlapping chunk k+1
    tp_overlap=TP_DEFAULTS["tp_overlap"],
    # Megatron sequence parallelism: reduce-scatter + all-gather instead of all-reduce
    sequence_parallel=TP_DEFAULTS["sequence_parallel"],
    # None (off) | 'bf16' | 'fp8' | 'int8': block-quantized partial sums in every g reduction
    tp_comm_dtype=TP_DEFAULTS["tp_comm_dtype"],
    tp_comm_block=TP_DEFAULTS["tp_comm_block"],  # values per absmax scale (tp_comm_dtype)
    # 'one_shot': all-gather the compressed partials | 'two_shot': reduce-scatter + all-gather
    tp_comm_exchange=TP_DEFAULTS["tp_comm_exchange"],
    # sequence_parallel's all-gathers/reduce-scatters as rings beside partial GEMMs
    tp_collective_matmul=TP_DEFAULTS["tp_collective_matmul"],
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
    # 'ddp' (replicas, gradients all-reduced) | 'fsdp' (FSDP2: params/grads/AdamW sharded over dp)
    data_parallel="ddp",
    # fsdp: ranks of one shard group; None = dp (plain FSDP); a divisor of dp = HSDP, sharded within
    dp_shard=None,
    # groups of dp_shard ranks, replicated across dp / dp_shard of them (2 nodes: dp_shard x tp = GPUs per
    # node)
    # 'default' (build whole, then shard) | 'meta' (each rank allocates only what it holds)
    init_device="default",
    # pipeline parallelism (tpcomm/parallel/pipeline.py): world = pp_size x dp x tp, micro-batches per step =
    # the dp rank's share of gradient_accumulation_steps
    pp_size=1,  # pipeline stages of contiguous layers
    pp_schedule="1f1b",  # 'gpipe' | '1f1b' | 'interleaved_1f1b'
    pp_virtual_stages=1,  # stages per pp rank (interleaved_1f1b)
    pp_layers=None,  # layers per stage, a list of pp_size x pp_virtual_stages ints; None: balanced by count
)

# what a checkpoint (or GPT-2) fixes about the model, and a command line may not contradict on resume
CHECKPOINT_FORMATS = ("full", "sharded")
# (and the block types' options, in a checkpoint of a model with such a type: its function; model_keys)
MODEL_KEYS = ("model_type", "n_layer", "n_head", "n_embd", "bias", "gelu_approximate", "block_types")


def with_type_options(defaults):
    """defaults with every registered block type's options (their config keys) after block_types: the keys of
    a type registered after this module was imported (a plug-in) included."""
    keys = list(defaults)
    at = keys.index("block_types") + 1
    extra = option_defaults()
    return {**{k: defaults[k] for k in keys[:at]}, **extra, **{k: defaults[k] for k in keys[at:]}}


def defaults():
    """train.py's options and their defaults: DEFAULTS and the block types' own options."""
    return with_type_options(DEFAULTS)


def model_keys():
    return (*MODEL_KEYS, *option_fields())


@dataclass
class Setup:
    """The checked configuration of a launch, and the weights it starts from."""
    data_dir: str
    dp: int
    dp_shard: int  # = dp unless HSDP (tpcomm/parallel/parallel_dims.py)
    tp: int
    pp: int
    device: str
    device_type: str
    dtype: str
    # or TPConfig (distributed_gpt): checked (tpcomm/model/options.py), built by start_run
    model_config: GPTConfig
    checkpoint: Optional[dict] = None  # init_from='resume'
    pretrained: Optional[dict] = None  # init_from=gpt2*: GPT-2's state dict


def explicit_keys(cfg, argv):
    """The keys the user set: every --key=value on the command line, and every key a config file changed from
    its default (a file that sets a key to its default value is not told apart from leaving it alone)."""
    known = defaults()
    return command_line_keys(argv) | {k for k in cfg if cfg[k] != known[k]}


def command_line_keys(argv):
    """The keys given as --key=value on the command line."""
    return {arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--") and "=" in arg}


CPU_EVAL_FLOPS = 1e12  # an evaluation's forward FLOPs per split on a CPU before eval_iters is cut (seconds)


def cpu_eval_iters(cfg, config, argv):
    """On a CPU, a recipe's eval_iters (one written for GPUs, as config/train_shakespeare_char.py's 200
    batches of 64 x 256) is cut to what CPU_EVAL_FLOPS allows, with one line saying so, unless the command
    line sets it, as nanoGPT's own CPU recipe passes --eval_iters=20 (docs/training.md)."""
    tokens = cfg["batch_size"] * cfg["block_size"]
    flops = 2 * tokens * (12 * config.n_layer * config.n_embd ** 2 + config.vocab_size * config.n_embd)
    fits = max(1, int(CPU_EVAL_FLOPS // flops))
    if cfg["eval_iters"] > fits and "eval_iters" not in command_line_keys(argv):
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"eval_iters={cfg['eval_iters']} -> {fits} on CPU ({flops * cfg['eval_iters']:.1e} FLOPs "
                  "an " f"evaluation of each split would take minutes); --eval_iters={cfg['eval_iters']} to "
                  "keep it")
        cfg["eval_iters"] = fits


FLOAT32_MAX = 3.4028234663852886e38


def check_train_settings(cfg):
    """Ranges and choices of the plain settings."""
    positive = ("batch_size", "block_size", "n_layer", "n_head", "n_embd", "tp_size", "pp_size",
                "pp_virtual_stages", "gradient_accumulation_steps", "eval_iters", "eval_interval",
                "log_interval")
    for key in positive:
        if cfg[key] < 1:
            raise ConfigError(f"{key} must be >= 1, got {cfg[key]}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "seed", "learning_rate", "min_lr",
                "weight_decay", "grad_clip"):
        if cfg[key] < 0:
            raise ConfigError(f"{key} must be >= 0, got {cfg[key]}")
    # optimizers hold them as float32 tensors
    for key in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
        if cfg[key] > FLOAT32_MAX:
            raise ConfigError(f"{key} must be a float32 number (<= {FLOAT32_MAX:.3g}), got {cfg[key]:g}")
    for key in ("beta1", "beta2"):
        if not 0.0 <= cfg[key] < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {cfg[key]}")
    if not 0.0 <= cfg["dropout"] < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {cfg['dropout']}")
    if cfg["model_type"] not in MODEL_TYPES:
        raise ConfigError(f"model_type must be one of {MODEL_TYPES}, got {cfg['model_type']!r}")
    if cfg["tp_mode"] not in ("simulated", "real"):  # before the model checks, which read it
        raise ConfigError(f"tp_mode must be 'simulated' or 'real', got {cfg['tp_mode']!r}")
    check_dtype(cfg["dtype"])
    if cfg["data_parallel"] not in DATA_PARALLEL:
        raise ConfigError(f"data_parallel must be one of {DATA_PARALLEL}, got {cfg['data_parallel']!r}")
    # against dp in prepare, once it is known
    check_dp_shard(cfg["dp_shard"], data_parallel=cfg["data_parallel"])
    if cfg["init_device"] not in INIT_DEVICES:
        raise ConfigError(f"init_device must be one of {INIT_DEVICES}, got {cfg['init_device']!r}")
    if cfg["init_from"] not in ("scratch", "resume") and cfg["init_from"] not in PRETRAINED_SIZES:
        raise ConfigError(f"init_from must be 'scratch', 'resume' or one of {sorted(PRETRAINED_SIZES)}, "
                          f"got {cfg['init_from']!r}")
    if not cfg["out_dir"]:
        raise ConfigError(f"out_dir must be a folder path, got {cfg['out_dir']!r}")
    check_backend(cfg["backend"])
    if cfg["wandb_log"]:
        check_wandb()
    if os.path.exists(cfg["out_dir"]) and not os.path.isdir(cfg["out_dir"]):
        raise ConfigError(f"out_dir {cfg['out_dir']!r} exists and is not a directory")
    if not isinstance(cfg["trace_iter"], int) or cfg["trace_iter"] < 0:
        raise ConfigError(f"trace_iter must be an iteration >= 0, got {cfg['trace_iter']!r}")
    if cfg["trace"] is not None:  # a Chrome trace of an earlier run may be replaced; no other file
        # --overwrite is the out_dir's only
        check_output_file(cfg["trace"], key="trace", own=written_by("trace"))
        if cfg["trace_iter"] > cfg["max_iters"]:
            raise ConfigError(f"trace_iter must be an iteration in 0..max_iters ({cfg['max_iters']}), "
                              f"got {cfg['trace_iter']!r}")
    if cfg["checkpoint_format"] not in CHECKPOINT_FORMATS:
        raise ConfigError(f"checkpoint_format must be one of {CHECKPOINT_FORMATS}, got "
                          f"{cfg['checkpoint_format']!r}")
    if cfg["init_from"] == "resume":
        full = os.path.join(cfg["out_dir"], CHECKPOINT_NAME)
        if cfg["checkpoint_format"] == "full" and not os.path.isfile(full):
            hint = (" (there is a sharded one: resume with checkpoint_format='sharded', or convert it with "
                    "python -m tpcomm.train.sharded_checkpoint OUT_DIR)"
                    if sharded_checkpoint.has_sharded(cfg["out_dir"]) else "")
            raise ConfigError(f"init_from='resume' but there is no checkpoint at {full}{hint}")
        if cfg["checkpoint_format"] == "sharded" and not sharded_checkpoint.has_sharded(cfg["out_dir"]):
            raise ConfigError(f"init_from='resume' with checkpoint_format='sharded' but there is no sharded "
                              f"checkpoint at {sharded_checkpoint.sharded_path(cfg['out_dir'])}")
    elif not cfg["overwrite"]:
        found = previous_checkpoints(cfg["out_dir"])
        if found:
            raise ConfigError(f"out_dir {cfg['out_dir']!r} holds another run's checkpoint ({found[0]}); a "
                              "fresh run " f"(init_from={cfg['init_from']!r}) would leave it beside its own "
                              "config and metrics: " f"continue that run with --init_from=resume, use "
                              "another out_dir, or give " f"--overwrite=True to replace it")


def check_wandb():
    """wandb_log=True: wandb installed, found before the run starts (a failing
    wandb.init is train.py's RunError)."""
    try:
        import wandb  # noqa: F401  (only to see that it is installed; train.py imports it where it logs)
    except ImportError:
        raise ConfigError("wandb_log=True but wandb is not installed (pip install wandb), or give "
                          "--wandb_log=False") from None


def previous_checkpoints(out_dir):
    """The checkpoints an earlier run left in out_dir: ckpt.pt and the ckpt_sharded link (or folder)."""
    paths = (os.path.join(out_dir, CHECKPOINT_NAME), sharded_checkpoint.sharded_path(out_dir))
    return [p for p in paths if os.path.lexists(p)]


def adopt_model(cfg, explicit, *, source, model_type, spec):
    """Take the model from a checkpoint or GPT-2 (`spec`): cfg's model keys become the source's; one the user
    set explicitly to another value is an error naming the key and both values."""
    given = dict(cfg, block_types=expand_block_types(cfg["block_types"], cfg["n_layer"]))
    wanted = dict(spec, model_type=model_type or cfg["model_type"])
    for key in model_keys():
        if key not in wanted or (key == "block_types" and wanted["model_type"] != "distributed_gpt"):
            continue
        if key in explicit and given[key] != wanted[key]:
            raise ConfigError(f"{key}={given[key]!r} contradicts {source}'s {key}={wanted[key]!r}; "
                              f"drop the setting (the model comes from {source})")
        cfg[key] = wanted[key]
    if wanted["model_type"] == "distributed_gpt" and "tp_size" not in explicit and "tp_size" in spec:
        cfg["tp_size"] = spec["tp_size"]  # may change on resume (checkpoints are GPT-layout); kept unless set
    if (wanted["model_type"] == "distributed_gpt" and "loss_parallel" not in explicit
        and "loss_parallel" in spec):
        cfg["loss_parallel"] = spec["loss_parallel"]  # likewise
    if "dropout" not in explicit and "dropout" in spec:
        cfg["dropout"] = spec["dropout"]  # may change on resume; kept unless set
    if source == "the checkpoint" and "block_size" in explicit and cfg["block_size"] < spec["block_size"]:
        raise ConfigError(f"block_size={cfg['block_size']} is below the checkpoint's {spec['block_size']}: a "
                          "resume " f"goes on with its model and optimizer as they are; drop the setting")
    if cfg["block_size"] > spec["block_size"]:
        if "block_size" in explicit:
            raise ConfigError(f"block_size ({cfg['block_size']}) exceeds {source}'s ({spec['block_size']})")
        cfg["block_size"] = spec["block_size"]


def adopt_sync_options(cfg, explicit, trained, *, iter_num):
    """Resume: the sync options (TP_COMM_OPTIONS) are the checkpoint's run's unless set; one that changes the
    model's function (FUNCTION_SYNC_OPTIONS) set to another value is refused, as a contradicting block_types
    is (the schedule ones, tp_overlap, tp_async_grad, sequence_parallel, may change with the layout). A
    max_iters the checkpoint has passed is refused too: the run would train a step past it and save."""
    for key, value in trained.items():
        if key in explicit and cfg[key] != value and key in FUNCTION_SYNC_OPTIONS:
            raise ConfigError(f"{key}={cfg[key]!r} contradicts the checkpoint's {key}={value!r} (it changes "
                              "the " f"model's function); drop the setting (the model comes from the "
                              "checkpoint)")
        if key not in explicit:
            cfg[key] = value
    if not cfg["eval_only"] and isinstance(iter_num, int) and cfg["max_iters"] < iter_num:
        raise ConfigError(f"max_iters={cfg['max_iters']} is below the checkpoint's iteration {iter_num}: "
                          "nothing is " f"left to train (give a larger max_iters, or eval_only=True)")


def vocab_chars(vocab):
    """A character vocabulary (data.vocab.load_vocab's) as one string, id i at
    position i; None for BPE data."""
    return None if vocab is None else "".join(vocab["itos"].get(i, "") for i in range(vocab["vocab_size"]))


def check_vocab(checkpoint, vocab, data_dir):
    """A resume onto a dataset whose characters are not the checkpoint's (by content: the same size
    can map other characters) is refused; a checkpoint from before checkpoints recorded their
    vocabulary is taken as it is."""
    trained, here = checkpoint.get("vocab_chars"), vocab_chars(vocab)
    if trained is not None and here is not None and trained != here:
        differ = next((i for i, (a, b) in enumerate(zip(trained, here)) if a != b),
                      min(len(trained), len(here)))
        raise ConfigError(f"the dataset in {data_dir} has another vocabulary than the checkpoint's "
                          f"({len(here)} against {len(trained)} characters, first differing at id "
                          f"{differ}): its token ids would mean other characters; resume on the "
                          "checkpoint's dataset")


def check_model(cfg, **sizes):
    """The model's options (tpcomm/model/options.py, the one validator) and the sync options against
    this run's batch; returns the model's config. sizes: vocab_size and block_size when they are not
    cfg's (a checkpoint, GPT-2)."""
    config = model_config(cfg["model_type"], dict(cfg, **sizes), tp_mode=cfg["tp_mode"])
    check_batch(config, batch_size=cfg["batch_size"], block_size=cfg["block_size"])
    return config


def ends_private(cfg):
    """A DistributedGPT run whose head reads each shard's own stream (options.private_head)."""
    return cfg["model_type"] == "distributed_gpt" and private_head(
        expand_block_types(cfg["block_types"], cfg["n_layer"]), cfg["tp_size"])


def check_pipeline(cfg, explicit, *, dp, tp, dtype):
    """pp_size > 1: the pipeline layout (pipeline_config.validate_pp_layout) and what
    does not run with it yet."""
    if cfg["pp_schedule"] not in SCHEDULE_NAMES:
        raise ConfigError(f"pp_schedule must be one of {list(SCHEDULE_NAMES)}, got {cfg['pp_schedule']!r}")
    if cfg["pp_size"] == 1:
        if cfg["pp_virtual_stages"] != 1 or cfg["pp_layers"] is not None:
            raise ConfigError(f"pp_virtual_stages ({cfg['pp_virtual_stages']}) and pp_layers "
                              f"({cfg['pp_layers']}) need pp_size > 1")
        return
    validate_pp_layout(world=cfg["pp_size"] * dp * tp, pp_size=cfg["pp_size"], tp=tp, n_layer=cfg["n_layer"],
                       schedule=cfg["pp_schedule"], n_microbatches=cfg["gradient_accumulation_steps"] // dp,
                       virtual_stages=cfg["pp_virtual_stages"], pp_layers=cfg["pp_layers"],
                       keys=dict(schedule="pp_schedule", virtual_stages="pp_virtual_stages",
                                 n_microbatches="micro-batches per replica (gradient_accumulation_steps / "
                                 "dp)"))
    unsupported = dict(data_parallel=cfg["data_parallel"] == "fsdp", init_device=cfg["init_device"] == "meta",
                       loss_parallel=bool(cfg["loss_parallel"]),
                       sequence_parallel=cfg["sequence_parallel"] is True,
                       checkpoint_format=cfg["checkpoint_format"] == "sharded", dtype=dtype == "float16",
                       block_types=ends_private(cfg), compile=cfg["compile"] and "compile" in explicit)
    for key, bad in unsupported.items():
        if bad:
            value = dtype if key == "dtype" else cfg[key]
            raise ConfigError(f"{key}={value!r} does not run with pp_size={cfg['pp_size']} (pipeline stages "
                              "run " f"DDP, fp32/bf16, full checkpoints, no torch.compile, a "
                              "whole-vocabulary head)")
    cfg["compile"] = False  # the default (True) is not applied to pipeline stages


def load_pretrained(name, *, dropout):
    try:
        return GPT.from_pretrained(name, dict(dropout=dropout)).state_dict()
    except OSError as e:  # no network and no Hugging Face cache
        raise ConfigError(f"init_from={name!r}: cannot load the pretrained weights "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def prepare(argv):
    """(cfg, Setup): the configuration resolved and checked. Reads the checkpoint
    (resume) or GPT-2's weights."""
    cfg = configure(defaults(), argv)
    explicit = explicit_keys(cfg, argv)
    check_train_settings(cfg)
    device, device_type, dtype = pick_device_and_dtype(cfg["device"], cfg["dtype"])
    if device_type == "cpu" and cfg["compile"] and "compile" not in explicit:
        # torch.compile's first steps on a CPU take minutes: nanoGPT's recipes say compile=False
        cfg["compile"] = False
        if int(os.environ.get("RANK", "0")) == 0:
            print("compile=False on CPU (compiling would take minutes before the first step); --compile=True "
                  "to compile")
    data_dir = cfg["data_dir"] or os.path.join(ROOT, "data", cfg["dataset"])
    vocab = load_vocab(data_dir) if os.path.isdir(data_dir) else None
    meta_vocab = vocab["vocab_size"] if vocab is not None else None

    # the model: from the checkpoint, from GPT-2, or from the configuration
    checkpoint = pretrained = None
    if cfg["init_from"] == "resume":
        checkpoint = (load_checkpoint(cfg["out_dir"]) if cfg["checkpoint_format"] == "full"
                      else sharded_checkpoint.load_sharded_meta(cfg["out_dir"]))  # sharded: no tensors yet
        if cfg["checkpoint_format"] == "full":
            check_fields(checkpoint, os.path.join(cfg["out_dir"], CHECKPOINT_NAME), need=RESUME_FIELDS)
        check_vocab(checkpoint, vocab, data_dir)
        model_type, spec = checkpoint_model(checkpoint)
        adopt_model(cfg, explicit, source="the checkpoint", model_type=model_type, spec=spec)
        adopt_sync_options(cfg, explicit, checkpoint_sync_options(checkpoint),
                           iter_num=checkpoint.get("iter_num"))
        vocab_size = spec["vocab_size"]
    elif cfg["init_from"] in PRETRAINED_SIZES:
        spec = dict(PRETRAINED_SIZES[cfg["init_from"]], **GPT2_FIXED)
        adopt_model(cfg, explicit, source=cfg["init_from"], model_type=None, spec=spec)
        vocab_size = spec["vocab_size"]
    else:
        vocab_size = meta_vocab if meta_vocab is not None else GPTConfig.vocab_size  # GPT-2's 50257 padded
    config = check_model(cfg, vocab_size=vocab_size, block_size=spec["block_size"]
                         if cfg["init_from"] != "scratch" else cfg["block_size"])
    if device_type == "cpu":
        cpu_eval_iters(cfg, config, argv)
    dp, tp = check_layout(tp_size=cfg["tp_size"], tp_mode=cfg["tp_mode"], pp_size=cfg["pp_size"])
    # a sharded checkpoint loads into its own tp layout only
    if checkpoint is not None and "layout" in checkpoint:
        sharded_checkpoint.check_resumable(checkpoint["layout"], dict(
            tp_size=cfg["tp_size"] if cfg["model_type"] == "distributed_gpt" else 1, tp_real=tp > 1,
            loss_parallel=bool(cfg["loss_parallel"]) or (tp > 1 and ends_private(cfg)),
                                                                      block_size=cfg["block_size"]),
            cfg["out_dir"])
    if cfg["gradient_accumulation_steps"] % dp:
        raise ConfigError(f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) must be "
                          "divisible " f"by the number of data-parallel ranks ({dp})")
    dp_shard = check_dp_shard(cfg["dp_shard"], data_parallel=cfg["data_parallel"], dp=dp)
    check_pipeline(cfg, explicit, dp=dp, tp=tp, dtype=dtype)
    if meta_vocab is not None and meta_vocab > vocab_size:
        raise ConfigError(f"dataset {cfg['dataset']!r} has vocab_size {meta_vocab}, "
                          f"larger than the model's vocab_size {vocab_size}")
    check_data(cfg, data_dir, vocab_size)
    if cfg["init_from"] in PRETRAINED_SIZES:  # last: the download is the slow part
        pretrained = load_pretrained(cfg["init_from"], dropout=cfg["dropout"])

    setup = Setup(data_dir=data_dir, dp=dp, dp_shard=dp_shard, tp=tp, pp=cfg["pp_size"], device=device,
                  device_type=device_type, dtype=dtype, model_config=config, checkpoint=checkpoint,
                  pretrained=pretrained)
    return cfg, setup


def check_offline(cfg):
    """The checks of a resolved config that need no data, no checkpoint and no launch, so that a sweep
    with a bad override (--eval_interval=0) stops before its first run. What happens to a checkpoint left
    in a run directory is the sweep's choice, not a reason to refuse: the out_dir check is skipped.
    Raises ConfigError naming key and value."""
    for key, default in defaults().items():  # configure() lets None through for any key (--batch_size=None)
        if isinstance(default, (int, float)) and not isinstance(default, bool) and \
                (not isinstance(cfg[key], (int, float)) or isinstance(cfg[key], bool)):
            raise ConfigError(f"{key} must be a number, got {cfg[key]!r}")
    check_train_settings(dict(cfg, overwrite=True))
    return check_model(cfg)
