"""Pipeline parallelism (tpcomm/parallel/pipeline.py) against one process: tests/workers/pp_worker.py under
torchrun (gloo, CPU), one launch per world size (2: pp2; 4: pp4, pp2 x tp2 real, pp2 x dp2; 8: pp2 x dp2 x
tp2), every check of a world in that launch; the bubble replay on hand-checked timelines; the layout
validation; the demo and the benchmark (tpcomm/bench/pipeline_demo.py)."""

import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import (TORCHRUN, assert_same, differs, losses, one_line_error, run_script, shared_launch,
                      train, val_losses)
from tpcomm.errors import ConfigError
from tpcomm import ROOT
from tpcomm.parallel.pipeline_config import stage_layers, validate_pp_layout
from tpcomm.parallel.pipeline_timeline import bubble_fraction, format_timeline, replay, theoretical_bubble
from pp_worker import CAN_FAIL, CLIP, M, MB, MODELS, N_EMBD, STEPS, T, TP_SIZE, VIRTUAL, plan

# docs/model.md, plus 1 when the model ends desynced
FWD_ALLREDUCES = {"tp": 2, "spd": 1, "parallel": 0, "ladder": 2}


def expected_bwd_allreduces(kinds):
    """The f's of a pattern (each one backward all-reduce): a block reads a synced input through
    f (tp and ladder: once per module; spd and parallel: once, fanning the stream out), a
    desynced one (after 'parallel') from the shard streams, except that a tp block's MLP always
    reads the synced stream through f."""
    n, synced = 0, True
    for kind in kinds:
        n += {"tp": 1 + synced, "ladder": 2 * synced, "spd": synced, "parallel": synced}[kind]
        synced = kind != "parallel"
    return n


def expected_stream(kinds, layer):
    """What crosses the cut after `layer` (tpcomm.parallel.pipeline.cut_stream, from the block types): the
    pair (xbar, r) after 'parallel', (u, x) between two ladder blocks, else xbar (GPT: x)."""
    if kinds is not None and kinds[layer] == "parallel":
        return "xbar, r"
    if kinds is not None and kinds[layer] == kinds[layer + 1] == "ladder":
        return "u, x"
    return "xbar"


# tests/workers/pp_worker.py in the shared launches of 2, 4 and 8 processes (conftest.shared_launch)
SHARED_LAUNCHES = {"results": {n: (n, ["tests/workers/pp_worker.py", "{dir}/results.json"])
                               for n in (2, 4, 8)}}


@pytest.fixture(scope="module", params=[2, 4, 8], ids=["2procs", "4procs", "8procs"])
def results(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)["results"]


def parse(key):
    """'pp2_dp1_tp2/float64/desync_cut/1f1b' -> (pp, dp, tp), dtype, kind, schedule."""
    layout, dtype, kind, schedule = key.split("/")
    pp, dp, tp = (int(x[2:]) for x in layout.split("_"))
    return (pp, dp, tp), dtype, kind, schedule


def comparisons(results):
    return {k: v for k, v in results.items() if "/float" in k}


def test_layouts_and_patterns_were_all_run(results):
    keys = comparisons(results)
    layouts = {parse(k)[0] for k in keys}
    assert layouts in ({(2, 1, 1)}, {(4, 1, 1), (2, 1, 2), (2, 2, 1)}, {(2, 2, 2)}), layouts
    for layout in layouts:
        ran = {(parse(k)[1], *parse(k)[2:]) for k in keys if parse(k)[0] == layout}
        assert ran == {(dt, kd, s) for dt, kinds, schedules, _, _ in plan(*layout) for kd in kinds
                       for s in schedules}
    if (2, 1, 1) in layouts or (4, 1, 1) in layouts:  # every schedule on GPT and both patterns
        assert {parse(k)[2:] for k in keys} == {(kd, s) for kd in MODELS for s in VIRTUAL}


def test_pp_equals_one_process(results):
    """Loss, every gradient (step 1), losses, gradient norms, weights and AdamW moments after STEPS steps with
    clipping, at the worker's stated tolerances (float64 1e-9 / 1e-8; float32 losses and norms 1e-4)."""
    for key, res in comparisons(results).items():
        assert res["ratio"] <= 1.0, (key, json.dumps(res)[:2000])
        assert res["groups_equal"], key  # GPT's optimizer parameter indices
        pp_losses, _ = res["losses"]["values"]
        pp_norms, _ = res["norms"]["values"]
        assert len(pp_losses) == STEPS
        assert min(pp_norms) > CLIP, key  # clipping was active in every step, so it was compared too


def test_boundary_bytes_and_tp_allreduces(results):
    """Per micro-batch and rank: xbar (MB, T, C) crosses a synced cut, xbar and this rank's L shard streams (L
    = tp_size simulated, 1 real) a desynced one, u and x (2 x (MB, T, C)) a cut between two ladder blocks; the
    same bytes come back as gradients. Measured at the p2p ops. The tp all-reduces of the whole model summed
    over the stages; a GPT's are 0 (reported, not absent)."""
    for key, res in comparisons(results).items():
        (pp, dp, tp), dtype, kind, schedule = parse(key)
        size = MB * T * N_EMBD * (8 if dtype == "float64" else 4)
        local_shards = TP_SIZE if tp == 1 else 1
        cuts = [end - 1 for _, end in res["layers"][:-1]]  # the layer before each cut
        assert len(res["boundaries"]) == pp * VIRTUAL[schedule] - 1
        for cut, layer in zip(res["boundaries"], cuts):
            stream = expected_stream(MODELS[kind], layer)
            assert cut["stream"] == stream, (key, cut)
            tensors = {"xbar": 1, "xbar, r": 1 + local_shards, "u, x": 2}[stream]
            assert cut["fwd_bytes"] == cut["bwd_bytes"] == size * tensors, (key, cut)
        kinds = MODELS[kind]
        fwd = 0 if kinds is None else sum(FWD_ALLREDUCES[b] for b in kinds) + (kinds[-1] == "parallel")
        assert res["tp_fwd_allreduces"] == fwd, key
        assert res["tp_bwd_allreduces"] == (0 if kinds is None else expected_bwd_allreduces(kinds)), key


def test_some_cuts_are_desynced(results):
    """The desync_cut pattern's boundaries carry the pair (not vacuous)."""
    desynced = [c for k, v in comparisons(results).items() if "desync_cut" in k for c in v["boundaries"]]
    assert any(c["stream"] == "xbar, r" for c in desynced)


def test_ladder_cuts_carry_their_pending_outputs(results):
    """Where the ladder patterns ran (pp 2, alone and x tp 2 real): every cut of 'all_ladder'
    carries (u, x); every cut of 'ladder_cuts' follows a ladder block into another type and carries
    xbar (the pending outputs added)."""
    ran = {k: v for k, v in comparisons(results).items() if parse(k)[2] in ("all_ladder", "ladder_cuts")}
    if {parse(k)[0] for k in comparisons(results)} == {(2, 2, 2)}:
        assert not ran
        return
    assert {parse(k)[2] for k in ran} == {"all_ladder", "ladder_cuts"}
    for key, res in ran.items():
        kinds = MODELS[parse(key)[2]]
        assert all(kinds[end - 1] == "ladder" for _, end in res["layers"][:-1]), key
        want = "u, x" if parse(key)[2] == "all_ladder" else "xbar"
        assert res["boundaries"] and all(c["stream"] == want for c in res["boundaries"]), (key,
                                                                                           res["boundaries"])


def test_measured_bubble_equals_theory(results):
    """The recorded timelines of torch's schedules, replayed with one slot per action: GPipe and 1F1B give
    (p-1)/(m+p-1), interleaved 1F1B with v = 2 gives (p-1)/(v m+p-1). Exact up to float rounding (1e-12)."""
    for key, res in comparisons(results).items():
        (pp, _, _), _, _, schedule = parse(key)
        assert res["theory"] == pytest.approx(theoretical_bubble(pp, M, VIRTUAL[schedule]), abs=1e-15)
        assert res["bubble"] == pytest.approx(res["theory"], abs=1e-12), key


def test_comparisons_can_fail(results):
    """Each comparison run again with one thing broken: it must fail by far (ratio > 10)."""
    for (pp, dp, tp) in {parse(k)[0] for k in comparisons(results)}:
        layout = f"pp{pp}_dp{dp}_tp{tp}"
        expected = [b for *_, broken in plan(pp, dp, tp) for b in broken]
        # every layout: the pp stages are compared
        assert expected and "perturbed_last_stage" in expected, layout
        assert {k.split("/")[-1] for k in results if k.startswith(f"{layout}/can_fail/")} == set(expected)
        for label in expected:
            res = results[f"{layout}/can_fail/{label}"]
            assert res["ratio"] > 10, (layout, label, res)
        # the forward is the same; only the tied weight's gradient
        if f"{layout}/can_fail/no_tied_sum" in results:
            res = results[f"{layout}/can_fail/no_tied_sum"]
            assert res["grads"]["where"] in ("transformer.wte.weight", "lm_head.weight"), res["grads"]
            assert res["losses"]["values"][0][0] == pytest.approx(res["losses"]["values"][1][0], rel=1e-12)
        if f"{layout}/can_fail/no_tp_grad_sync" in results:
            assert results[f"{layout}/can_fail/no_tp_grad_sync"]["grads"]["ratio"] > 10
    every = {k.split("/")[-1] for k in results if "/can_fail/" in k}
    assert every <= set(CAN_FAIL)


def test_resume_from_gpt_layout_state(results):
    """GPT-layout weights and optimizer state gathered after 2 steps, loaded into a freshly initialised
    pipeline: its 3rd step equals the uninterrupted one process's (float64, 1e-8)."""
    resumed = {k: v for k, v in results.items() if k.endswith("/resume")}
    if {parse(k)[0] for k in comparisons(results)} == {(2, 2, 2)}:
        assert not resumed
        return
    assert resumed
    for key, res in resumed.items():
        assert res["ratio"] <= 1.0, (key, res)


# ---------- the bubble, by hand ----------

def gpipe(p, m):
    return {r: [("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)] for r in range(p)}


def test_replay_of_a_hand_checked_gpipe_timeline():
    """p = 2, m = 2, one slot per action:
        pp0  F0 F1  .  . B0 B1      rank 1's B0 ends at slot 4, so rank 0's B0 runs in slot 4
        pp1   . F0 F1 B0 B1  .
    6 slots x 2 ranks, 8 busy: bubble 4/12 = 1/3 = (p-1)/(m+p-1)."""
    slots, makespan = replay(gpipe(2, 2))
    assert makespan == 6
    assert [s for s, _ in slots[0]] == [0, 1, 4, 5] and [s for s, _ in slots[1]] == [1, 2, 3, 4]
    assert bubble_fraction(gpipe(2, 2)) == pytest.approx(1 / 3, abs=1e-15)
    assert format_timeline(gpipe(2, 2), 2).splitlines() == ["pp0  F0 F1  .  . B0 B1", "pp1   . F0 F1 B0 B1  "
                                                            "."]
    for p, m in ((4, 8), (3, 5), (1, 4)):
        assert bubble_fraction(gpipe(p, m)) == pytest.approx(theoretical_bubble(p, m), abs=1e-12)


def test_replay_sees_a_worse_order():
    """Rank 1 runs its backwards in the order B1, B0: rank 0's B0 waits until slot 5, B1 follows in 6.
    7 slots x 2 ranks, 8 busy: bubble 6/14 = 3/7 (the formula's 1/3 needs the FIFO order)."""
    actions = gpipe(2, 2)
    actions[1] = [("F", 1, 0), ("F", 1, 1), ("B", 1, 1), ("B", 1, 0)]
    slots, makespan = replay(actions)
    assert makespan == 7 and [s for s, _ in slots[0]] == [0, 1, 5, 6]
    assert bubble_fraction(actions) == pytest.approx(3 / 7, abs=1e-15)


def test_replay_rejects_an_impossible_order():
    actions = {0: [("F", 0, 0), ("B", 0, 0)], 1: [("B", 1, 0), ("F", 1, 0)]}  # a backward before its forward
    with pytest.raises(ValueError, match="never runs"):
        replay(actions)


def test_theoretical_bubble():
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11)
    assert theoretical_bubble(4, 8, 2) == pytest.approx(3 / 19)
    assert theoretical_bubble(1, 8) == 0


def test_stage_layers():
    assert stage_layers(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert stage_layers(7, 3) == [(0, 3), (3, 5), (5, 7)]  # the earlier stages take the remainder
    assert stage_layers(6, 2, [1, 5]) == [(0, 1), (1, 6)]


# ---------- layout validation: one line, before any process group ----------

GOOD = dict(world=8, pp_size=4, tp=2, n_layer=8, schedule="1f1b", n_microbatches=8)


@pytest.mark.parametrize("change, words", [
    (dict(world=6), ["world size (6)", "pp_size (4)", "tp (2)"]),
    (dict(world=8, tp=1, pp_size=8, n_layer=4), ["8 stages", "n_layer (4)"]),
    (dict(schedule="interleaved_1f1b", virtual_stages=3, n_layer=8), ["12 stages", "n_layer (8)"]),
    (dict(n_microbatches=3), ["n_microbatches (3)", "pp_size (4)"]),
    (dict(schedule="interleaved_1f1b", virtual_stages=2, n_microbatches=2),
     ["n_microbatches (2)", "pp_size (4)"]),
    (dict(schedule="interleaved_1f1b", virtual_stages=2, n_microbatches=9), ["n_microbatches (9)", "(2)"]),
    (dict(schedule="zero_bubble"), ["schedule", "'zero_bubble'"]),
    (dict(virtual_stages=2), ["virtual_stages (2)", "interleaved_1f1b"]),
    (dict(pp_layers=[2, 2, 2, 1]), ["pp_layers [2, 2, 2, 1]", "sums to 7", "n_layer (8)"]),
    (dict(pp_layers=[4, 4, 0, 0]), ["pp_layers [4, 4, 0, 0]", "empty stage"]),
    (dict(pp_layers=[4, 4]), ["pp_layers", "4 ints"]),
    (dict(batch_size=12), ["batch_size (12)", "n_microbatches (8)"]),
    (dict(pp_size=0), ["pp_size", "0"]),
])
def test_bad_layout_is_one_line_naming_keys_and_values(change, words):
    with pytest.raises(ConfigError) as e:
        validate_pp_layout(**dict(GOOD, **change))
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_good_layouts_pass():
    validate_pp_layout(**GOOD)
    validate_pp_layout(**dict(GOOD, schedule="gpipe", n_microbatches=1))  # GPipe runs any m
    validate_pp_layout(**dict(GOOD, schedule="interleaved_1f1b", virtual_stages=2, pp_layers=[1] * 8))
    validate_pp_layout(world=1, pp_size=1, tp=1, n_layer=2, schedule="1f1b", n_microbatches=1, batch_size=4)


def test_config_checks_leave_torchs_pipelining_unimported():
    """train.py's and bench.py's config checks (a pp_size=1 layout included) do not import
    torch.distributed.pipelining (it imports torch._dynamo: seconds at every start, a refused
    run's most); the probe sees the stages' module import it. A fresh interpreter each: this
    process has imported it already."""
    probe = ("import sys; import tpcomm.train.train_config, tpcomm.bench.bench_config; {}; "
             "print('torch.distributed.pipelining' in sys.modules)")
    check = ("from tpcomm.parallel.pipeline_config import validate_pp_layout; validate_pp_layout(world=1, "
             "pp_size=1, tp=1, n_layer=2, schedule='1f1b', n_microbatches=1)")
    # the second: can fail
    for extra, imported in ((check, "False"), ("import tpcomm.parallel.pipeline", "True")):
        r = subprocess.run([sys.executable, "-c", probe.format(extra)], capture_output=True, text=True,
                           cwd=ROOT)
        assert r.returncode == 0 and r.stdout.split() == [imported], r.stdout + r.stderr


def test_torch_without_output_grads_is_refused(monkeypatch):
    """torch < 2.13 (its PipelineStage takes no output_grads: 2.11 on the H100 of docs/gpu.md) is refused at
    validation for pp > 1, in one line naming pp_size and the torch version; pp_size=1 still passes."""
    import tpcomm.parallel.pipeline_config as pipeline_config
    monkeypatch.setattr(pipeline_config, "stage_takes_output_grads", lambda: False)
    with pytest.raises(ConfigError) as e:
        validate_pp_layout(**GOOD)
    assert "\n" not in str(e.value) and "pp_size=4" in str(e.value) and torch.__version__ in str(e.value)
    validate_pp_layout(world=1, pp_size=1, tp=1, n_layer=2, schedule="1f1b", n_microbatches=1, batch_size=4)


def test_bad_launch_outside_torchrun():
    """World 1 cannot hold pp 4 x tp 2: one line, exit 2, no traceback."""
    r = run_script("-m", "tpcomm.bench.pipeline_demo", "--pp_size=4", "--tp_size=2", timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "world size (1)" in lines[0] and "pp_size (4)" in lines[0], lines[0]


def test_demo_outside_torchrun_is_one_line():
    """A layout one process could hold (pp 1, simulated tp) still needs torchrun's process group: one line,
    exit 2 (it was a traceback from dist.get_world_size)."""
    r = run_script("-m", "tpcomm.bench.pipeline_demo", "--pp_size=1", "--tp_mode=simulated", timeout=60)
    assert "runs under torchrun" in one_line_error(r)


def test_bad_launch_one_rank_exits_by_itself():
    """One rank of a 6-process job asked for pp 4 x tp 2: the check runs before init_process_group,
    so it exits 2 at once; had it reached the rendezvous it would wait for ranks that never come and
    the timeout would fail it."""
    env = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="6", LOCAL_WORLD_SIZE="6", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29583")
    r = run_script("-m", "tpcomm.bench.pipeline_demo", "--pp_size=4", "--tp_size=2", "--schedule=1f1b",
                   env=env, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "world size (6)" in lines[0] and "not divisible by pp_size x tp (8)" in lines[0], lines[0]


# ---------- the demo ----------

def test_demo_prints_timeline_and_bubble():
    """pp 2 x tp 2 (real), interleaved 1F1B with 2 virtual stages: the timeline of each pp rank, its sends and
    receives, and the measured bubble equal to (p-1)/(v m+p-1) = 1/(2*4+1)."""
    r = run_script(*TORCHRUN, "--nproc_per_node=4", "-m", "tpcomm.bench.pipeline_demo", "--tp_size=2",
                   "--pp_size=2", "--schedule=interleaved_1f1b", "--virtual_stages=2", "--n_microbatches=4",
                   "--batch_size=8", "--n_layer=4", "--block_types=['spd','parallel']*2", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    out = r.stdout
    assert re.search(r"^pp0 +F0\.0 F1\.0", out, re.M) and re.search(r"^pp1 +\. +F0\.0", out, re.M), out
    assert re.search(r"^pp1: <a0\.0 F0\.0 ", out, re.M), out  # pp rank 1 receives micro-batch 0, then runs it
    m = re.search(r"bubble: measured (\S+) .* = (\S+) \(p=2, m=4, v=2\)", out)
    assert m and float(m.group(1)) == pytest.approx(1 / 9, abs=1e-4) == float(m.group(2)), out
    assert "stage 0->1: xbar     forward 4096 B, backward 4096 B" in out, out  # after spd: (2, 16, 32) x 4 B
    # after parallel: and (1, 2, 16, 32)
    assert "stage 1->2: xbar, r  forward 8192 B, backward 8192 B" in out, out
    assert "tp all-reduces per micro-batch (whole model): forward 3, backward 3" in out, out


def test_demo_runs_ladder_patterns():
    """The demo with ladder blocks (pp 2, tp 2 simulated, 1F1B): a cut between two ladder blocks carries (u,
    x), two (2, 16, 32) fp32 tensors each way; one into a 'tp' block carries xbar alone. The losses equal the
    demo without pp (one stage, GPipe), to 1e-4 (fp32 printed to 4 decimals)."""
    def demo(*args):
        r = run_script(*TORCHRUN, f"--nproc_per_node={2 if '--pp_size=2' in args else 1}", "-m",
                       "tpcomm.bench.pipeline_demo", "--tp_mode=simulated", "--n_microbatches=4",
                       "--batch_size=8", "--n_layer=4", *args, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr[-5000:]
        return r.stdout, [float(x) for x in re.findall(r"^step \d+: loss (\S+)", r.stdout, re.M)]

    for blocks, line in (("['ladder']*4", "stage 0->1: u, x     forward 8192 B, backward 8192 B"),
                         ("['tp','ladder','tp','ladder']", "stage 0->1: xbar     forward 4096 B, backward "
                          "4096 B")):
        out, losses = demo("--pp_size=2", "--schedule=1f1b", f"--block_types={blocks}")
        assert line in out, out
        _, one = demo("--pp_size=1", "--schedule=gpipe", f"--block_types={blocks}")
        assert len(losses) == 2 and losses == pytest.approx(one, abs=1e-4), (losses, one)


def test_train_py_ladder_pp2_equals_one_process(tmp_path, char_data):
    """train.py with ladder blocks and pp 2 (1F1B, a cut between two ladder blocks, dropout on, clipping
    active) logs one process's training and evaluation losses (fp32, 1e-5 as
    tests/train/test_train_pipeline.py); the cut carries (u, x): 2 x 32 fp32 values a token, both ways, 512
    B/token. Can fail: another seed."""
    common = ["config/train_shakespeare_char_spd.py", "--n_layer=4",
              "--block_types=['tp','ladder','ladder','ladder']", "--gradient_accumulation_steps=4",
              "--grad_clip=0.1", "--eval_iters=5", "--dropout=0.1", "--max_iters=4", "--lr_decay_iters=4",
              "--eval_interval=2"]
    train(tmp_path / "one", char_data, *common)
    r = train(tmp_path / "pp", char_data, *common, "--pp_size=2", "--pp_schedule=1f1b", nproc=2)
    assert "pp 512 B/token" in r.stdout, r.stdout
    a = losses(tmp_path / "one")
    assert sorted(a) == list(range(5)) and abs(a[4] - a[0]) > 1e-2  # it trained
    assert_same(a, losses(tmp_path / "pp"), 1e-5, "ladder pp2")
    assert_same(val_losses(tmp_path / "one"), val_losses(tmp_path / "pp"), 1e-5, "ladder pp2")
    train(tmp_path / "seed", char_data, *common, "--seed=7")
    assert differs(a, losses(tmp_path / "seed"), 1e-5)


# ---------- bench.py --mode=pipeline ----------

def test_bench_pipeline_bubble_and_activation_memory():
    """pp 2, GPipe and 1F1B at m = 2 and 4: the recorded bubble is (p-1)/(m+p-1); GPipe's first stage holds
    the activations of all m micro-batches (twice the bytes at m = 4), 1F1B's at most p = 2 whatever m."""
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "bench.py", "--mode=pipeline", "--pp_size=2",
                   "--device=cpu", "--n_layer=4", "--n_head=4", "--n_embd=32", "--block_size=16",
                   "--batch_size=2", "--vocab_size=64", "--iters=1", "--warmup=1", "--microbatches=[2,4]",
                   "--model_type=distributed_gpt", "--tp_size=2", "--block_types=['spd','parallel']*2",
                   timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rows = {}
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 10 and cells[0] in ("gpipe", "1f1b"):
            rows[cells[0], int(cells[3])] = dict(bubble=float(cells[6]), theory=float(cells[7]),
                                                 peaks=[float(x) for x in cells[8].split(" / ")],
                                                 pp_bytes=int(cells[9].replace(",", "")))
    assert sorted(rows) == [("1f1b", 2), ("1f1b", 4), ("gpipe", 2), ("gpipe", 4)], r.stdout
    for row in rows.values():
        # (xbar, r of 2 shards), 2 ways
        assert row["bubble"] == row["theory"] and row["pp_bytes"] == 2 * 3 * 32 * 4
    first = {k: row["peaks"][0] for k, row in rows.items()}
    assert first["gpipe", 4] == pytest.approx(2 * first["gpipe", 2], rel=0.02)
    assert first["1f1b", 4] == pytest.approx(first["1f1b", 2], rel=0.02) == pytest.approx(first["gpipe", 2],
                                                                                          rel=0.02)
    # the comparison can fail: the schedules differ at m > p
    assert first["gpipe", 4] > 1.5 * first["1f1b", 4]
    assert rows["1f1b", 4]["peaks"][1] < first["1f1b", 4]  # the last stage holds one micro-batch in flight


def test_bench_pipeline_bad_input():
    r = run_script("bench.py", "--mode=pipeline", "--pp_size=2", "--device=cpu", timeout=60)
    assert "torchrun" in one_line_error(r)
    r = run_script("bench.py", "--mode=pipeline", "--pp_size=0", "--device=cpu", timeout=60)
    assert "pp_size must be >= 1, got 0" in one_line_error(r)
    env = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29589")
    r = run_script("bench.py", "--mode=pipeline", "--pp_size=2", "--device=cpu", "--microbatches=[1]",
                   "--pp_schedules=['1f1b']", env=env, timeout=60)
    line = one_line_error(r)
    assert "microbatches (1)" in line and "pp_size (2)" in line, line
