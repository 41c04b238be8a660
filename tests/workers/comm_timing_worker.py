"""
How real TP times its collectives (tpcomm/tp/counting.py Timing, tpcomm/tp/collectives.py RealTP), run under
torchrun on CPU with gloo by tests/tp/test_comm_timing.py, all checks in one launch:
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node=2 \
        tests/workers/comm_timing_worker.py OUT
Rank 0 writes OUT (json): per variant and rank, the comm report's times after two training steps; and the fake
device clock's readings. The assertions live in the test file.
"""

import json
import os
import sys

import torch

# the repository
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from model import GPT, GPTConfig  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.parallel.parallel_dims import init_parallel, shutdown  # noqa: E402

# the ways to move a sync whose timing differs: blocking, asynchronous (chunks, ladder), compressed
VARIANTS = {
    "plain": dict(block_types=["tp", "spd"]),
    "overlap2": dict(block_types=["tp", "spd"], tp_overlap=2),
    "ladder": dict(block_types=["ladder", "ladder"]),
    "int8": dict(block_types=["tp", "spd"], tp_comm_dtype="int8", tp_comm_block=8),
    "int8_overlap2": dict(block_types=["tp", "ladder"], tp_comm_dtype="int8", tp_comm_block=8, tp_overlap=2),
    "int8_two_shot": dict(block_types=["tp", "ladder"], tp_comm_dtype="int8", tp_comm_block=8,
                          tp_comm_exchange="two_shot"),
    "sequence_parallel": dict(block_types=["tp", "tp"], sequence_parallel=True),
}
TIME_KEYS = ("comm_seconds", "comm_busy_seconds", "comm_fwd_seconds", "comm_bwd_seconds",
             "comm_fwd_busy_seconds", "comm_bwd_busy_seconds", "comm_codec_seconds", "fwd_allreduces",
             "bwd_allreduces", "grad_sync_allreduces")


def make_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, vocab_size=61, n_layer=2, n_head=4, n_embd=32, bias=True))


def steps(model, n=2):
    g = torch.Generator().manual_seed(1)
    model.reset_comm_counts()
    for _ in range(n):
        idx, tgt = torch.randint(61, (4, 32), generator=g), torch.randint(61, (4, 32), generator=g)
        _, loss = model(idx, tgt)
        loss.backward()
        model.sync_replicated_grads()
    return model.comm_report(micro_steps=n, tokens=idx.numel())


class FakeEvent:
    def __init__(self, t):
        self.t = t


class FakeDeviceClock:
    """Stands in for CudaEventClock: each mark is an 'event' one fake second after the last; its readings are
    counted, so a test sees that the marks are read lazily (when reported), never per collective."""

    lazy = True

    def __init__(self):
        self.t, self.marks, self.reads = 0, 0, 0

    def now(self):
        self.t += 1
        self.marks += 1
        return FakeEvent(self.t)

    def seconds(self, a, b):
        self.reads += 1
        return float(b.t - a.t)

    def ready(self, mark):
        return True


def check_fake_clock(pd, gpt):
    """A blocking model on the fake device clock: every collective's two marks one fake second apart, so the
    exposed and busy seconds per direction are the number of collectives run there."""
    model = DistributedGPT.from_gpt(gpt, pd.tp, ["tp", "spd"], pd=pd)
    clock = FakeDeviceClock()
    model.group.clock = clock
    g = torch.Generator().manual_seed(1)
    idx, tgt = torch.randint(61, (4, 32), generator=g), torch.randint(61, (4, 32), generator=g)
    _, loss = model(idx, tgt)
    loss.backward()
    model.sync_replicated_grads()
    before_report = dict(marks=clock.marks, reads=clock.reads, unread=len(model.group.counter.unread))
    report = model.comm_report(micro_steps=1, tokens=idx.numel())
    return dict(before_report=before_report, reads=clock.reads, report={k: report.get(k) for k in TIME_KEYS})


def check_bf16_identity(pd):
    """Real TP under bf16 autocast, every c_proj zeroed: the stream entering ln_f must be GPT's, bitwise (see
    tests/model/test_bf16_identity.py for the simulated checks): the largest difference per block type."""
    gpt = make_gpt()
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if "c_proj" in name:
                p.zero_()
        gpt.transformer.wpe.weight.mul_(100.0)  # |x| ~ 2-3, where bf16 rounds by ~1e-2
    idx = torch.randint(61, (4, 32), generator=torch.Generator().manual_seed(2))

    def stream(model):
        seen = []
        handle = model.transformer.ln_f.register_forward_hook(lambda m, inp, o: seen.append(inp[0].detach()))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(idx)
        handle.remove()
        return seen[0]

    want = stream(gpt)
    out = {}
    for kind in ("tp", "spd", "parallel", "ladder"):
        for loss_parallel in (False, True):
            model = DistributedGPT.from_gpt(gpt, pd.tp, [kind, "parallel"], pd=pd,
                                            loss_parallel=loss_parallel)
            out[f"{kind}/loss_parallel={loss_parallel}"] = (stream(model) - want).abs().max().item()
        if kind != "ladder":  # sequence parallel ('ladder' refuses it): its syncs reduce-scatter the d_i
            for pattern in ([kind, "parallel"], ["parallel", kind]):  # synced input, desynced input
                model = DistributedGPT.from_gpt(gpt, pd.tp, pattern, pd=pd, sequence_parallel=True)
                out[f"{pattern}/sequence_parallel"] = (stream(model) - want).abs().max().item()
    return out


def main(out):
    torch.set_num_threads(1)
    pd = init_parallel(dp=1, tp=2, device_type="cpu", backend="gloo")
    try:
        gpt = make_gpt()
        results = {"variants": {}}
        for name, options in VARIANTS.items():
            model = DistributedGPT.from_gpt(gpt, pd.tp, pd=pd, **options)
            steps(model, 1)  # warm-up
            report = steps(model)
            results["variants"][name] = {k: report.get(k) for k in TIME_KEYS}
        results["fake_clock"] = check_fake_clock(pd, gpt)
        results["bf16_identity"] = check_bf16_identity(pd)
        gathered = [None] * pd.world_size
        torch.distributed.all_gather_object(gathered, results)
        if pd.is_master:
            with open(out, "w") as f:
                json.dump(gathered, f)
    finally:
        shutdown(pd, finished=True)


if __name__ == "__main__":
    main(sys.argv[1])
