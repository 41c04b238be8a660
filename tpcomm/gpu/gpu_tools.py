"""
The GPU checks' tools, shared with the gpu-node sweep: time boxes, timed training steps, a launcher that kills
its whole process group, and an all-reduce sanity check of the in-collective clock.
"""

import contextlib
import os
import signal
import subprocess
import time

import torch

from tpcomm import ROOT
from tpcomm.model.interface import timed_step
from tpcomm.train.runtime import sync

COMM_MIB = 64
# B/s: no link moves an all-reduce faster than this (NVLink 4 busbw ~0.45e12), so a reading
FASTEST_LINK = 1e12
# below COMM_MIB MiB / FASTEST_LINK timed queueing, not the collective


class SectionTimeout(Exception):
    pass


@contextlib.contextmanager
def time_box(seconds):
    """Raise SectionTimeout in this (main) thread after `seconds` (SIGALRM; the call in
    progress finishes first)."""
    def expire(signum, frame):
        raise SectionTimeout(f"timed out after {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def timed_steps(run, model, optimizer, ctx, X, Y, n, device):
    """Seconds per training step (forward, backward, AdamW) over n steps, device synchronised at both ends."""
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        timed_step(run, model, optimizer, ctx, X, Y)
    sync(device)
    return (time.perf_counter() - start) / n


def launch(cmd, *, env, timeout):
    """(exit status, output) of a launcher command in its own process group; on timeout (or a time box
    expiring) the whole group, torchrun's workers included, is killed, and the status is None."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
        return proc.returncode, log
    except subprocess.TimeoutExpired:
        return None, ""
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def allreduce_sanity(group, device, *, mib=COMM_MIB):
    """One all-reduce of `mib` MiB through a tp group object (collectives.RealTP), inside a 'step'
    that consumes its result: the in-collective seconds the group's counter recorded against a
    physical floor and the synchronised wall time of that step. Used by the gpu-check worker (gloo,
    one GPU) and the gpu-node sweep (NCCL)."""
    n = int(mib * 2 ** 20 // 4)
    buf = torch.randn(n, device=device)
    group.all_reduce(buf)  # warm-up: the first collective sets up its connections
    sync(device)
    group.counter.reset()
    sync(device)
    start = time.perf_counter()
    y = group.all_reduce(buf)
    y.sum().item()  # the step goes on with the result (and reads it back to the host)
    sync(device)
    step = time.perf_counter() - start
    coll = group.counter.busy_seconds
    floor = n * 4 / FASTEST_LINK
    return dict(mib=mib, in_collective_ms=coll * 1e3, step_ms=step * 1e3, floor_ms=floor * 1e3,
                ok=floor < coll <= step)
