"""`python -m tpcomm.bench.trace summary` per direction: the time in collectives, the exposed
part and the part that ran beside compute, from the host spans (an asynchronous collective runs from its issue
span to the end of its 'wait ' span); on a GPU trace, the NCCL kernels' time beside other kernels. Synthetic
traces with known answers (exact: sums of the given microseconds)."""

import pytest

from tpcomm.bench.trace import main, overlap_by_direction, summary

ASYNC = "allreduce g_async fwd L1 ladder attn 2048B real"


def span(name, ts, dur, cat="user_annotation"):
    return dict(ph="X", name=name, ts=ts, dur=dur, cat=cat, pid=0, tid=0)


def trace(extra=()):
    return {"traceEvents": [
        span("ProfilerStep#0", 0, 20000),
        span("allreduce g fwd L0 tp attn 2048B real", 1000, 1000),  # blocking: 1 ms, all exposed
        span(ASYNC, 3000, 200),  # issued at 3 ms ...
        span("aten::mm", 3300, 2000, cat="cpu_op"),  # ... compute meanwhile ...
        span("wait " + ASYNC, 6000, 500),  # ... waited until 6.5 ms: 3.5 ms in it, 0.7 exposed
        span("allreduce f bwd L0 tp attn 2048B real", 10000, 2000),  # backward, blocking
        # the gradient sync: backward, as labelled
        span("allreduce sum bwd grad_sync 512B real", 15000, 1000),
        *extra]}


def test_overlap_by_direction():
    from tpcomm.bench.trace import collective_events

    per = overlap_by_direction(collective_events(trace(), waits=True))
    assert per["fwd"] == pytest.approx(dict(n=2, in_ms=4.5, exposed_ms=1.7, beside_ms=2.8, share=2.8 / 4.5))
    assert per["bwd"] == pytest.approx(dict(n=2, in_ms=3.0, exposed_ms=3.0, beside_ms=0.0, share=0.0))


def test_summary_prints_the_overlap_share_per_direction(capsys):
    lines = summary(trace())
    assert lines[1] == ("step 0 overlap: fwd 4.50 ms in collectives, 1.70 exposed, 2.80 beside compute "
                        "(62%); bwd 3.00 ms in collectives, 3.00 exposed, 0.00 beside compute (0%)")
    gpu = trace([span("ncclDevKernel_AllReduce_Sum_f32", 2000, 1000, cat="kernel"),
                 span("ampere_sgemm_128x64", 2500, 1000, cat="kernel"),
                 span("elementwise_kernel", 2800, 1000, cat="kernel")])
    assert summary(gpu)[1].endswith("; device: NCCL kernels 1.00 ms, 0.50 beside other kernels")


def test_summary_cli(tmp_path, capsys):
    import json

    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace()))
    main(["summary", str(path)])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[1].startswith(f"{path}: step 0 overlap: fwd 4.50 ms in collectives")


def test_collective_matmul_ring_transfers_pair_with_their_waits():
    """A ring transfer's issue span and its 'wait ring_p2p ...' span are one
    collective, in flight from the issue to the end of the wait, the GEMM between them beside it;
    the summary counts the transfers."""
    ring = "ring_p2p ag fwd L0 tp attn 1024B real"
    t = {"traceEvents": [span("ProfilerStep#0", 0, 10000), span(ring, 1000, 100),
                         span("aten::mm", 1100, 800, cat="cpu_op"), span("wait " + ring, 1900, 100)]}
    from tpcomm.bench.trace import collective_events

    per = overlap_by_direction(collective_events(t, waits=True))
    assert per["fwd"] == pytest.approx(dict(n=1, in_ms=1.0, exposed_ms=0.2, beside_ms=0.8, share=0.8))
    assert "1 ring transfers" in summary(t)[0]
