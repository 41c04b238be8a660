"""
The GPUs of a sweep's runs: each run's train.py gets GPUs no other run of this user holds on this machine
(CUDA_VISIBLE_DEVICES), so sweep processes run side by side without stacking on one GPU
(tpcomm/experiments/sweep.py).
"""

import os
import time


def node_gpus():
    """The GPUs a run may use on this machine (at least 1, so a machine without any runs one process)."""
    return max(1, len(visible_gpus()))


def visible_gpus():
    """The ids of the GPUs this sweep may use: CUDA_VISIBLE_DEVICES's list when it is set (the user's choice
    of devices for the sweep), else every GPU torch sees; [] without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()][:torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_lock_dir():
    """Where sweep processes of this user on this machine lock the GPUs they run on
    (shared by every checkout)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"tpcomm-gpus-{os.getuid()}")


class GPUClaim:
    """nproc of the visible GPUs held for one run, each by an OS lock (runtime.RunLock on gpu<id>.lock),
    so sweep processes run side by side (another shell, tp-axis beside cpu-long) never put two runs on
    one GPU: without CUDA_VISIBLE_DEVICES every train.py would start on GPU 0 (and its torchrun ranks on
    GPUs 0..n-1). A claim waits (polling every `poll` s) until enough GPUs are free; it yields the ids
    for CUDA_VISIBLE_DEVICES, or None on a machine without GPUs. The locks die with the process, so a
    killed sweep frees its GPUs."""

    def __init__(self, nproc, *, gpus=None, lock_dir=None, poll=10.0, say=print):
        self.nproc, self.poll, self.say = nproc, poll, say
        self.gpus = visible_gpus() if gpus is None else gpus
        self.lock_dir = lock_dir or gpu_lock_dir()
        self.held = []

    def try_claim(self):
        from tpcomm.train.runtime import RunLock

        for gpu in self.gpus:
            lock = RunLock(self.lock_dir, what="experiment.py sweep", name=f"gpu{gpu}.lock")
            if lock.acquire():
                self.held.append((gpu, lock))
                if len(self.held) == self.nproc:
                    return [g for g, _ in self.held]
        self.release()
        return None

    def release(self):
        for _, lock in self.held:
            lock.release()
        self.held = []

    def __enter__(self):
        if not self.gpus:
            return None
        if self.nproc > len(self.gpus):
            raise RuntimeError(f"a run of {self.nproc} processes needs {self.nproc} GPUs, this sweep sees "
                               f"{len(self.gpus)} ({','.join(self.gpus)}); pass --nproc={len(self.gpus)} "
                               "or fewer")
        said = False
        while True:
            ids = self.try_claim()
            if ids is not None:
                return ids
            if not said:
                self.say(f"waiting for {self.nproc} free GPU(s) of {','.join(self.gpus)} (other sweep "
                         "processes " f"hold them; locks in {self.lock_dir})")
                said = True
            time.sleep(self.poll)

    def __exit__(self, *exc):
        self.release()
