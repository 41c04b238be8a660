"""
Checks of the shared launch itself (tests/support/run_workers.py), run as jobs of it by
tests/support/test_shared_launch.py:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/shared_launch_worker.py ok out.json
'raise' fails on every rank; 'raise-one' on rank 1 alone, while rank 0 waits in an all-reduce; 'ok' sets up
and tears down the process group as a worker does, all-reduces the ranks' numbers and draws from the global
RNG; rank 0 writes what it saw.
"""

import json
import sys

import torch
import torch.distributed as dist


def main(argv):
    mode, out_path = argv
    if mode == "raise":
        raise RuntimeError("this job fails on purpose")
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    if mode == "raise-one" and dist.get_rank() == 1:
        raise RuntimeError("this job fails on rank 1 alone")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    result = dict(world=dist.get_world_size(), sum=t.item(), seed=torch.initial_seed(),
                  rand=torch.rand(3).tolist())
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
