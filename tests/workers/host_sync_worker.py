"""train.py's main under torchrun, with every call that would make the host wait for a CUDA device
counted per iteration (tests/train/test_host_sync.py). On CPU nothing is queued, so what is counted is
each call that waits on CUDA:
- reads of the collectives' clock: real TP's CudaEventClock stands in for a counting clock (reading an event's
  time synchronizes with it; ready() says no, as for events the device has not reached);
- Tensor.item / tolist / __bool__ / __float__ / __int__ called from the repository's own code (a device
  tensor's value copied to the host), but for HOST_READS, which read tensors that stay on the host on CUDA too
  (AdamW's own step counters are such, so torch's calls are left out);
- the loop's DeviceClock synchronizations and torch.cuda.synchronize.
$ torchrun --standalone --nproc_per_node=2 tests/workers/host_sync_worker.py OUT_DIR [train.py arguments...]
writes OUT_DIR/rank<r>.json: [[iteration or phase, what], ...]."""

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import train  # noqa: E402
from tpcomm.tp import collectives  # noqa: E402
from tpcomm.train import runtime

# files whose tensor reads are of host tensors on CUDA too
HOST_READS = {os.path.join("tpcomm", "train", "batches.py"): "a batch's offsets, drawn by a CPU generator"}
calls = []
where = ["start"]  # the iteration whose train_step last began, or 'eval' / 'save'


def note(what):
    calls.append([where[0], what])


class CountingEventClock:
    """CudaEventClock's interface; each reading counted (CudaEventClock.seconds waits for its event)."""

    lazy = True

    def now(self):
        return object()

    def seconds(self, a, b):
        note("event read")
        return 0.0

    def ready(self, mark):
        return False


def count_reads(name):
    original = getattr(torch.Tensor, name)

    def read(self, *args):
        caller = sys._getframe(1).f_code.co_filename
        path = os.path.relpath(caller, ROOT)
        if caller.startswith(ROOT + os.sep) and not path.startswith("tests"
                                                                    + os.sep) and path not in HOST_READS:
            note(f"Tensor.{name} in {path}")
        return original(self, *args)

    setattr(torch.Tensor, name, read)


def phase(fn, name):
    def run(training, *args, **kwargs):
        where[0] = training.iter_num if name is None else name
        return fn(training, *args, **kwargs)
    return run


def main(out_dir, argv):
    clock = CountingEventClock()
    collectives.RealTP.clock_for = lambda self, t: clock
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        count_reads(name)
    torch.cuda.synchronize = lambda *a, **k: note("torch.cuda.synchronize")
    train.DeviceClock = lambda device: runtime.DeviceClock(device, synchronize=lambda: note("device sync"))
    get_lr = train.get_lr

    # the loop's first call of an iteration: what follows belongs to iteration it
    def loop_iteration(it, cfg):
        where[0] = it
        return get_lr(it, cfg)

    train.get_lr = loop_iteration
    train.train_step = phase(train.train_step, None)
    train.evaluate = phase(train.evaluate, "eval")
    train.save = phase(train.save, "save")
    try:
        train.main(argv)
    finally:
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(calls, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
