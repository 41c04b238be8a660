"""gpu-node's worker (tpcomm/experiments/gpu_node.py) with rank 1 made to raise inside one way ('all spd'),
after that way's first timed steps (its warm-up is the call before), as an error one rank meets at the end of
a way would (tests/experiments/test_gpu_node.py).
$ torchrun --standalone --nproc_per_node=2 tests/workers/gpu_node_fail_worker.py --config=JSON --out=PATH"""

import os
import sys

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tpcomm.gpu import gpu_tools  # noqa: E402
from tpcomm.experiments import gpu_node

FAILING_WAY = "all spd"
timed_steps = gpu_tools.timed_steps
calls = []  # of the failing way's model


def failing_timed_steps(run, model, optimizer, ctx, X, Y, n, device):
    seconds = timed_steps(run, model, optimizer, ctx, X, Y, n, device)
    c = model.config  # all spd with every sync option off ('spd int8' is all spd too, compressed)
    if set(c.block_types) == {"spd"} and c.tp_comm_dtype is None:
        calls.append(n)
        if os.environ["RANK"] == "1" and len(calls) > 1:  # not in its warm-up: in its timed steps
            raise RuntimeError("injected on rank 1")
    return seconds


if __name__ == "__main__":
    gpu_tools.timed_steps = failing_timed_steps
    gpu_node.worker(sys.argv[1:])
