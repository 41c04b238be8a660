"""Real tensor parallelism across processes (torchrun, gloo, CPU) against the simulation: the model through
tests/workers/real_tp_worker.py (all its checks in one launch per world size), train.py end to end,
checkpoints moving between real and simulated runs at different tp_size, and bad launches."""

import json
import os
import re

import pytest

from conftest import ROOT, TINY, TORCHRUN, run_script, shared_launch
from real_tp_worker import CLIP, PATTERNS, STEPS, name

FWD_ALLREDUCES = {"tp": 2, "spd": 1, "parallel": 0}  # docs/model.md, plus 1 when the model ends desynced

# tests/workers/real_tp_worker.py, in the shared launches of 2 and 4 processes (conftest.shared_launch)
SHARED_LAUNCHES = {
    "tp_results": {n: (n, ["tests/workers/real_tp_worker.py", "--dp=1", "{dir}/results.json"])
                   for n in (2, 4)},
    "dp2_tp2_results": {None: (4, ["tests/workers/real_tp_worker.py", "--dp=2", "{dir}/results.json"])},
}


def launched(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)["results"]


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def tp_results(request):
    """dp=1: the world is one model replica of tp ranks."""
    return launched(request)


@pytest.fixture(scope="module")
def dp2_tp2_results(request):
    return launched(request)


def assert_match(result):
    """ratio <= 1: torch.testing.assert_close passes at the worker's stated tolerance (see TOL there)."""
    assert result["ratio"] <= 1.0, json.dumps(result)


# ---------- the model, real vs simulated ----------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_logits_loss_and_gradients_match_simulation(tp_results, dtype, block_types):
    result = tp_results[f"fwd_bwd/{dtype}/{name(block_types)}"]
    assert_match(result)
    expected = sum(FWD_ALLREDUCES[b] for b in block_types) + (block_types[-1] == "parallel")
    assert result["fwd_allreduces"] == [expected, expected]  # [real, simulated], measured


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_optimizer_steps_match_simulation(tp_results, block_types):
    for dtype in ("float64", "float32"):
        result = tp_results[f"steps/{dtype}/{name(block_types)}"]
        assert_match(result)
        real_losses, _ = result["losses"]["values"]
        real_norms, _ = result["norms"]["values"]
        assert len(real_losses) == STEPS
        assert min(real_norms) > CLIP  # clipping was active in every step, so it was compared too


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_dropout_masks_match_simulation(tp_results, block_types):
    """Dropout 0.2 with keyed masks (each tp shard its own stream): logits, loss
    and gradients as simulated."""
    for dtype in ("float32", "float64"):
        assert_match(tp_results[f"dropout/{dtype}/{name(block_types)}"])


@pytest.mark.parametrize("block_types", PATTERNS, ids=[name(p) for p in PATTERNS])
def test_generation_matches_single_process(tp_results, block_types):
    """Greedy and seeded sampling, with and without the KV cache: the simulated
    model's tokens, on every rank."""
    assert tp_results[f"generate/{name(block_types)}"]["ok"]


@pytest.mark.parametrize("block_types", [PATTERNS[0], PATTERNS[3]],
                         ids=[name(PATTERNS[0]), name(PATTERNS[3])])
def test_loss_parallel_matches_simulation(tp_results, block_types):
    """Vocabulary-sharded wte/lm_head and the vocab-parallel cross-entropy under real TP, against the plain
    simulated model (fp64): logits, loss, every gradient; generation gives the same tokens."""
    assert_match(tp_results[f"loss_parallel/{name(block_types)}"])
    assert tp_results[f"loss_parallel/generate/{name(block_types)}"]["ok"]


def test_comparisons_can_fail(tp_results):
    assert tp_results["can_fail/loss_parallel_perturbed_row"]["ratio"] > 10
    # unkeyed dropout: every rank draws the same masks (the old behaviour), which is not the simulated model
    assert tp_results["can_fail/dropout_unkeyed"]["ratio"] > 10
    # one weight of the last shard changed by 0.1, on that rank only
    assert tp_results["can_fail/perturbed_shard"]["ratio"] > 10
    # a model of another pattern (last block 'tp' instead of 'spd')
    assert tp_results["can_fail/other_pattern"]["ratio"] > 10
    # without summing the block-replicated parameters' gradients over tp, the forward is the same, gradients
    # not
    no_sync = tp_results["can_fail/no_grad_sync"]
    assert no_sync["logits"]["ratio"] <= 1 and no_sync["grads"]["ratio"] > 10


def test_fp16_overflow_on_one_rank_skips_the_step_on_all(tp_results):
    """train.py's fp16 scaler shares the found-inf flag over the tp group: no rank
    steps, all back off alike."""
    assert tp_results["scaler/inf_on_one_rank_skips_all"]["ok"]
    assert tp_results["can_fail/plain_scaler"]["ok"]  # a per-rank GradScaler would step the other ranks


def test_gathered_state_dict_is_gpts(tp_results):
    assert tp_results["state/gpt_state_dict_exact"]["ok"]  # gather and slice move values, exactly
    for loss_parallel in (False, True):  # built on the meta device, each rank materialising its shards only
        assert tp_results[f"state/meta_init_exact/loss_parallel={loss_parallel}"]["ok"]
    counts = tp_results["state/num_params"]
    assert counts["real"] == counts["gpt"]  # each rank counts the whole model, not its shard


def test_dp2_x_tp2_matches_one_process(dp2_tp2_results):
    """4 processes, 2 replicas of 2 tp ranks (DDP over the dp group), each replica on its half of the global
    batch, against one simulated process on the whole batch."""
    results = dp2_tp2_results
    for block_types in (PATTERNS[0], PATTERNS[-1]):
        assert_match(results[f"dp_fwd_bwd/{name(block_types)}"])
        for dtype in ("float64", "float32"):
            assert_match(results[f"steps/{dtype}/{name(block_types)}"])
    assert results["can_fail/one_replica_rows"]["ratio"] > 10  # the data split is seen: not a vacuous match


# ---------- train.py end to end ----------

def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return list(map(json.loads, f))


def losses(out_dir):
    return {r["iter"]: r["loss"] for r in metrics(out_dir) if "loss" in r}


def train(out_dir, data, *extra, nproc=None):
    args = ["train.py", "config/train_shakespeare_char_spd.py", *TINY, f"--data_dir={data}",
            f"--out_dir={out_dir}", "--gradient_accumulation_steps=2", "--eval_interval=4",
            "--always_save_checkpoint=True", *extra]
    if nproc:
        args = [*TORCHRUN, f"--nproc_per_node={nproc}", *args]
    r = run_script(*args, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return r


def test_train_real_matches_simulated(tmp_path, char_data):
    """The Shakespeare-char spd config (tiny sizes, tp_size=2): real tp on 2 processes
    logs the simulated losses."""
    sim, real = tmp_path / "sim", tmp_path / "real"
    common = ["--max_iters=8", "--lr_decay_iters=8"]
    train(sim, char_data, *common)
    r = train(real, char_data, *common, "--tp_mode=real", nproc=2)
    assert "tp=2 real" in r.stdout
    a, b = losses(sim), losses(real)
    assert sorted(a) == sorted(b) == list(range(9))
    for it in a:  # fp32, the same sums in another order: measured ~1e-7 relative
        assert b[it] == pytest.approx(a[it], rel=1e-5), it
    assert abs(a[8] - a[0]) > 1e-2  # the runs trained, so the comparison could fail
    evals = [[r["val_loss"] for r in metrics(d) if "val_loss" in r] for d in (sim, real)]
    assert evals[1] == pytest.approx(evals[0], rel=1e-5)
    for rec_sim, rec_real in zip(*[[r for r in metrics(d) if "loss" in r] for d in (sim, real)]):
        assert rec_real["fwd_allreduces"] == rec_sim["fwd_allreduces"] == 2  # 2 spd blocks, measured
        assert rec_sim["comm_seconds"] == 0 < rec_real["comm_seconds"]  # real collectives ran, and only there
        # tokens/s per model replica: the global batch's tokens (2 x 4 x 32) over the step time, not x tp
        assert rec_real["tokens_per_s"] * rec_real["dt_ms"] / 1000 == pytest.approx(2 * 4 * 32)


def test_train_with_dropout_real_and_dp_split_match_one_process(tmp_path, char_data):
    """Dropout 0.2 (the Shakespeare configs' value): masks keyed by (seed, iteration, global micro-batch, tp
    shard), so real tp=2, and dp=2 x tp=2, log the losses of one simulated process."""
    common = ["--max_iters=6", "--lr_decay_iters=6", "--dropout=0.2"]
    sim, real, dp2 = tmp_path / "sim", tmp_path / "real", tmp_path / "dp2"
    train(sim, char_data, *common)
    train(real, char_data, *common, "--tp_mode=real", nproc=2)
    train(dp2, char_data, *common, "--tp_mode=real", nproc=4)
    a = losses(sim)
    for other in (real, dp2):
        b = losses(other)
        assert sorted(b) == sorted(a) == list(range(7))
        for it in a:  # fp32, the same sums in another order (and DDP's mean): measured ~1e-7 relative
            assert b[it] == pytest.approx(a[it], rel=1e-5), (other.name, it)
    nodrop = losses(train(tmp_path / "nodrop", char_data, *common[:2]) and tmp_path / "nodrop")
    assert abs(nodrop[3] - a[3]) > 1e-3  # dropout was active, so the masks were compared


def test_checkpoints_move_between_real_and_simulated(tmp_path, char_data):
    """Checkpoints are GPT-layout, so a run can go real tp=2 -> simulated tp_size=4 -> real dp=2 x tp=2
    and follow an uninterrupted one-shard run. All-'tp' blocks are GPT at every tp_size, so one
    trajectory is the reference."""
    tp_blocks = ["--block_types=tp", "--lr_decay_iters=12"]
    ref, part = tmp_path / "ref", tmp_path / "part"
    train(ref, char_data, *tp_blocks, "--max_iters=12", "--tp_size=1")
    train(part, char_data, *tp_blocks, "--max_iters=4", "--tp_mode=real", nproc=2)  # checkpoint at iter 4
    train(part, char_data, *tp_blocks, "--max_iters=8", "--init_from=resume", "--tp_size=4")
    r = train(part, char_data, *tp_blocks, "--max_iters=12", "--init_from=resume", "--tp_mode=real", nproc=4)
    assert "dp=2, tp=2 real" in r.stdout
    a, b = losses(ref), losses(part)  # the resumed runs append their records; the later ones win
    assert sorted(b) == list(range(13))
    # fp32, tp_size 1/2/4 sum in different orders: ~1e-7 relative; AdamW moments must carry over too
    for it in a:
        assert b[it] == pytest.approx(a[it], rel=1e-5), it
    assert abs(a[12] - a[0]) > 1e-2


def test_sample_real_matches_single_process(tmp_path, char_data):
    """sample.py under torchrun (tp_mode='real', the prompt as --prompt: torchrun takes --start for itself)
    prints the single-process samples: greedy (top_k=1) and seeded sampling, with and without the KV cache."""
    out = tmp_path / "run"
    train(out, char_data, "--max_iters=8", "--lr_decay_iters=8", "--block_types=['spd','parallel']")
    common = [f"--out_dir={out}", "--device=cpu", "--num_samples=2", "--max_new_tokens=40", "--prompt=def "]

    def samples(r):
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
        return r.stdout.split("vocabulary\n", 1)[-1]

    for extra in (["--top_k=1"], ["--temperature=1.0", "--top_k=10"], ["--top_k=10", "--kv_cache=False"]):
        one = samples(run_script("sample.py", *common, *extra))
        real = samples(run_script(*TORCHRUN, "--nproc_per_node=2", "sample.py", *common, "--tp_mode=real",
                                  *extra, timeout=120))
        assert real == one and one.count("---------------") == 2, (extra, one, real)
    cached = samples(run_script("sample.py", *common, "--top_k=10"))
    assert cached == one  # the last one: --kv_cache=False
    other = samples(run_script("sample.py", *common, "--top_k=10", "--seed=7"))
    assert other != cached  # the samples depend on the seed: the equalities above are not vacuous


# ---------- bench.py ----------

def test_bench_real_reports_collective_time():
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "bench.py", "--model_type=distributed_gpt", "--tp_size=2",
                   "--tp_mode=real", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32",
                   "--block_size=32", "--batch_size=4", "--vocab_size=65", "--iters=3", "--warmup=1",
                   "--patterns=['tp', 'parallel']", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    lines = [ln for ln in r.stdout.splitlines() if "ms/iter" in ln and not ln.startswith("|")]
    assert len(lines) == 2, r.stdout  # rank 0 reports, one line per pattern
    for line, kind, fwd in zip(lines, ("tp", "parallel"), (4, 1)):
        assert line.startswith(kind) and "tp=2 real" in line and f"all-reduces fwd {fwd} " in line, line
        assert re.search(r"collectives \d+\.\d+ ms/iter, exposed \d+\.\d+", line), line
    # the table: blocking all-reduces are exposed in full (in collectives == exposed)
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in r.stdout.splitlines() if ln.startswith("| `")]
    assert [row[0] for row in rows] == ["`tp`", "`parallel`"], r.stdout
    assert all(row[5] == row[6] and float(row[5]) > 0 for row in rows), rows


def test_bench_decode_real_reports_collective_time():
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "bench.py", "--model_type=distributed_gpt", "--tp_size=2",
                   "--tp_mode=real", "--device=cpu", "--n_layer=2", "--n_head=4", "--n_embd=32",
                   "--block_size=32", "--vocab_size=65", "--mode=decode", "--batch_sizes=[1, 2]",
                   "--new_tokens=4", "--patterns=['tp', 'parallel']", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in r.stdout.splitlines()
            if line.startswith("| `")]
    assert [(row[0], row[1], row[2]) for row in rows] == [("`tp`", "4 (0)", "1"), ("`tp`", "4 (0)", "2"),
                                                          ("`parallel`", "1 (0)", "1"), ("`parallel`", "1 "
                                                                                         "(0)", "2")]
    assert all(float(row[5]) > 0 for row in rows)  # real collectives ran during decoding
    assert all(row[5] == row[6] for row in rows)  # blocking all-reduces: exposed in full


# ---------- bad launches: one line, exit status 2, no traceback, no hang ----------

SPD_TINY = ["config/train_shakespeare_char_spd.py", *TINY]


@pytest.mark.parametrize("script, args, words", [
    ("train.py", ["--tp_mode=real"], ["tp_mode='real'", "torchrun"]),
    ("bench.py", ["--model_type=distributed_gpt", "--tp_size=2", "--tp_mode=real", "--device=cpu"],
     ["tp_mode='real'", "torchrun"]),
    ("train.py", ["--n_head=3", "--n_embd=33"], ["n_head (3)", "tp_size (2)"]),
])
def test_bad_launch_outside_torchrun(tmp_path, char_data, script, args, words):
    extra = [*SPD_TINY, f"--data_dir={char_data}",
             f"--out_dir={tmp_path / 'out'}"] if script == "train.py" else []
    r = run_script(script, *extra, *args, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script, world, args, words", [
    ("train.py", 3, ["--tp_mode=real"], ["world size (3)", "tp_size (2)"]),  # dp x tp != world size
    ("train.py", 2, ["--tp_mode=real", "--n_head=3", "--n_embd=33"], ["n_head (3)", "tp_size (2)"]),
    ("train.py", 2, ["--tp_mode=real", "--device=cpu", "--backend=nccl"], ["backend='nccl'", "'cpu'"]),
    ("bench.py", 4, ["--model_type=distributed_gpt", "--tp_size=2", "--tp_mode=real", "--device=cpu"],
     ["one model replica", "tp_size (2)"]),  # bench times dp=1 only
])
def test_bad_launch_one_rank_exits_by_itself(tmp_path, char_data, script, world, args, words):
    """One rank of a torchrun job, started alone with torchrun's environment: the check runs before
    init_process_group, so it exits 2 at once. Had it reached the rendezvous it would wait for ranks that
    never come, and the timeout would fail the test."""
    env = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29581")
    extra = [*SPD_TINY, f"--data_dir={char_data}",
             f"--out_dir={tmp_path / 'out'}"] if script == "train.py" else []
    r = run_script(script, *extra, *args, env=env, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_bad_launch_under_torchrun(tmp_path, char_data):
    """dp x tp != world size, launched for real: every rank fails its check (before
    init_process_group), torchrun exits non-zero without hanging and prints its own summary of the
    failed ranks; our lines carry no traceback."""
    r = run_script(*TORCHRUN, "--nproc_per_node=3", "train.py", *SPD_TINY, f"--data_dir={char_data}",
                   f"--out_dir={tmp_path / 'out'}", "--tp_mode=real", timeout=120)
    assert r.returncode != 0
    # the same line from each rank that got to print it (lines of ranks writing at once may interleave)
    line = ("error: tp_mode='real': world size (3) must equal dp x tp_size, but is not divisible by tp_size "
            "(2)")
    assert line in r.stderr and r.stderr.count("error: ") == r.stderr.count(line), r.stderr
    assert "exitcode  : 2" in r.stderr, r.stderr  # torchrun's summary names our exit status
    assert os.path.join(ROOT, "train.py") + '", line' not in r.stderr  # no traceback from train.py itself
    assert not (tmp_path / "out").exists()
