"""Communication times: every collective is timed on a clock that
suits its device (wall time on CPU, CUDA events on CUDA, read lazily), per direction (forward, backward),
with "exposed" (the compute held up) never above "in collectives" (issue to completion); tp_comm_dtype's
quantize/dequantize work is a column of its own. Real TP on CPU with gloo
(tests/workers/comm_timing_worker.py, one torchrun launch); no GPU here, so the CUDA path is checked with
a fake device clock the group is given in place of CudaEventClock."""

import json

import pytest

from conftest import TORCHRUN, run_script
from tpcomm.tp.counting import CommCounter, Timing, WallClock

# exposed <= busy by construction (both read from the same marks); 1e-9 s only absorbs float rounding of the
# sums
EPS = 1e-9


class Marks(WallClock):
    """A host clock whose marks are given numbers."""

    def now(self):
        raise AssertionError("not used")


@pytest.mark.parametrize("issued, done, waited, exposed, busy", [
    (2.0, None, None, 2.0, 2.0),  # blocking: the call is the collective
    (1.0, 3.0, (5.0, 5.5), 1.5, 3.5),  # done before the wait: [0, 3] U [5, 5.5]
    (1.0, 6.0, (4.0, 6.5), 3.5, 6.5),  # the wait blocked until done: [0, 6.5]
    (1.0, 0.5, (4.0, 4.2), 1.2, 1.2),  # completed before the issue call returned: the call still counts
    # no completion mark (gloo on CUDA without a future): until the wait ended
    (1.0, None, (4.0, 6.0), 3.0, 6.0),
])
def test_timing_exposed_never_above_busy(issued, done, waited, exposed, busy):
    t = Timing(Marks(), "fwd", 0.0, issued, done=done, waited=waited)
    assert t.exposed() == pytest.approx(exposed) and t.busy() == pytest.approx(busy)
    assert t.exposed() <= t.busy()


def test_counter_splits_directions_and_codec():
    c, clock = CommCounter(), Marks()
    c.add_timing(Timing(clock, "fwd", 0.0, 2.0))
    c.add_timing(Timing(clock, "bwd", 0.0, 1.0, done=3.0, waited=(5.0, 5.5)))
    c.add_timing(Timing(clock, "fwd", 0.0, 0.25, codec=True))
    r = c.report(micro_steps=1, tokens=1)
    assert (r["comm_fwd_seconds"], r["comm_fwd_busy_seconds"]) == (2.0, 2.0)
    assert (r["comm_bwd_seconds"], r["comm_bwd_busy_seconds"]) == (1.5, 3.5)
    assert (r["comm_seconds"], r["comm_busy_seconds"], r["comm_codec_seconds"]) == (3.5, 5.5, 0.25)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    out = tmp_path_factory.mktemp("timing") / "timing.json"
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "tests/workers/comm_timing_worker.py", str(out),
                   timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return json.loads(out.read_text())


def test_real_tp_exposed_never_above_in_collectives(worker):
    """Plain, overlapped (chunks, ladder), int8 one- and two-shot (also overlapped), sequence
    parallel: per rank and per direction, exposed <= in collectives, both > 0; the int8 exchanges'
    codec work is its own column."""
    for rank in worker:
        for name, r in rank["variants"].items():
            for d in ("fwd", "bwd"):
                exposed, busy = r[f"comm_{d}_seconds"], r[f"comm_{d}_busy_seconds"]
                assert 0 < exposed <= busy + EPS, (name, d, exposed, busy)
            assert r["comm_seconds"] == pytest.approx(r["comm_fwd_seconds"] + r["comm_bwd_seconds"])
            assert r["comm_busy_seconds"] == pytest.approx(r["comm_fwd_busy_seconds"]
                                                           + r["comm_bwd_busy_seconds"])
            assert (r["comm_codec_seconds"]
                    or 0) > 0 if name.startswith("int8") else r["comm_codec_seconds"] is None
        # anti-vacuity: an overlapped forward spends time in collectives that the compute did not wait for
        overlapped = rank["variants"]["overlap2"]
        assert overlapped["comm_fwd_busy_seconds"] > overlapped["comm_fwd_seconds"]


def test_device_clock_marks_read_lazily_per_direction(worker):
    """The group given a fake device clock times every collective with its marks (never perf_counter), reads
    none of them before the report (a CUDA event read there would synchronize the host per collective), and
    puts each in its direction: ['tp', 'spd'] runs 3 forward all-reduces, 3 backward ones and the gradient
    sync (backward), each two marks one fake second apart."""
    for rank in worker:
        fake = rank["fake_clock"]
        assert fake["before_report"] == dict(marks=14, reads=0, unread=7)
        r = fake["report"]
        assert (r["fwd_allreduces"], r["bwd_allreduces"], r["grad_sync_allreduces"]) == (3, 3, 1)
        assert (r["comm_fwd_seconds"], r["comm_fwd_busy_seconds"]) == (3.0, 3.0)
        assert (r["comm_bwd_seconds"], r["comm_bwd_busy_seconds"]) == (4.0, 4.0)
        assert fake["reads"] > 0


def test_real_tp_bf16_fan_out_keeps_the_stream(worker):
    """Real TP, bf16 autocast, every c_proj zeroed: the stream entering ln_f is GPT's bitwise for every
    block type, with the vocab-parallel embedding too, and sequence parallel
    (as tests/model/test_bf16_identity.py checks simulated)."""
    for rank in worker:
        assert len(rank["bf16_identity"]) == 13  # 4 kinds x 2 embeddings, 5 sequence-parallel patterns
        assert set(rank["bf16_identity"].values()) == {0.0}, rank["bf16_identity"]
