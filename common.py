"""
Set-up shared by train.py, sample.py, export_hf.py and bench.py: device and precision, building either model,
and checkpoint files (the format, atomic writes, weights_only loads, one-line errors).
"""

import contextlib
import ctypes
import errno
import fcntl
import os
import pickle
import sys
import tempfile

import torch

from configurator import ConfigError, exit_in_one_line
from model import GPT, NANOGPT_ARGS, GPTConfig

MODEL_TYPES = ("gpt", "distributed_gpt")


def pick_device(device="auto"):
    """'auto' -> cuda, mps or cpu, whichever is there; a named device must exist (ConfigError otherwise)."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ConfigError(f"device={device!r} but CUDA is not available here; use --device=cpu or auto")
        if dev.index is not None and dev.index >= n:
            raise ConfigError(f"device={device!r} but there are only {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
    elif dev.type == "mps":
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise ConfigError(f"device={device!r} but MPS is not available here; use --device=cpu or auto")
    elif dev.type != "cpu":
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    return device


def pick_dtype(dtype, device_type):
    """'auto' -> bf16 on GPUs that have it, else fp16 on GPUs, fp32 elsewhere."""
    if dtype == "auto":
        if device_type == "cuda":
            return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {dtype!r}")
    return dtype


def autocast_context(device_type, dtype):
    """Mixed precision context; a no-op for fp32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return torch.amp.autocast(device_type=device_type, dtype=ptdtype)


def keep_freed_memory():
    """glibc only: keep freed memory in the process instead of returning it to the OS. A CPU training step
    frees and re-allocates the same MB-sized activations every step; with glibc's default trimming each
    re-allocation faults its pages in afresh (thousands of page faults per step, 10-25% of a small model's
    step time on CPU). This is what PyTorch's CPU performance guide gets from jemalloc/tcmalloc."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):  # not glibc
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's maximum: blocks up to 32 MiB come from the heap...
    mallopt(M_TRIM_THRESHOLD, 1 << 30)  # ...which is not trimmed while it holds less than 1 GiB free
    mallopt(M_TOP_PAD, 64 << 20)


def setup_runtime(device_type, seed):
    torch.manual_seed(seed)
    if device_type == "cpu":
        keep_freed_memory()
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def make_grad_scaler(device_type, dtype, pd=None, *, data_parallel="ddp"):
    """fp16's loss scaler (a no-op for other dtypes). When ranks hold different gradients, an inf/nan on one rank
    must skip the step on all of them: FSDP's ShardedGradScaler all-reduces the found-inf flag over the ranks that
    hold different gradients. Real tensor parallelism: the tp group (DDP already makes gradients agree across dp);
    FSDP: every rank (its gradients are sharded over dp, and over tp too with real TP)."""
    enabled = dtype == "float16"
    if pd is not None and pd.distributed and (pd.tp > 1 or (data_parallel == "fsdp" and pd.dp > 1)):
        import torch.distributed as dist
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        group = dist.group.WORLD if data_parallel == "fsdp" and pd.dp > 1 else pd.tp_group
        return ShardedGradScaler(device_type, enabled=enabled, process_group=group)
    return torch.amp.GradScaler(device_type, enabled=enabled)


def build_model(model_type, model_args, *, pd=None, init_device="default"):
    """GPT or DistributedGPT from a dict of GPTConfig fields (nanoGPT's 7, gelu_approximate) and, for
    distributed_gpt, tp_size, block_types and loss_parallel. Extra keys are ignored, so a run's config dict works
    too. init_device='meta': built on the meta device, no memory and no weights: shard it if wanted, then
    model.materialize_(device) gives GPT's initial weights bitwise (data_parallel.parallelize does both)."""
    if init_device not in ("default", "meta"):
        raise ConfigError(f"init_device must be 'default' or 'meta', got {init_device!r}")
    meta = init_device == "meta"
    gpt_args = {k: model_args[k] for k in NANOGPT_ARGS}
    gpt_args["gelu_approximate"] = model_args.get("gelu_approximate") or "none"
    with torch.device("meta") if meta else contextlib.nullcontext():
        if model_type == "gpt":
            return GPT(GPTConfig(**gpt_args))
        if model_type == "distributed_gpt":
            from tensor_parallel_model import DistributedGPT, TPConfig

            return DistributedGPT(TPConfig(**gpt_args, tp_size=model_args.get("tp_size", 1),
                                           block_types=model_args.get("block_types"),
                                           loss_parallel=bool(model_args.get("loss_parallel", False))),
                                  pd=pd, init=not meta)
    raise ConfigError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")


# ---------- checkpoints ----------
# out_dir/ckpt.pt is a dict:
#   model, optimizer      GPT-layout state dicts, whatever model (and process layout) wrote them
#   model_args            exactly nanoGPT's GPTConfig fields (model.NANOGPT_ARGS): nanoGPT's scripts read it
#   model_type            'gpt' | 'distributed_gpt'
#   model_options         {gelu_approximate} and, for distributed_gpt, {tp_size, block_types (one per layer)} and
#                         loss_parallel: True when the run sharded wte/lm_head by vocabulary (absent: False; a
#                         training choice like tp_size: the weights are GPT-layout either way)
#   iter_num, best_val_loss, config (the run's resolved configuration)
#   rng_state             CPU RNG; cuda_rng_state when the model was on CUDA; scaler (GradScaler state dict)
# Also read: nanoGPT's own checkpoints (no model_type/model_options/rng_state/scaler: a GPT with the exact GELU) and
# this repo's older ones (tp_size and block_types inside model_args).

CHECKPOINT_NAME = "ckpt.pt"


class RunError(Exception):
    """A run that cannot go on, for a reason shown as one line with exit status 1 (a non-finite loss, a checkpoint
    that could not be written); unlike a ConfigError it is found while the run works."""


exit_on_run_error = exit_in_one_line(RunError, 1)  # a run that cannot go on: one line, exit status 1


def model_spec(model_type, model):
    """(model_args, model_options) of a checkpoint of `model`: see the format above."""
    c = model.config
    model_args = {k: getattr(c, k) for k in NANOGPT_ARGS}
    model_options = {"gelu_approximate": c.gelu_approximate}
    if model_type == "distributed_gpt":
        model_options.update(tp_size=c.tp_size, block_types=list(c.block_types))
        if getattr(c, "loss_parallel", False):
            model_options["loss_parallel"] = True
    return model_args, model_options


def make_checkpoint(raw_model, optimizer, scaler, *, model_type, iter_num, best_val_loss, config, tensors=True):
    """The checkpoint dict of a training run. With real tensor parallelism or FSDP gathering the GPT-layout state
    is a collective, so every rank calls this (and only the master saves). tensors=False: everything but the model
    and optimizer state, gathering nothing (a sharded checkpoint's meta.pt, see sharded_checkpoint.py)."""
    model_args, model_options = model_spec(model_type, raw_model)
    checkpoint = {
        "model": raw_model.gpt_state_dict() if tensors else None,
        "optimizer": raw_model.gpt_optimizer_state(optimizer) if tensors else None,
        "model_args": model_args,
        "model_type": model_type,
        "model_options": model_options,
        "iter_num": iter_num,
        "best_val_loss": best_val_loss,
        "config": config,
        "rng_state": torch.get_rng_state(),
        "scaler": scaler.state_dict(),  # {} unless fp16
    }
    if not tensors:
        del checkpoint["model"], checkpoint["optimizer"]
    device = next(raw_model.parameters()).device
    if device.type == "cuda":
        checkpoint["cuda_rng_state"] = torch.cuda.get_rng_state(device)
    return checkpoint


def checkpoint_model(checkpoint):
    """(model_type, spec) of a checkpoint in any of the formats above; spec holds nanoGPT's 7 fields,
    gelu_approximate and, for distributed_gpt, tp_size and block_types (expanded to one per layer)."""
    model_args = checkpoint["model_args"]
    model_type = checkpoint.get("model_type", "gpt")  # nanoGPT's checkpoints are GPTs
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not one of {MODEL_TYPES}")
    options = checkpoint.get("model_options")
    if options is None:  # nanoGPT's (exact GELU) or this repo's older format (tp options inside model_args)
        options = {k: model_args[k] for k in ("tp_size", "block_types") if k in model_args}
    spec = {k: model_args[k] for k in NANOGPT_ARGS if k != "dropout"}
    spec["dropout"] = model_args.get("dropout", 0.0)
    spec["gelu_approximate"] = options.get("gelu_approximate", "none")
    if model_type == "distributed_gpt":
        kinds = options.get("block_types")
        kinds = "tp" if kinds is None else kinds
        spec["tp_size"] = options.get("tp_size", 1)
        spec["block_types"] = [kinds] * spec["n_layer"] if isinstance(kinds, str) else list(kinds)
        spec["loss_parallel"] = bool(options.get("loss_parallel", False))
    return model_type, spec


def build_model_from_checkpoint(checkpoint, *, pd=None, dropout=None, tp_size=None, loss_parallel=False):
    """The checkpoint's model with its weights: its own type, sizes, GELU and block pattern; dropout and (for
    distributed_gpt) tp_size and loss_parallel may be changed, since checkpoints are GPT-layout whatever tp_size
    wrote them. loss_parallel is off unless asked for (None: the checkpoint's), so a sampled or evaluated model
    returns (B, T, V) logits whatever the training run used."""
    model_type, spec = checkpoint_model(checkpoint)
    if dropout is not None:
        spec["dropout"] = dropout
    if tp_size is not None and model_type == "distributed_gpt":
        spec["tp_size"] = tp_size
    if loss_parallel is not None:
        spec["loss_parallel"] = loss_parallel
    model = build_model(model_type, spec, pd=pd)
    model.load_gpt_state_dict(clean_state_dict(checkpoint["model"]))
    return model


def save_checkpoint(checkpoint, out_dir):
    """Write ckpt.pt atomically: a temp file of this process's own, then a rename, so a crash or a full disk
    mid-write leaves the previous checkpoint intact. A failed write is a RunError (one line)."""
    path = os.path.join(out_dir, CHECKPOINT_NAME)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f"{CHECKPOINT_NAME}.{os.getpid()}.", suffix=".tmp")
        os.close(fd)
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch's writer reports a failed write (e.g. ENOSPC) as a RuntimeError
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:120]
        raise RunError(f"could not write checkpoint {path}: {reason}; "
                       f"the previous checkpoint (if any) is kept") from None


def load_checkpoint(out_dir, map_location="cpu"):
    """out_dir/ckpt.pt, read with weights_only (plain data and tensors only). Any unreadable, truncated, empty or
    foreign file is a ConfigError naming the path."""
    path = os.path.join(out_dir, CHECKPOINT_NAME)
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint at {path} (out_dir={out_dir!r})")
    if os.path.getsize(path) == 0:
        raise ConfigError(f"checkpoint {path} is empty")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # weights_only refused a Python object
        raise ConfigError(f"checkpoint {path} holds Python objects other than plain data and tensors; "
                          f"refusing to load it") from None
    except Exception as e:  # truncated zip, junk bytes, I/O error: torch reports these with many types
        raise ConfigError(f"checkpoint {path} is corrupt or truncated, or not a PyTorch checkpoint "
                          f"({type(e).__name__})") from None
    try:
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
            raise ValueError("no 'model' state dict")
        checkpoint_model(checkpoint)
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"checkpoint {path} is not a training checkpoint ({type(e).__name__}: {e})") from None
    return checkpoint


def clean_state_dict(state_dict):
    """Drop the prefix torch.compile adds, and the causal-mask buffers of nanoGPT's non-flash attention
    (attn.bias), so checkpoints load into plain models."""
    return {k.removeprefix("_orig_mod."): v for k, v in state_dict.items() if not k.endswith(".attn.bias")}


class RunLock:
    """An exclusive lock on a run (or sweep) directory, held while the run works in it: a second run in the same
    directory refuses at start, in one line, instead of interleaving its files with the first. It is an OS lock
    (flock on DIR/.lock), released by the kernel when the holding process ends, so a killed run never leaves a
    stuck lock behind."""

    def __init__(self, directory, *, what="run"):
        self.directory, self.what, self.fd = directory, what, None

    def __enter__(self):
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, ".lock")
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self.fd)
            self.fd = None
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"{self.directory!r} is in use by another {self.what} (lock {path}); wait for it "
                                  f"or use another directory") from None
            raise
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
