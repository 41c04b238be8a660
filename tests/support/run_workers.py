"""
Several multi-process check scripts (tests/workers/*_worker.py) in one torchrun launch: the processes pay for
starting Python, importing torch and joining the process group once, not once per script.
conftest.shared_launch starts it:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/support/run_workers.py JOBS.json
JOBS.json is a list of {"dir": DIR, "argv": [SCRIPT, ARG, ...]}. Each job runs as `python
SCRIPT ARG ...` would under torchrun (runpy, as __main__, with sys.argv set), in order, on the
process group this script starts once:
- inside a job, `dist.init_process_group` is a no-op once the group exists, and `dist.destroy_process_group`
  (the workers' tear-down) is a barrier, so the next job finds the group as it was;
- before each job the global RNGs are reseeded as at process start and torch.compile's caches and counters are
  reset, so a job sees the state a launch of its own would;
- a job that raises on some rank leaves DIR/error.rank<r>.txt (its traceback) and the launch goes on with the
  next job; a finished job leaves DIR/done (written by rank 0 after a barrier);
- a rank whose job raised waits PEER_WAIT_S (env TPCOMM_PEER_WAIT_S) for the other ranks to finish it too; a
  rank that has not (waiting in a collective the raising rank will never join) would hang the launch, so the
  raising rank says so in its error file and exits, torchrun ends the others, and the jobs not run are
  reported as such.
"""

import glob
import json
import os
import random
import runpy
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

# workers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers"))
# import each other (real_tp_worker), as a worker run on its own does from its folder

PEER_WAIT_S = float(os.environ.get("TPCOMM_PEER_WAIT_S", "120"))
_init, _destroy = dist.init_process_group, dist.destroy_process_group


def init_once(*args, **kwargs):
    if not dist.is_initialized():
        _init(*args, **kwargs)


def barrier_instead_of_destroy(*args, **kwargs):
    if dist.is_initialized():
        dist.barrier()


def fresh_state(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()


def main(jobs_path):
    with open(jobs_path) as f:
        jobs = json.load(f)
    seed = torch.initial_seed()  # the default seed a fresh process starts with
    threads = torch.get_num_threads()
    _init(backend="gloo")
    rank = dist.get_rank()
    dist.init_process_group, dist.destroy_process_group = init_once, barrier_instead_of_destroy
    try:
        for job in jobs:
            fresh_state(seed)
            torch.set_num_threads(threads)
            start, argv = time.time(), sys.argv
            sys.argv = list(job["argv"])
            failed = False
            try:
                runpy.run_path(job["argv"][0], run_name="__main__")
            except BaseException as e:  # noqa: B902 (SystemExit(0) is a finished job)
                failed = not (isinstance(e, SystemExit) and e.code in (0, None))
                if failed:
                    with open(os.path.join(job["dir"], f"error.rank{rank}.txt"), "w") as f:
                        f.write(traceback.format_exc())
            finally:
                sys.argv = argv
            open(os.path.join(job["dir"], f"finished.rank{rank}"), "w").close()
            if failed:
                wait_for_peers(job["dir"], rank)
            finish_job(job["dir"], rank, time.time() - start)
    finally:
        _destroy()


def wait_for_peers(job_dir, rank):
    """After this rank's job raised: return once every rank has finished the job, else end the launch."""
    world, deadline = dist.get_world_size(), time.time() + PEER_WAIT_S
    while len(glob.glob(os.path.join(job_dir, "finished.rank*"))) < world:
        if time.time() > deadline:
            with open(os.path.join(job_dir, f"error.rank{rank}.txt"), "a") as f:
                f.write(f"\nthe other ranks had not finished this job {PEER_WAIT_S:.0f} s after this rank's "
                        "error (waiting in a collective this rank left): the launch ends here\n")
            os._exit(1)
        time.sleep(0.2)


def finish_job(job_dir, rank, seconds):
    dist.barrier()
    if rank == 0:
        with open(os.path.join(job_dir, "done"), "w") as f:
            f.write(f"{seconds:.1f}\n")


if __name__ == "__main__":
    main(sys.argv[1])
