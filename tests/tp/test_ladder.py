"""The 'ladder' block (Ladder Residual, arXiv 2501.06589): DistributedGPT against the ladder equation written
here from GPT's own modules (all-ladder, any tp) and against a per-shard reference of docs/model.md's
equations (mixed with 'tp', 'spd', 'parallel'); all-ladder at tp 1 is not GPT; measured counts; the KV cache;
the asynchronous all-reduces' order in a trace; and, under torchrun (tests/workers/ladder_worker.py, 2 gloo
processes), real == simulated with the all-reduces really asynchronous."""

import json

import pytest
import torch
from conftest import assert_same as assert_same_losses, differs, losses, shared_launch, train
from ladder_worker import MIXED, PATTERNS, expected_log, log_async
from real_tp_worker import name
from test_generate import stepwise_logits
from test_tensor_parallel import (N_EMBD, N_LAYER, VOCAB, assert_same, batch, make_gpt, run, run_keyed,
                                  with_dropout)
# docs/model.md per shard, 'ladder' too
from test_tensor_parallel import reference_forward as per_shard_forward
from torch.nn import functional as F

import tpcomm.model.blocks as blocks
from tpcomm.model.block_types.registry import BLOCK_TYPES
from tpcomm.errors import ConfigError
from model import KVCache
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig
from tpcomm.bench import trace as comm_trace
from tpcomm.tp.collectives import (SimulatedTP, copy_to_tp_region, reduce_from_tp_region,
                                   reduce_from_tp_region_async)

# float64 throughout: the sharded model sums the same products as the references in another order (batched
# matmuls, a sum over shards, SDPA's kernel against the reference's per-shard call); measured differences
# <3e-16 on logits, loss and gradients, so 1e-10 is tight, while a wrong order, shard or bias moves them by
# >1e-2 (measured; the *_can_fail tests).
TOL = dict(rtol=1e-10, atol=1e-10)


def fp64(gpt):
    return gpt.double()


def distributed(gpt, tp, block_types, **kw):
    return DistributedGPT.from_gpt(gpt, tp, block_types, **kw).double()


# ---------- the references ----------

def gpt_ladder_forward(gpt, idx, targets, block_types, *, mlp_reads_attention=False):
    """The ladder equation x_i = x_{i-1} + h_i(x_{i-2}) over GPT's module sequence (attention l, MLP l,
    ...), with GPT's own ln_1/attn/ln_2/mlp: attention l reads the stream through attention l-1, MLP l
    through MLP l-1; the outputs still pending are added before any other block (GPT's Block here: 'tp'
    at any tp_size, every type at tp 1) and before ln_f. mlp_reads_attention=True: the wrong order (MLP l
    also reads attention l's output)."""
    tr = gpt.transformer
    x = tr.wte(idx) + tr.wpe(torch.arange(idx.size(1)))
    pending = []  # [attention l-1's output, MLP l-1's output], not yet added to x
    for block, kind in zip(tr.h, block_types):
        if kind != "ladder":
            x = block(x + sum(pending))
            pending = []
            continue
        u = x + pending[0] if pending else x  # the stream through attention l-1
        a = block.attn(block.ln_1(u))
        x = u + pending[1] if pending else u  # the stream through MLP l-1
        m = block.mlp(block.ln_2(x + a if mlp_reads_attention else x))
        pending = [a, m]
    logits = gpt.lm_head(tr.ln_f(x + sum(pending)))
    return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def run_reference(forward, gpt, *args, **kw):
    gpt.zero_grad(set_to_none=True)
    logits, loss = forward(gpt, *args, **kw)
    loss.backward()
    return logits, loss, {n: p.grad.clone() for n, p in gpt.named_parameters()}


# ---------- the equations ----------

@pytest.mark.parametrize("tp", [1, 2, 4])
def test_all_ladder_equals_the_ladder_equation_on_gpts_modules(tp):
    """Only the all-reduces' placement changes with ladder, so each module's full output is GPT's module
    output at every tp_size: logits, loss and every gradient equal the single-device ladder equation."""
    gpt = fp64(make_gpt())
    idx, tgt = batch()
    block_types = ["ladder"] * N_LAYER
    ref = run_reference(gpt_ladder_forward, gpt, idx, tgt, block_types)
    assert_same(run(distributed(gpt, tp, block_types), idx, tgt), ref, **TOL)
    # the per-shard reference is the same function (so the mixed cases below compare against the right thing)
    assert_same(run_reference(per_shard_forward, gpt, idx, tgt, tp, block_types), ref, **TOL)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("block_types", MIXED, ids=[name(p) for p in MIXED])
def test_mixed_patterns_match_per_shard_reference(tp, block_types):
    gpt = fp64(make_gpt())
    idx, tgt = batch()
    assert_same(run(distributed(gpt, tp, block_types), idx, tgt),
                run_reference(per_shard_forward, gpt, idx, tgt, tp, block_types), **TOL)


@pytest.mark.parametrize("block_types", PATTERNS + [["ladder", "tp", "tp", "ladder"]],
                         ids=[name(p) for p in PATTERNS] + ["ladder-tp-tp-ladder"])
def test_at_tp1_every_pattern_is_the_ladder_equation(block_types):
    """At tp 1 every other block type is GPT's block, so any pattern is the single-device ladder equation."""
    gpt = fp64(make_gpt())
    idx, tgt = batch()
    assert_same(run(distributed(gpt, 1, block_types), idx, tgt),
                run_reference(gpt_ladder_forward, gpt, idx, tgt, block_types), **TOL)


def test_all_ladder_at_tp1_is_not_gpt():
    """Ladder Residual is another model: at tp 1 (no communication at all) its loss is not GPT's."""
    gpt = fp64(make_gpt())
    idx, tgt = batch()
    ladder = run(distributed(gpt, 1, ["ladder"] * N_LAYER), idx, tgt)
    assert abs(ladder[1].item() - gpt(idx, tgt)[1].item()) > 1e-4
    with pytest.raises(AssertionError):
        assert_same(ladder, run(gpt, idx, tgt), **TOL)


def test_comparisons_can_fail():
    gpt = fp64(make_gpt())
    idx, tgt = batch()
    # the wrong order in the reference (MLP l reading attention l's output) is seen
    all_ladder = ["ladder"] * N_LAYER
    with pytest.raises(AssertionError):
        assert_same(run(distributed(gpt, 2, all_ladder), idx, tgt), run_reference(gpt_ladder_forward, gpt,
                                                                                  idx, tgt, all_ladder,
                                                                                  mlp_reads_attention=True),
                    **TOL)
    # one weight of shard 1 changed by 0.1: both references notice
    for block_types, forward, args in ((all_ladder, gpt_ladder_forward, (all_ladder,)),
                                       (MIXED[1], per_shard_forward, (2, MIXED[1]))):
        model = distributed(gpt, 2, block_types)
        with torch.no_grad():
            # a v row of shard 1
            model.transformer.h[2].attn.c_attn.weight[2 * N_EMBD + N_EMBD // 2, 3] += 0.1
        with pytest.raises(AssertionError):
            assert_same(run(model, idx, tgt), run_reference(forward, gpt, idx, tgt, *args), **TOL)
    # a ladder block given another type's place in the reference (its d_i after 'parallel', its pending
    # outputs)
    with pytest.raises(AssertionError):
        assert_same(run(distributed(gpt, 2, MIXED[1]), idx, tgt),
                    run_reference(per_shard_forward, gpt, idx, tgt, 2, ["tp" if k == "ladder" else k
                                                                        for k in MIXED[1]]), **TOL)


# ---------- what is counted ----------

def test_communication_is_measured():
    """2 forward all-reduces per ladder block, all issued asynchronously (async_allreduces); none
    for the others. A ladder block after 'parallel' reads the shards' own streams (no f): one
    backward all-reduce fewer."""
    gpt = make_gpt()
    idx, _ = batch()
    expect = {  # (fwd, async, bwd): f before each module of a synced ladder block, g after each
        ("ladder",) * 4: (8, 8, 8), ("tp", "ladder", "ladder", "spd"): (7, 4, 7),
        ("ladder", "parallel", "ladder", "ladder"): (6, 6, 5),
        ("ladder", "ladder", "spd", "parallel"): (6, 4, 6),
        ("tp", "spd", "spd", "parallel"): (5, 0, 5),
    }
    for block_types, (fwd, overlapped, bwd) in expect.items():
        comm = DistributedGPT.from_gpt(gpt, 4, list(block_types)).comm_per_forward(idx)
        assert (comm["fwd_allreduces"], comm["async_allreduces"], comm["bwd_allreduces"]) == (fwd, overlapped,
                                                                                              bwd), \
            (block_types, comm)
        assert comm["comm_bytes_per_token"] == (fwd + bwd) * N_EMBD * 4
    # one shard
    assert DistributedGPT.from_gpt(gpt, 1, "ladder").comm_per_forward(idx)["async_allreduces"] == 0


def test_config_accepts_ladder_and_loss_parallel_runs_with_it():
    assert TPConfig(n_layer=3, n_head=4, n_embd=32, tp_size=2,
                    block_types="ladder").block_types == ["ladder"] * 3
    assert "ladder" in BLOCK_TYPES
    with pytest.raises(ConfigError, match="ladr"):
        TPConfig(n_layer=2, n_head=4, n_embd=32, tp_size=2, block_types=["ladder", "ladr"])
    # the vocabulary-sharded head sees the stream after the pending outputs are added: the same model
    gpt = fp64(make_gpt())
    idx, tgt = batch()
    block_types = MIXED[0]
    _, loss, _ = run(distributed(gpt, 2, block_types, loss_parallel=True), idx, tgt)
    torch.testing.assert_close(loss, run(distributed(gpt, 2, block_types), idx, tgt)[1], **TOL)


# ---------- the asynchronous all-reduce ----------

def test_async_g_equals_g_forward_and_backward():
    """reduce_from_tp_region_async(...).wait() is g: the same sum, the same
    gradient (identity, fanned out)."""
    group = SimulatedTP(3)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, 4, dtype=torch.float64)
    outs, grads = [], []
    for reduce in (lambda t: reduce_from_tp_region(t, group),
                   lambda t: reduce_from_tp_region_async(t, group).wait()):
        x.grad = None
        y = reduce(copy_to_tp_region(x, group) * w)
        (y * y).sum().backward()
        outs.append(y.detach())
        grads.append(x.grad.clone())
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
    handle = reduce_from_tp_region_async(torch.ones(3, 2, 2), group)
    assert handle.wait() is handle.wait()  # waited once, the same tensor after
    # the loop's second, and this
    assert group.counter.report(micro_steps=1, tokens=1)["async_allreduces"] == 2


class _WritesOnWait(SimulatedTP):
    """A group whose asynchronous sum lands in its buffer only at wait(), through an ATen in-place
    copy: what gloo does with CUDA tensors (it reduces on the host and copies the result back),
    unlike gloo on CPU tensors."""

    def sum_partials_async(self, x):
        buf = torch.zeros_like(x[0])

        class Work:
            def wait(self):
                buf.copy_(x.sum(0))
        return buf, Work()

    def wait(self, work):
        work.wait()


def test_async_g_survives_a_collective_that_writes_its_buffer_late():
    """The buffer an asynchronous g returns is written after the call (gloo on CUDA: H100, 2026-11-26, real_tp
    failed with "Output 0 of _ReducedBackward is a view ... modified inplace"): wait() then gives g, value and
    gradient, as the blocking g does; and it fails if the buffer is the Function's output itself."""
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, 4, dtype=torch.float64)
    outs, grads = [], []
    for reduce in (lambda t: reduce_from_tp_region(t, SimulatedTP(3)),
                   lambda t: reduce_from_tp_region_async(t, _WritesOnWait(3)).wait()):
        x.grad = None
        y = reduce(copy_to_tp_region(x, SimulatedTP(3)) * w)
        (y * y).sum().backward()
        outs.append(y.detach())
        grads.append(x.grad.clone())
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
    # the check can fail: the buffer itself as the output is what autograd refuses
    from tpcomm.tp.collectives import _Reduced
    buf = torch.zeros(5, 4, dtype=torch.float64)
    y = _Reduced.apply(copy_to_tp_region(x, SimulatedTP(3)) * w, buf)
    buf.copy_(torch.ones_like(buf))
    with pytest.raises(RuntimeError, match="modified inplace"):
        (y * y).sum().backward()


def test_all_reduces_are_waited_for_after_the_next_module(monkeypatch):
    """All-ladder: module i's all-reduce is waited for only after module i+1's was
    issued (2 in flight at most)."""
    log = log_async(lambda fn: monkeypatch.setattr(blocks, "reduce_from_tp_region_async", fn))
    idx, tgt = batch()
    DistributedGPT.from_gpt(make_gpt(), 2, "ladder")(idx, tgt)
    assert [e[:3] for e in log] == expected_log(N_LAYER)
    assert not any(e[3] for e in log if e[0] == "issue")  # simulated: summed at issue, no work to wait for


NEXT_COMPUTE = {"attn": "aten::gelu", "mlp": "aten::scaled_dot_product_attention"}  # MLP l; attention l+1


def overlaps(trace):
    """Each asynchronous all-reduce of a trace holding one forward pass: {(layer, site): whether the next
    module's compute (MLP l after attention l's all-reduce, attention l+1 after MLP l's) began after it was
    issued and before it was waited for}, on the thread that issued it."""
    trace = comm_trace.load_trace(trace)
    events = comm_trace.collective_events(trace, waits=True)
    issued = [e for e in events if e["op"] == "g_async" and e["category"] == "stream"]
    waits = {(e["layer"], e["site"]): e for e in events if e["category"] == "wait"}
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") in NEXT_COMPUTE.values()]
    out = {}
    for e in issued:
        w = waits[(e["layer"], e["site"])]
        out[(e["layer"], e["site"])] = any(op["name"] == NEXT_COMPUTE[e["site"]] and op.get("tid") == e["tid"]
                                           and e["ts"] + e["dur"] <= op["ts"] < w["ts"] for op in ops)
    return out


def expected_overlaps(block_types):
    """Every ladder all-reduce overlaps the next module's compute, but the last MLP's of a run of ladder
    blocks: the next block (or ln_f) needs the whole stream."""
    return {(l, site): not (site == "mlp" and (l + 1 == len(block_types) or block_types[l + 1] != "ladder"))
            for l, kind in enumerate(block_types) if kind == "ladder" for site in ("attn", "mlp")}


def trace_forward(model, path):
    idx, tgt = batch()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(idx, tgt)
    prof.export_chrome_trace(str(path))
    return str(path)


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_trace_shows_issue_then_next_module_then_wait(tmp_path, block_types):
    """Simulated (summed at issue), the order of the spans is already the real one: issue(i), the compute of
    module i+1, wait(i). Waiting at once (a synchronous all-reduce) fails this."""
    model = DistributedGPT.from_gpt(make_gpt(), 2, block_types)
    path = trace_forward(model, tmp_path / "sim.json")
    assert overlaps(path) == expected_overlaps(block_types)
    events = comm_trace.collective_events(path)  # the waits are not collectives: counted once, at the issue
    assert sum(e["op"] == "g_async" for e in events) == 2 * block_types.count("ladder")
    assert all(e["mode"] == "sim" for e in comm_trace.collective_events(path, waits=True))


def test_trace_order_can_fail(tmp_path, monkeypatch):
    issue = blocks.reduce_from_tp_region_async

    def waited_at_once(x, group, *, site):
        handle = issue(x, group, site=site)
        handle.wait()
        return handle

    monkeypatch.setattr(blocks, "reduce_from_tp_region_async", waited_at_once)
    model = DistributedGPT.from_gpt(make_gpt(), 2, "ladder")
    assert not any(overlaps(trace_forward(model, tmp_path / "sync.json")).values())


# ---------- generation and dropout ----------

@pytest.mark.parametrize("tp, block_types", [(1, ["ladder"] * N_LAYER), (2, ["ladder"] * N_LAYER),
                                             (4, ["ladder"] * N_LAYER)] + [(2, p) for p in MIXED],
                         ids=["ladder-tp1", "ladder-tp2", "ladder-tp4"] + [f"{name(p)}-tp2" for p in MIXED])
def test_cached_generation_equals_recomputing(tp, block_types):
    """fp32 as tests/model/test_generate.py (its tolerance 1e-5; measured <1e-6 here): the cached
    step's stream is the same per token, so the logits of every step and the greedy and sampled
    tokens are those of recomputing."""
    model = DistributedGPT.from_gpt(make_gpt().eval(), tp, block_types).eval()
    prompt = torch.randint(VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    # 45 > block_size 32: the window slides
    greedy = model.generate(prompt, 40, temperature=0, use_cache=True)
    assert torch.equal(greedy, model.generate(prompt, 40, temperature=0, use_cache=False))
    tokens = greedy[:, :30]
    torch.testing.assert_close(stepwise_logits(model, tokens, 5, cached=True),
                               stepwise_logits(model, tokens, 5, cached=False), rtol=1e-5, atol=1e-5)
    torch.manual_seed(7)
    sampled = model.generate(prompt, 20, temperature=1.0, top_k=10, use_cache=True)
    torch.manual_seed(7)
    assert torch.equal(sampled, model.generate(prompt, 20, temperature=1.0, top_k=10, use_cache=False))


def test_cache_comparison_can_fail():
    model = DistributedGPT.from_gpt(make_gpt().eval(), 2, "ladder").eval()
    tokens = torch.randint(VOCAB, (2, 20), generator=torch.Generator().manual_seed(4))
    ref = stepwise_logits(model, tokens, 5, cached=False)
    advance = KVCache.advance
    try:
        KVCache.advance = lambda self, t: None  # every step at position 0 of the cache
        with pytest.raises(AssertionError):
            torch.testing.assert_close(stepwise_logits(model, tokens, 5, cached=True), ref, rtol=1e-5,
                                       atol=1e-5)
    finally:
        KVCache.advance = advance


def test_dropout_keyed_reproducible_and_eval_is_the_equation():
    """Dropout 0.2: the same key draws the same masks (bitwise); another key another loss; eval mode drops
    nothing and is the per-shard reference."""
    gpt = fp64(make_gpt())
    idx, tgt = batch()
    block_types = MIXED[1]
    model = distributed(with_dropout(gpt, 0.2), 2, block_types)
    a, b = run_keyed(model, idx, tgt), run_keyed(model, idx, tgt)
    assert_same(a, b, rtol=0, atol=0)
    assert abs(run_keyed(model, idx, tgt, (1337, 8, 2))[1].item() - a[1].item()) > 1e-4
    ref = run_reference(per_shard_forward, gpt, idx, tgt, 2, block_types)
    assert abs(a[1].item() - ref[1].item()) > 1e-4  # training mode drops
    model.eval()
    assert_same(run(model, idx, tgt), ref, **TOL)


# ---------- real tensor parallelism (torchrun, 2 gloo processes) ----------

# tests/workers/ladder_worker.py in the shared launch of 2 processes (conftest.shared_launch)
SHARED_LAUNCHES = {"real": {None: (2, ["tests/workers/ladder_worker.py", "{dir}"])}}


@pytest.fixture(scope="module")
def real(request):
    out = shared_launch(request, SHARED_LAUNCHES)
    with open(out / "results.json") as f:
        return json.load(f)["results"], out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_real_equals_simulated(real, dtype, block_types):
    """Logits, loss and every gradient (ratio <= 1: assert_close passes at the worker's TOL:
    fp64 1e-9, fp32 2e-5), without and with dropout (keyed masks); the same measured counts,
    every ladder all-reduce asynchronous."""
    results, _ = real
    for check in ("fwd_bwd", "dropout"):
        result = results[f"{check}/{dtype}/{name(block_types)}"]
        assert result["ratio"] <= 1.0, json.dumps(result)
    counts = results[f"fwd_bwd/{dtype}/{name(block_types)}"]["counts"]
    n = block_types.count("ladder")
    assert counts["real"] == counts["sim"] and counts["real"]["async_allreduces"] == 2 * n, counts


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_real_generation(real, block_types):
    """Greedy and seeded sampling with and without the KV cache give the simulated model's tokens on every
    rank; the cached step's logits are those of recomputing (fp64, 1e-9)."""
    results, _ = real
    assert results[f"generate/{name(block_types)}"]["ok"]
    assert results[f"generate/cached_logits/{name(block_types)}"]["ratio"] <= 1.0


def test_real_all_reduces_are_asynchronous(real):
    """Each rank: every ladder all-reduce got a torch.distributed work handle (async_op=True) and
    was waited for after the next module was issued; its trace shows issue(i), the compute of
    module i+1, then wait(i)."""
    results, out = real
    for rank in (0, 1):
        log = results[f"async/log/rank{rank}"]
        assert [tuple(e[:3]) for e in log] == expected_log(N_LAYER)
        assert all(e[3] for e in log if e[0] == "issue")  # in flight: a work handle to wait for
        for trace in (f"trace{rank}.json", f"trace-mixed{rank}.json"):
            block_types = PATTERNS[0] if "mixed" not in trace else MIXED[1]
            assert overlaps(str(out / trace)) == expected_overlaps(block_types), trace
            events = comm_trace.collective_events(str(out / trace), waits=True)
            assert events and all(e["mode"] == "real" for e in events)


def test_real_comparisons_can_fail(real):
    results, out = real
    assert results["can_fail/perturbed_shard"]["ratio"] > 10  # one weight of rank 1's shard
    # a real all-'tp' model against the simulated ladder
    assert results["can_fail/other_pattern"]["ratio"] > 10
    for rank in (0, 1):  # waited at once: issue and wait adjacent, nothing overlaps
        assert not any(overlaps(str(out / f"trace-sync{rank}.json")).values())


# Compiled (simulated and real TP): tests/model/test_compile.py's VARIANTS hold the ladder.


def test_train_fsdp_x_real_tp_matches_one_process(tmp_path, char_data):
    """train.py, ladder blocks with dropout 0.1: dp 2 (FSDP2, a block per unit: a ladder block's
    pending outputs leave its forward, so FSDP must see them) x real tp 2 logs one simulated
    process's losses (fp32, measured ~1e-7 relative, tolerance 1e-5); without dropout the losses
    differ, so the comparison can fail."""
    common = ["config/train_shakespeare_char_spd.py", "--max_iters=3", "--lr_decay_iters=3",
              "--eval_interval=3", "--eval_iters=2", "--gradient_accumulation_steps=2",
              "--block_types=ladder", "--dropout=0.1"]
    one, fsdp = tmp_path / "one", tmp_path / "fsdp"
    train(one, char_data, *common)
    train(fsdp, char_data, *common, "--data_parallel=fsdp", "--tp_mode=real", nproc=4)
    assert_same_losses(losses(one), losses(fsdp), 1e-5, "fsdp x real tp")
    train(tmp_path / "nodrop", char_data, *common, "--dropout=0.0")
    assert differs(losses(one), losses(tmp_path / "nodrop"), 1e-5)
