"""A trace of every collective (comm_trace.py, bench.py --trace): each collective f and g run is one
labelled span in a Chrome trace, and the spans of each step are exactly the collectives the model counts
(comm_report), in the order and at the sites docs/model.md gives, simulated and under real TP (torchrun,
gloo); the timeline plot's command."""

import contextlib
import io
import json

import pytest
import torch
from conftest import TINY as TRAIN_TINY
from conftest import TORCHRUN, metrics, one_line_error, run_script, train

import bench
from tpcomm.bench import trace as comm_trace
from tensor_parallel_model import DistributedGPT
from tpcomm.model.options import TPConfig

SIZES = {"n_layer": 4, "n_head": 4, "n_embd": 32, "block_size": 16, "vocab_size": 64}
BATCH, STEPS = 2, 2
TINY = ["--device=cpu", "--dtype=float32", *(f"--{k}={v}" for k, v in SIZES.items()), f"--batch_size={BATCH}",
        "--iters=1", "--warmup=0", "--compare=False", f"--trace_steps={STEPS}"]
PATTERNS = {"tp": ["tp"] * 4, "spd": ["spd"] * 4, "parallel": ["parallel"] * 4,
            # a desynced stream into 'tp' and 'spd', ends desynced
            "mix": ["parallel", "tp", "spd", "parallel"]}
STREAM_BYTES = BATCH * SIZES["block_size"] * SIZES["n_embd"] * 4  # one all-reduce of the (N, C) stream, fp32


def expected_sites(pattern):
    """docs/model.md: (layer, block, site) of the forward all-reduces (g) in order, and of the backward ones
    (f's backward) in the order backward runs them."""
    fwd, f_sites, synced = [], [], True
    for i, kind in enumerate(pattern):
        if synced:  # a synced stream enters the shards through f
            f_sites.append((i, kind, "attn"))
        if kind == "tp":
            fwd.append((i, kind, "attn"))
            f_sites.append((i, kind, "mlp"))
            fwd.append((i, kind, "mlp"))
        elif kind == "spd":
            fwd.append((i, kind, "mlp"))
        synced = kind != "parallel"
    if not synced:
        fwd.append((None, None, "final_sync"))
    return fwd, f_sites[::-1]


def measured(pattern, **kw):
    """comm_report of one forward+backward pass of the same model, as train.py and bench.py count it."""
    model = DistributedGPT(TPConfig(**SIZES, tp_size=2, block_types=pattern, bias=False, **kw))
    return model.comm_per_forward(torch.randint(SIZES["vocab_size"], (BATCH, SIZES["block_size"])))


def check_trace(path, pattern, report, *, mode, steps=STEPS):
    """Every step of the trace holds the model's collectives: as many as comm_report counts, forward before
    backward, at docs/model.md's sites, each of the stream's size. Returns the events."""
    events = comm_trace.collective_events(path)
    assert len(comm_trace.step_spans(path)) == steps
    assert all(ev["step"] is not None for ev in events)  # nothing outside the traced steps
    fwd_sites, bwd_sites = expected_sites(pattern)
    for i in range(steps):
        mine = [ev for ev in events if ev["step"] == i]
        stream = [ev for ev in mine if ev["category"] == "stream"]
        fwd = [ev for ev in stream if ev["direction"] == "fwd"]
        bwd = [ev for ev in stream if ev["direction"] == "bwd"]
        assert len(fwd) == report["fwd_allreduces"] and len(bwd) == report["bwd_allreduces"], (i, report)
        assert [(ev["layer"], ev["block"], ev["site"]) for ev in fwd] == fwd_sites
        assert [(ev["layer"], ev["block"], ev["site"]) for ev in bwd] == bwd_sites
        assert {ev["op"] for ev in fwd} <= {"g"} and {ev["op"] for ev in bwd} <= {"f"}
        assert all(ev["bytes"] == STREAM_BYTES and ev["mode"] == mode for ev in stream)
        assert all(a["ts"] + a["dur"] <= b["ts"] for a in fwd for b in bwd)  # the forward pass, then backward
        c = comm_trace.tally_events(mine)
        assert (c["fwd"], c["bwd"], c["grad_sync"]) == (report["fwd_allreduces"], report["bwd_allreduces"],
                                                        report["grad_sync_allreduces"])
    return events


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """bench.py --trace on the four patterns in one simulated run: {pattern name: trace
    file}, and what it printed."""
    d = tmp_path_factory.mktemp("trace_sim")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main([*TINY, "--model_type=distributed_gpt", "--tp_size=2",
                    f"--patterns={list(PATTERNS.values())}", f"--trace={d / 'trace.json'}"])
    # one file per pattern, named by its forward all-reduces (spd and mix both have 4: the second gets -2)
    files = dict(zip(PATTERNS, ["trace-8comm.json", "trace-4comm.json", "trace-1comm.json",
                                "trace-4comm-2.json"]))
    return {name: str(d / f) for name, f in files.items()}, out.getvalue()


@pytest.mark.parametrize("name", list(PATTERNS))
def test_simulated_trace_holds_the_counted_collectives(simulated, name):
    files, printed = simulated
    with open(files[name]) as f:
        assert isinstance(json.load(f)["traceEvents"], list)
    report = measured(PATTERNS[name])
    check_trace(files[name], PATTERNS[name], report, mode="sim")
    line = next(ln for ln in printed.splitlines() if ln.startswith("trace ") and files[name] in ln)
    n = report["fwd_allreduces"]
    assert f"{n} fwd + {n} bwd all-reduces = {2 * n} collective events per step" in line, line


def test_the_comparison_can_fail(simulated, tmp_path):
    """Another pattern's counts, or a trace missing one collective, fail check_trace."""
    files, _ = simulated
    with pytest.raises(AssertionError):
        check_trace(files["tp"], PATTERNS["spd"], measured(PATTERNS["spd"]), mode="sim")
    with pytest.raises(AssertionError):
        # same counts, other sites
        check_trace(files["mix"], PATTERNS["spd"], measured(PATTERNS["spd"]), mode="sim")
    with pytest.raises(AssertionError):
        check_trace(files["tp"], PATTERNS["tp"], measured(PATTERNS["tp"]), mode="real")
    with open(files["spd"]) as f:
        trace = json.load(f)
    first = next(i for i, e in enumerate(trace["traceEvents"]) if e.get("name", "").startswith("allreduce "))
    del trace["traceEvents"][first]
    with pytest.raises(AssertionError):
        check_trace(trace, PATTERNS["spd"], measured(PATTERNS["spd"]), mode="sim")


def test_nothing_is_labelled_without_a_profiler(monkeypatch):
    """No profiler: no span and no label is made (the hot path reads one flag); with
    one, every collective is."""
    calls = []
    monkeypatch.setattr(torch.profiler, "record_function", lambda name: calls.append(name) or
                        contextlib.nullcontext())
    model = DistributedGPT(TPConfig(**SIZES, tp_size=2, block_types=PATTERNS["mix"]))
    idx = torch.randint(SIZES["vocab_size"], (BATCH, SIZES["block_size"]))
    model(idx, idx)[1].backward()
    assert calls == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        model(idx, idx)[1].backward()
    assert len(calls) == 8 and calls[0] == f"allreduce g fwd L1 tp attn {STREAM_BYTES}B sim", calls


def test_loss_parallel_collectives_are_traced(tmp_path):
    path = tmp_path / "vocab.json"
    bench.main([*TINY, "--model_type=distributed_gpt", "--tp_size=2", "--block_types=['spd']*4",
                "--loss_parallel=True", f"--trace={path}"])
    report = measured(PATTERNS["spd"], loss_parallel=True)
    events = check_trace(str(path), PATTERNS["spd"], report, mode="sim")
    vocab = [ev for ev in events if ev["category"] == "vocab" and ev["step"] == 0]
    assert len(vocab) == report["vocab_allreduces"] == 5
    tokens = BATCH * SIZES["block_size"]
    assert [(ev["site"], ev["op"], ev["direction"], ev["bytes"]) for ev in vocab] == [
        ("vocab_embed", "g", "fwd", STREAM_BYTES), ("vocab_loss", "max", "fwd", tokens * 4),
        ("vocab_loss", "sum", "fwd", tokens * 4), ("vocab_loss", "sum", "fwd", tokens * 4),
        ("vocab_head", "f", "bwd", STREAM_BYTES)]


def test_gpt_trace_has_compute_and_no_collectives(tmp_path, capsys):
    path = tmp_path / "gpt.json"
    bench.main([*TINY, f"--trace={path}"])
    said = f"trace gpt: {path}, {STEPS} step(s): 0 fwd + 0 bwd all-reduces = 0 collective events per step"
    assert said in capsys.readouterr().out
    assert comm_trace.collective_events(str(path)) == [] and len(comm_trace.step_spans(str(path))) == STEPS
    _, _, compute, _ = comm_trace.step_timeline(str(path))
    assert compute


def test_real_tp_trace_per_rank(tmp_path):
    """Real TP, 2 gloo processes: each rank's file holds the collectives that rank counted, plus the per-step
    gradient sync of the block-replicated parameters; each of our spans holds exactly one gloo all-reduce."""
    patterns = {"tp": PATTERNS["tp"], "mix": PATTERNS["mix"]}
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "bench.py", *TINY, "--model_type=distributed_gpt",
                   "--tp_size=2", "--tp_mode=real", f"--patterns={list(patterns.values())}",
                   f"--trace={tmp_path / 'real.json'}", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    printed = [ln for ln in r.stdout.splitlines() if "all-reduces fwd" in ln]
    for (name, pattern), n, line in zip(patterns.items(), (8, 4), printed):
        assert f"all-reduces fwd {n} bwd {n} " in line, line  # the real model's own comm_report
        report = dict(measured(pattern), grad_sync_allreduces=1)
        for rank_tag in ("", ".rank1"):
            path = str(tmp_path / f"real-{n}comm{rank_tag}.json")
            events = check_trace(path, pattern, report, mode="real")
            grad = [ev for ev in events if ev["category"] == "grad"]
            assert [(ev["site"], ev["step"]) for ev in grad] == [("grad_sync", 0), ("grad_sync", 1)]
            # ln_1, ln_2 weights
            assert all(ev["bytes"] == SIZES["n_layer"] * 2 * SIZES["n_embd"] * 4 for ev in grad)
            with open(path) as f:
                gloo = [e["ts"] for e in json.load(f)["traceEvents"] if e.get("name") == "gloo:all_reduce"]
            assert sorted(sum(ev["ts"] <= t <= ev["ts"] + ev["dur"] for t in gloo) for ev in events) == \
                [1] * len(events) and len(gloo) == len(events)


def test_plot_command(simulated, tmp_path):
    files, _ = simulated
    out = tmp_path / "timeline.png"
    r = run_script("-m", "tpcomm.bench.trace", "plot", str(out), files["tp"], files["parallel"],
                   "--labels=[\"['tp']*4, 8 syncs\", \"['parallel']*4, 1 sync\"]", "--title=simulated tp=2")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "Traceback" not in r.stderr
    # the plotted numbers beside it, their digest inside (report --check)
    from tpcomm.figures import command_figures, png

    data, _ = command_figures.load(str(out))
    assert png.png_digest(str(out)) == png.data_digest(data) and len(data["rows"]) == 2
    line = one_line_error(run_script("-m", "tpcomm.bench.trace", "plot", str(out),
                                     str(tmp_path / "missing.json")))
    assert "no trace file" in line and "missing.json" in line


def test_plot_bad_input_is_one_line(simulated, tmp_path, capsys):
    files, _ = simulated
    (tmp_path / "corrupt.json").write_text('{"traceEvents": [')
    (tmp_path / "other.json").write_text('{"events": []}')
    out = str(tmp_path / "x.png")
    cases = [
        (["plot", out, str(tmp_path / "corrupt.json")], "is not readable JSON"),
        (["plot", out, str(tmp_path / "other.json")], "is not a Chrome trace"),
        (["plot", out, files["tp"], "--labels=a,b"], "2 label(s) for 1 trace(s)"),
        (["plot", out, files["tp"], "--labels=[1]"], "--labels must be a,b or a list of strings"),
        (["plot", out, files["tp"], "--step=5"], f"has {STEPS} step(s); there is no step 5"),
        (["plot", str(tmp_path / "no" / "x.png"), files["tp"]], "does not exist"),
        (["plot", out], "usage:"),
        (["draw", out, files["tp"]], "usage:"),
    ]
    for argv, words in cases:
        with pytest.raises(SystemExit) as e:
            comm_trace.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, (argv, err)


@pytest.mark.parametrize("args, words", [
    (["--trace_steps=0"], "trace_steps must be an int >= 1, got 0"),
    (["--mode=decode", "--trace=t.json"], "trace profiles training steps: it needs mode='train'"),
    (["--trace=/no/such/folder/t.json"], "the folder '/no/such/folder' does not exist"),
    (["--trace=."], "trace must be a file path, got the directory '.'"),
])
def test_bench_bad_trace_options_are_one_line(capsys, args, words):
    with pytest.raises(SystemExit) as e:
        bench.main([*TINY, *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_trace_paths():
    assert bench.trace_paths("t.json", {"gpt": None}) == {"gpt": "t.json"}
    assert bench.trace_paths("d/t.json", {"a": 24, "b": 6, "c": 6}, rank=1) == {
        "a": "d/t-24comm.rank1.json", "b": "d/t-6comm.rank1.json", "c": "d/t-6comm-2.rank1.json"}
    assert bench.trace_paths("t.json.gz", {"a": 1}, rank=3) == {"a": "t.rank3.json.gz"}


def test_train_py_traces_one_step_with_the_logged_counts(tmp_path, char_data):
    """train.py --trace: step trace_iter is traced; its collectives are the counts train.py logs for that step
    (2 micro-batches: twice the per-pass counts). Under pp 2 each rank traces its own stages: together they
    make the whole model's counts."""
    common = ["config/train_shakespeare_char_spd.py", *TRAIN_TINY[1:], "--n_layer=4",
              "--block_types=['tp','spd','parallel','spd']", "--max_iters=3", "--eval_interval=3",
              "--gradient_accumulation_steps=2", "--trace_iter=2"]
    for name, extra, nproc in (("one", [], None), ("pp", ["--pp_size=2"], 2)):
        out = tmp_path / name
        r = train(out, char_data, *common, f"--trace={tmp_path / name}.json", *extra, nproc=nproc)
        assert f"trace of step 2: {tmp_path / name}.json" in r.stdout, r.stdout
        logged = next(rec for rec in metrics(out) if rec["iter"] == 2 and "loss" in rec)
        files = [tmp_path / f"{name}.json"] + ([tmp_path / f"{name}.rank1.json"] if nproc else [])
        counts = [comm_trace.per_step_counts(str(f)) for f in files]
        assert all(len(c) == 1 for c in counts)  # one traced step
        for key in ("fwd", "bwd"):
            assert sum(c[0][key] for c in counts) == 2 * logged[f"{key}_allreduces"] == 2 * 4, counts
