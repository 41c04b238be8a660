"""
Set-up shared by train.py, sample.py and bench.py: device and precision,
building either model, and checkpoint files (atomic writes, weights_only loads).
"""

import contextlib
import ctypes
import errno
import fcntl
import os
import sys

import torch

from configurator import ConfigError
from model import GPT, GPTConfig

MODEL_TYPES = ("gpt", "distributed_gpt")


def pick_device(device="auto"):
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


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


def make_grad_scaler(device_type, dtype, pd=None):
    """fp16's loss scaler (a no-op for other dtypes). With real tensor parallelism each rank holds different
    gradient shards, so an inf/nan on one rank must skip the step on all of them: FSDP's ShardedGradScaler
    all-reduces the found-inf flag over the tp group (DDP already makes it agree across dp)."""
    enabled = dtype == "float16"
    if pd is not None and pd.tp > 1:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device_type, enabled=enabled, process_group=pd.tp_group)
    return torch.amp.GradScaler(device_type, enabled=enabled)


GPT_ARG_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


def build_model(model_type, model_args, *, pd=None):
    """GPT or DistributedGPT from a dict of GPTConfig fields (+ tp_size, block_types, tp_mode)."""
    gpt_args = {k: model_args[k] for k in GPT_ARG_KEYS}
    if model_type == "gpt":
        return GPT(GPTConfig(**gpt_args))
    if model_type == "distributed_gpt":
        from tensor_parallel_model import DistributedGPT, TPConfig

        return DistributedGPT(TPConfig(**gpt_args, tp_size=model_args["tp_size"],
                                       block_types=model_args["block_types"]), pd=pd)
    raise ConfigError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")


def save_checkpoint(checkpoint, out_dir):
    """Write ckpt.pt atomically: a crash mid-write leaves the previous checkpoint intact."""
    path = os.path.join(out_dir, "ckpt.pt")
    tmp = path + ".tmp"
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def load_checkpoint(out_dir, map_location="cpu"):
    path = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise ConfigError(f"no checkpoint at {path} (out_dir={out_dir!r})")
    return torch.load(path, map_location=map_location, weights_only=True)


def clean_state_dict(state_dict):
    """Drop the prefix torch.compile adds, so checkpoints load into plain models."""
    prefix = "_orig_mod."
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state_dict.items()}


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
