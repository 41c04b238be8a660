"""
Run-time set-up shared by the scripts: device and precision, autocast, CPU memory, seeds, the fp16 loss
scaler, run errors and the run-directory lock.
"""

import contextlib
import ctypes
import errno
import fcntl
import os
import sys
import time

import torch

from tpcomm.errors import ConfigError
from tpcomm.configuration import exit_in_one_line

DTYPES = ("auto", "float32", "bfloat16", "float16")  # the dtype option of every script


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
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got "
                          f"{device!r}") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ConfigError(f"device={device!r} but CUDA is not available here; use --device=cpu or auto")
        if dev.index is not None and dev.index >= n:
            raise ConfigError(f"device={device!r} but there are only {n} CUDA device(s) "
                              f"(cuda:0..cuda:{n - 1})")
    elif dev.type == "mps":
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise ConfigError(f"device={device!r} but MPS is not available here; use --device=cpu or auto")
    elif dev.type != "cpu":
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    return device


def check_dtype(dtype):
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be {', '.join(map(repr, DTYPES[:-1]))} or {DTYPES[-1]!r}, got "
                          f"{dtype!r}")


def pick_dtype(dtype, device_type):
    """'auto' -> bf16 on GPUs that have it, else fp16 on GPUs, fp32 elsewhere."""
    check_dtype(dtype)
    if dtype == "auto":
        if device_type == "cuda":
            return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return "float32"
    return dtype


def pick_device_and_dtype(device, dtype):
    """(device, device_type, dtype) of a script's device and dtype options: device_type is what autocast and
    the scaler take ('cuda' for 'cuda:1')."""
    device = pick_device(device)
    device_type = "cuda" if device.startswith("cuda") else device
    return device, device_type, pick_dtype(dtype, device_type)


def autocast_context(device_type, dtype):
    """Mixed precision context; a no-op for fp32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return torch.amp.autocast(device_type=device_type, dtype=ptdtype)


def device_synchronizer(device):
    """A function that returns once the work queued on `device` so far is done:
    torch.cuda.synchronize on CUDA (kernels are queued and run later), torch.mps.synchronize on MPS,
    nothing on CPU (work is done when the call returns)."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


class DeviceClock:
    """Seconds as the device's work sees them: now() first waits for everything queued on the device, then
    reads the host clock. A timing between two now() calls bills exactly the work queued between them: not the
    warm-up still running on a GPU when the first is read (perf_counter alone would bill it), and all of the
    timed work (perf_counter alone would miss what is still queued). clock and synchronize are injectable
    (tests substitute a fake device)."""

    def __init__(self, device, *, clock=time.perf_counter, synchronize=None):
        self.clock = clock
        self.synchronize = device_synchronizer(device) if synchronize is None else synchronize

    def now(self):
        self.synchronize()
        return self.clock()


def keep_freed_memory():
    """glibc only: keep freed memory in the process instead of returning it to the OS. A CPU training step
    frees and re-allocates the same MB-sized activations every step; with glibc's default trimming each
    re-allocation faults its pages in afresh (docs/reliability.md has the counts). This is what PyTorch's CPU
    performance guide gets from jemalloc/tcmalloc."""
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
    """fp16's loss scaler (a no-op for other dtypes). When ranks hold different gradients, an inf/nan on one
    rank must skip the step on all of them: FSDP's ShardedGradScaler all-reduces the found-inf flag over the
    ranks that hold different gradients. Real tensor parallelism: the tp group (DDP already makes gradients
    agree across dp); FSDP: every rank (its gradients are sharded over dp, and over tp too with real TP)."""
    enabled = dtype == "float16"
    if pd is not None and pd.distributed and (pd.tp > 1 or (data_parallel == "fsdp" and pd.dp > 1)):
        import torch.distributed as dist

        group = dist.group.WORLD if data_parallel == "fsdp" and pd.dp > 1 else pd.tp_group
        return agreeing_grad_scaler(device_type, enabled=enabled, process_group=group)
    return torch.amp.GradScaler(device_type, enabled=enabled)


def agreeing_grad_scaler(device_type, *, enabled, process_group):
    """A ShardedGradScaler over process_group whose step() always unscales first (AgreeingGradScaler)."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    class AgreeingGradScaler(ShardedGradScaler):
        """torch's GradScaler.step, given an optimizer that unscales inside its own kernel (fused AdamW:
        _step_supports_amp_scaling), checks each device for inf/nan and steps without calling unscale_,
        which is where ShardedGradScaler all-reduces found_inf over its group: with grad_clip=0 (nothing
        calls unscale_ before step) a rank whose gradients overflowed would skip the step while the
        others took it, and the shards would drift apart. So step() calls unscale_ itself when the caller
        has not: found_inf is then always the group's, and every rank skips or steps together (one extra
        pass over the gradients, fp16 only)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._unscaled = set()  # id(optimizer) unscaled since the last update()

        def unscale_(self, optimizer):
            super().unscale_(optimizer)
            if not self.is_enabled():  # fp32/bf16: a no-op scaler holds no per-optimizer state
                return
            self._unscaled.add(id(optimizer))
            # ShardedGradScaler keeps found_inf as shape (1,), GradScaler as (); a fused AdamW subtracts it
            # from its () step counters in place, which fails on (1,) (torch 2.13: "output with shape []
            # doesn't match the broadcast shape [1]"), so after an unscale_ (grad clipping) FSDP/TP fp16 with
            # fused AdamW crashed
            state = self._per_optimizer_states[id(optimizer)]
            state["found_inf_per_device"] = {d: t.reshape(()) for d,
                                             t in state["found_inf_per_device"].items()}

        def step(self, optimizer, *args, **kwargs):
            if self.is_enabled() and id(optimizer) not in self._unscaled:
                self.unscale_(optimizer)
            return super().step(optimizer, *args, **kwargs)

        def update(self, new_scale=None):
            self._unscaled.clear()
            super().update(new_scale)

    return AgreeingGradScaler(device_type, enabled=enabled, process_group=process_group)


class RunError(Exception):
    """A run that cannot go on, for a reason shown as one line with exit status 1 (a non-finite loss, a
    checkpoint that could not be written); unlike a ConfigError it is found while the run works."""


exit_on_run_error = exit_in_one_line(RunError, 1)  # a run that cannot go on: one line, exit status 1


class RunLock:
    """An exclusive lock on a run (or sweep) directory, held while the run works in it: a second run in
    the same directory refuses at start, in one line, instead of interleaving its files with the first.
    It is an OS lock (flock on DIR/NAME, default DIR/.lock), released by the kernel when the holding
    process ends, so a killed run never leaves a stuck lock behind. wait=True blocks until the holder
    lets go instead of refusing."""

    def __init__(self, directory, *, what="run", name=".lock", wait=False):
        self.directory, self.what, self.name, self.wait, self.fd = directory, what, name, wait, None

    def acquire(self):
        """True with the lock held; False when another process holds it (never with wait=True)."""
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot make the folder {self.directory!r} ({e.strerror})") from None
        self.fd = os.open(os.path.join(self.directory, self.name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except OSError as e:
            os.close(self.fd)
            self.fd = None
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())
        return True

    def __enter__(self):
        if not self.acquire():
            path = os.path.join(self.directory, self.name)
            raise ConfigError(f"{self.directory!r} is in use by another {self.what} (lock {path}); wait for "
                              "it " f"or use another directory")
        return self

    def __exit__(self, *exc):
        self.release()

    def release(self):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def sync(device):
    """Wait for the device's queued work before the clock is read (CPU work is already done)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
