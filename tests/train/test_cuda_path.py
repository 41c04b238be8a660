"""The GPU path read line by line, checked on CPU: the loss scaler's skip decision agrees across
the ranks that hold different gradients (fp16, fused AdamW, grad_clip=0); bench.py's clock waits for the
device before it is read; MFU is measured against the peak of the exact device and dtype, or not at all."""

import json
import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def spawn_gloo(fn, world, tmp_path, *args):
    """Run fn(rank, world, out_path, *args) in `world` gloo processes; returns each rank's JSON result. The
    processes are forked from this one (torch already imported: a fresh interpreter's import took 5-15 s per
    process on the busy 2 cores); spawned where CUDA is at hand (a forked child cannot initialize CUDA)."""
    store = tmp_path / "store"
    outs = [str(tmp_path / f"rank{r}.json") for r in range(world)]
    method = "spawn" if torch.cuda.is_available() else "fork"
    mp.start_processes(_gloo_entry, args=(fn, world, str(store), outs, args), nprocs=world,
                       start_method=method)
    results = []
    for path in outs:
        with open(path) as f:
            results.append(json.load(f))
    return results


def _gloo_entry(rank, fn, world, store, outs, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        with open(outs[rank], "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- fp16: every rank skips a step together

def _overflow_step(rank, world, kind, explicit_unscale):
    """One fp16 step of a Linear under a fused AdamW (CPU has one: it unscales inside its kernel) where only
    rank 1's forward overflows fp16 (a tp rank whose shard saw a large activation). Returns whether this
    rank's weights moved and the scale after update()."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from tpcomm.train.runtime import make_grad_scaler

    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    before = [p.detach().clone() for p in lin.parameters()]
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, fused=True)
    assert getattr(opt, "_step_supports_amp_scaling", False)  # the path that skips unscale_
    pd = SimpleNamespace(distributed=True, tp=world, dp=1, tp_group=dist.group.WORLD)
    scaler = (make_grad_scaler("cpu", "float16", pd) if kind == "ours"
              else ShardedGradScaler("cpu", process_group=dist.group.WORLD))
    x = torch.full((4, 8), 1e5 if rank == 1 else 1.0)  # rank 1: 8 x 1e5 x |w| overflows fp16 (max 65504)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = lin(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    if explicit_unscale:  # what train.py does when grad_clip != 0 (then clips)
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    moved = any(not torch.equal(p.detach(), b) for p, b in zip(lin.parameters(), before))
    return dict(finite_loss=bool(torch.isfinite(loss)), moved=moved, scale=scaler.get_scale())


def _overflow_steps(rank, world):
    """The cases of the tests below in one process group (each spawn costs seconds of start-up)."""
    return {case: _overflow_step(rank, world, kind, explicit)
            for case, (kind, explicit) in dict(ours_clip0=("ours", False), ours_clip=("ours", True),
                                               torch_clip0=("torch", False)).items()}


@pytest.fixture(scope="module")
def overflow(tmp_path_factory):
    return spawn_gloo(_overflow_steps, 2, tmp_path_factory.mktemp("scaler"))


@pytest.mark.parametrize("case", ["ours_clip0", "ours_clip"], ids=["grad_clip=0", "grad_clip>0"])
def test_fp16_overflow_on_one_tp_rank_skips_the_step_on_every_rank(overflow, case):
    r = [rank[case] for rank in overflow]
    assert r[0]["finite_loss"] and not r[1]["finite_loss"]  # the overflow is rank 1's alone
    assert not r[0]["moved"] and not r[1]["moved"], r  # both skipped
    assert r[0]["scale"] == r[1]["scale"] == 2.0 ** 15, r  # and both halved the scale (init 2^16)


def test_torch_scaler_alone_lets_the_ranks_disagree(overflow):
    """The defect the fix removes, shown on this torch: with no unscale_ before step (grad_clip=0) and a fused
    optimizer, torch's ShardedGradScaler decides per rank; rank 0 steps while rank 1 skips."""
    r = [rank["torch_clip0"] for rank in overflow]
    assert r[0]["moved"] and not r[1]["moved"], r


# ---------------------------------------------------------------- bench.py's clock waits for the device

class FakeDevice:
    """A device that queues work: its clock advances only when synchronize() waits for the queued work, as a
    GPU's work shows on the host clock only once it is waited for. Host time is never seen."""

    def __init__(self):
        self.t, self.queued, self.log = 0.0, 0.0, []

    def run(self, seconds):
        self.queued += seconds

    def clock(self):
        self.log.append("clock")
        return self.t

    def synchronize(self):
        self.log.append("sync")
        self.t, self.queued = self.t + self.queued, 0.0

    def device_clock(self):
        from tpcomm.train.runtime import DeviceClock

        return DeviceClock("cpu", clock=self.clock, synchronize=self.synchronize)


def tiny_gpt():
    from model import GPTConfig
    from tpcomm.model.interface import PlainGPT

    torch.manual_seed(0)
    return PlainGPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=65, bias=False))


def test_timed_steps_bill_only_the_timed_steps_device_work(monkeypatch):
    import bench
    from tpcomm.bench import bench_config

    cfg = dict(bench_config.DEFAULTS, vocab_size=65, block_size=16, batch_size=2, warmup=2, compile=False)
    dev, calls = FakeDevice(), []

    def queued_step(*args):  # warm-up steps are slow (a compile, autotuning); the timed ones take 1 s each
        calls.append(len(calls))
        dev.run(10.0 if len(calls) <= cfg["warmup"] else 1.0)

    monkeypatch.setattr(bench, "timed_step", queued_step)
    dt, _, _ = bench.timed_steps(tiny_gpt(), cfg, "cpu", "cpu", "float32", 4, clock=dev.device_clock())
    assert len(calls) == 6
    assert dt == 1.0  # without the wait before the first reading: (2 x 10 + 4) / 4 = 6
    assert dev.log == ["sync", "clock", "sync", "clock"]  # each reading after a wait
    assert dev.queued == 0.0  # nothing of the timed steps left unbilled


def test_timed_steps_use_the_device_clock_by_default(monkeypatch):
    import bench
    from tpcomm.bench import bench_config

    made = []

    class Recording(FakeDevice):
        def __init__(self, device):
            super().__init__()
            made.append(device)

        def now(self):
            self.synchronize()
            return self.clock()

    monkeypatch.setattr(bench, "DeviceClock", Recording)
    cfg = dict(bench_config.DEFAULTS, vocab_size=65, block_size=16, batch_size=2, warmup=0, compile=False)
    bench.timed_steps(tiny_gpt(), cfg, "cpu", "cpu", "float32", 1)
    assert made == ["cpu"]


def test_decode_timing_bills_prefill_and_tokens_apart():
    import bench

    dev = FakeDevice()

    class QueuingModel(torch.nn.Module):
        """Queues 5 s of device work for a prefill, 1 s per decoded token."""
        config = SimpleNamespace(n_layer=1)

        def forward(self, idx, kv_cache=None):
            dev.run(5.0 if idx.size(1) > 1 else 1.0)
            return torch.zeros(idx.size(0), idx.size(1), 65), None

        def reset_comm_counts(self):
            pass

        def comm_report(self, *, micro_steps, tokens):
            return {}

    dev.run(7.0)  # earlier work still queued (a warm-up): billed to nothing
    prefill_ms, per_token_ms, _, _ = bench.decode_times(QueuingModel(), batch=2, prompt_len=4, new_tokens=3,
                                                        vocab_size=65, device="cpu", ctx=torch.no_grad(),
                                                        clock=dev.device_clock())
    assert (prefill_ms, per_token_ms) == (5000.0, 1000.0)
    assert dev.log == ["sync", "clock"] * 3


def test_device_clock_synchronizes_cuda_and_not_cpu(monkeypatch):
    from tpcomm.train.runtime import DeviceClock, device_synchronizer

    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    device_synchronizer("cuda:1")()
    assert waited == [torch.device("cuda:1")]
    device_synchronizer("cpu")()
    assert waited == [torch.device("cuda:1")]  # CPU work is done when the call returns: nothing to wait for
    t0 = DeviceClock("cpu").now()
    assert DeviceClock("cpu").now() >= t0 > 0


# ---------------------------------------------------------------- MFU: the peak of the exact device and dtype

@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989), ("NVIDIA H100 PCIe", "bfloat16", 756),
    ("NVIDIA H100 NVL", "bfloat16", 835), ("NVIDIA H200", "bfloat16", 989),
                                                 ("NVIDIA A100-SXM4-80GB", "bfloat16", 312),
    # TF32, not the bf16 peak
    ("NVIDIA H100 80GB HBM3", "float32", 495), ("NVIDIA H100 PCIe", "float32", 378),
    ("NVIDIA A100-PCIE-40GB", "float16", 312), ("NVIDIA A100 80GB PCIe", "float32", 156),
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989),  # a torch dtype works too
])
def test_peak_is_the_exact_devices_for_the_dtype(monkeypatch, name, dtype, tflops):
    from model import device_peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert device_peak_flops("cuda:0", dtype) == tflops * 1e12


@pytest.mark.parametrize("device, name, dtype", [
    # unknown name: substring of a known one's family
    ("cuda", "NVIDIA H100 80GB HBM3e Experimental", "bfloat16"),
    ("cuda", "NVIDIA H800", "bfloat16"),
    ("cuda", "Tesla V100-SXM2-32GB", "bfloat16"),  # no bf16 tensor cores: no bf16 peak
    ("cuda", "NVIDIA H100 80GB HBM3", None),  # the peak depends on the dtype: none given, no MFU
    ("cpu", "NVIDIA H100 80GB HBM3", "float32"),
])
def test_no_peak_no_mfu(monkeypatch, device, name, dtype):
    from model import device_peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
    assert device_peak_flops(device, dtype) is None
    assert tiny_gpt().estimate_mfu(1, 1.0, device=device, dtype=dtype) is None


def test_mfu_divides_by_the_dtypes_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H100 PCIe")
    m = tiny_gpt()
    bf16 = m.estimate_mfu(4, 0.5, device="cuda:0", dtype="bfloat16")
    fp32 = m.estimate_mfu(4, 0.5, device="cuda:0", dtype="float32")
    cfg = m.config
    flops = (6 * m.get_num_params() + 12 * cfg.n_layer * cfg.n_embd
             * cfg.block_size) * cfg.block_size * 4 / 0.5
    assert bf16 == pytest.approx(flops / 756e12, rel=1e-12) and fp32 == pytest.approx(flops / 378e12,
                                                                                      rel=1e-12)
