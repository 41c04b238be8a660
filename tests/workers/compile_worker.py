"""
torch.compile under real tensor parallelism (one shard per process, gloo), run by tests/model/test_compile.py:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/compile_worker.py OUT.json [VARIANTS]
Each rank compiles a real-TP DistributedGPT with dropout, warms up, then trains further steps with recompiling
turned into an error; rank 0 writes the compiled and eager losses of every step and the number of recompiles.
VARIANTS: a JSON list of model options (tp_overlap, sequence_parallel, tp_comm_dtype, block_types) over
compile_check's model, each run in turn (one result per variant); without it, the model itself.
"""

import json
import os
import sys

import torch

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from compile_check import run_steps  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402


def main(out, variants=(None,)):
    torch.set_num_threads(1)
    pd = init_parallel(dp=1, tp=2, device_type="cpu", backend="gloo")
    try:
        result = [run_steps("distributed_gpt", 0.1, pd=pd, extra=extra) for extra in variants]
        if pd.is_master:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        shutdown(pd, finished=True)


if __name__ == "__main__":
    main(*sys.argv[1:2], *(json.loads(a) for a in sys.argv[2:]))
