"""train.py with data_parallel='fsdp', init_device='meta' and loss_parallel, end to end under
torchrun (CPU, gloo): each logs the losses of one plain process (fp32 tolerance), checkpoints move
between FSDP, DDP and simulated runs, and bad combinations are one line, exit status 2. Every
comparison is shown able to fail (another seed)."""

import pytest

from conftest import TINY, assert_same, differs, losses, metrics, run_script, train, val_losses

SPD = "config/train_shakespeare_char_spd.py"  # distributed_gpt, tp_size 2, spd blocks (tiny sizes from TINY)


# gradient accumulation (4 global micro-batches: 2 per rank at dp 2), clipping active (the tiny model's
# gradient norm is > 0.1), eval_iters 5: not divisible by dp (FSDP's evaluation keeps its ranks' forwards in
# step)
COMMON = ["--max_iters=5", "--lr_decay_iters=5", "--eval_interval=5", "--gradient_accumulation_steps=4",
          "--grad_clip=0.1", "--eval_iters=5"]


def test_fsdp_and_meta_init_match_one_process_and_ddp(tmp_path, char_data):
    one, ddp, fsdp = tmp_path / "one", tmp_path / "ddp", tmp_path / "fsdp"
    train(one, char_data, *COMMON)
    train(ddp, char_data, *COMMON, nproc=2)
    r = train(fsdp, char_data, *COMMON, "--data_parallel=fsdp", nproc=2)
    assert "dp=2" in r.stdout and "data_parallel=fsdp" in r.stdout
    a = losses(one)
    assert sorted(a) == list(range(6)) and abs(a[5] - a[0]) > 1e-2  # it trained
    # fp32: FSDP's reduce-scatter and DDP's all-reduce sum the same gradients in other orders: ~1e-7 relative
    for other in (ddp, fsdp):
        assert_same(a, losses(other), 1e-5, other.name)
        assert_same(val_losses(one), val_losses(other), 1e-5, other.name)
    # init_device='meta': the model is built without memory and materialised with GPT's initial weights,
    # bitwise, so the losses are exactly the default init's, one process and FSDP alike
    train(tmp_path / "one_meta", char_data, *COMMON, "--init_device=meta")
    train(tmp_path / "fsdp_meta", char_data, *COMMON, "--data_parallel=fsdp", "--init_device=meta", nproc=2)
    assert losses(tmp_path / "one_meta") == a
    assert losses(tmp_path / "fsdp_meta") == losses(fsdp)
    # the comparisons can fail: another seed (other initial weights and batches) is far outside the tolerance
    train(tmp_path / "seed", char_data, *COMMON, "--seed=7")
    assert differs(a, losses(tmp_path / "seed"), 1e-5)


def test_fsdp_x_real_tp_and_loss_parallel_match_one_simulated_process(tmp_path, char_data):
    """dp 2 x tp 2 real (4 processes, FSDP over dp) logs the losses of one simulated tp_size-2
    process; so does loss_parallel=True (vocabulary-sharded wte/lm_head, vocab-parallel
    cross-entropy), simulated and real."""
    common = [SPD, *COMMON]
    sim = tmp_path / "sim"
    train(sim, char_data, *common)
    a = losses(sim)
    r = train(tmp_path / "fsdp_tp", char_data, *common, "--tp_mode=real", "--data_parallel=fsdp", nproc=4)
    assert "dp=2, tp=2 real" in r.stdout
    assert_same(a, losses(tmp_path / "fsdp_tp"), 1e-5, "fsdp x tp")
    train(tmp_path / "lp_sim", char_data, *common, "--loss_parallel=True")
    train(tmp_path / "lp_real", char_data, *common, "--loss_parallel=True", "--tp_mode=real",
          "--data_parallel=fsdp", "--init_device=meta", nproc=4)
    for name in ("lp_sim", "lp_real"):
        assert_same(a, losses(tmp_path / name), 1e-5, name)
        steps = [rec for rec in metrics(tmp_path / name) if "loss" in rec]
        # the vocab-parallel collectives, apart
        assert all(rec["vocab_allreduces"] > 0 for rec in steps), steps[0]
    assert all("vocab_allreduces" not in rec for rec in metrics(sim))
    assert abs(a[5] - a[0]) > 1e-2
    train(tmp_path / "seed", char_data, *common, "--seed=7")
    assert differs(a, losses(tmp_path / "seed"), 1e-5)


def test_checkpoints_move_between_fsdp_ddp_and_simulated(tmp_path, char_data):
    """An FSDP dp 2 x tp 2 run's checkpoint (GPT layout, gathered on every rank, written by the master)
    resumes as one simulated process, whose checkpoint resumes as HSDP dp 4 (2 replicas x dp_shard 2) built on
    the meta device, then as DDP dp 2: the losses of the uninterrupted one-process run. All-'tp' blocks are
    GPT at every tp_size, so one trajectory is the reference (as in tests/tp/test_real_tp.py)."""
    common = [SPD, "--block_types=tp", "--lr_decay_iters=12", "--eval_interval=3",
              # 4: divisible by dp 4 (HSDP)
              "--gradient_accumulation_steps=4", "--always_save_checkpoint=True"]
    ref, part = tmp_path / "ref", tmp_path / "part"
    train(ref, char_data, *common, "--max_iters=12", "--tp_size=1")
    train(part, char_data, *common, "--max_iters=3", "--tp_mode=real", "--data_parallel=fsdp", nproc=4)
    train(part, char_data, *common, "--max_iters=6", "--init_from=resume", "--tp_size=1")
    r = train(part, char_data, *common, "--max_iters=9", "--init_from=resume", "--tp_size=1",
              "--data_parallel=fsdp", "--dp_shard=2", "--init_device=meta", nproc=4)
    assert "dp=4 (hsdp: 2 replicas x dp_shard 2)" in r.stdout
    train(part, char_data, *common, "--max_iters=12", "--init_from=resume", "--tp_size=2", nproc=2)
    a, b = losses(ref), losses(part)
    assert_same(a, b, 1e-5, "resumed")
    assert abs(a[12] - a[0]) > 1e-2
    train(tmp_path / "seed", char_data, *common, "--max_iters=12", "--tp_size=1", "--seed=7")
    assert differs(a, losses(tmp_path / "seed"), 1e-5)


@pytest.mark.parametrize("args, words", [
    (["--data_parallel=zero3"], ["data_parallel", "zero3"]),
    (["--init_device=cuda"], ["init_device", "cuda"]),
    (["--loss_parallel=True"], ["loss_parallel", "distributed_gpt", "'gpt'"]),
    (["--checkpoint_format=zip"], ["checkpoint_format", "zip"]),
    (["--init_from=resume", "--checkpoint_format=sharded"], ["checkpoint_format='sharded'", "ckpt_sharded"]),
    (["--dp_shard=1"], ["dp_shard=1", "data_parallel='fsdp'", "'ddp'"]),
])
def test_bad_combinations_one_line_exit_2(tmp_path, char_data, args, words):
    out = tmp_path / "out"
    r = run_script("train.py", *TINY, f"--data_dir={char_data}", f"--out_dir={out}", *args, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not out.exists()


# HSDP's dp_shard, checked in process (tpcomm.parallel.parallel_dims.check_dp_shard through train.py's
# prepare): WORLD_SIZE as torchrun would set it, no process group needed
@pytest.mark.parametrize("world, args, words", [
    (4, ["--dp_shard=2"], ["dp_shard=2", "needs data_parallel='fsdp'", "data_parallel='ddp'"]),
    (4, ["--data_parallel=fsdp", "--dp_shard=3"], ["dp_shard (3) must divide", "dp (4)"]),
    (4, ["--data_parallel=fsdp", "--dp_shard=8"], ["dp_shard (8) must divide", "dp (4)"]),
    (1, ["--data_parallel=fsdp", "--dp_shard=2"], ["dp_shard (2) must divide", "dp (1)"]),
    (4, ["--data_parallel=fsdp", "--dp_shard=4", "--model_type=distributed_gpt", "--tp_size=2",
         "--tp_mode=real"],
     ["dp_shard (4) must divide", "dp (2)"]),  # dp = world / tp
    (4, ["--data_parallel=fsdp", "--dp_shard=0"], ["dp_shard must be a positive int", "got 0"]),
    (4, ["--data_parallel=fsdp", "--dp_shard='2'"], ["dp_shard must be a positive int", "got '2'"]),
    (4, ["--data_parallel=fsdp", "--dp_shard=True"], ["dp_shard must be a positive int", "got True"]),
])
def test_dp_shard_is_checked_naming_key_and_values(tmp_path, char_data, monkeypatch, world, args, words):
    from tpcomm.errors import ConfigError
    from tpcomm.train.train_config import prepare

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:
        prepare([*TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--gradient_accumulation_steps=8",
                 *args])
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    assert not out.exists()


def test_dp_shard_sets_the_mesh(tmp_path, char_data, monkeypatch):
    """dp_shard reaches the layout: None is plain FSDP (one dp dim), a divisor of dp splits it into
    (dp_replicate, dp_shard), inner to pp and outer to tp."""
    from tpcomm.parallel.parallel_dims import ParallelDims
    from tpcomm.train.train_config import prepare

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    base = [*TINY, f"--data_dir={char_data}", f"--out_dir={tmp_path / 'out'}", "--data_parallel=fsdp",
            "--gradient_accumulation_steps=4"]
    assert prepare(base)[1].dp_shard == 4
    assert prepare([*base, "--dp_shard=2"])[1].dp_shard == 2
    assert ParallelDims(dp=4).mesh_dims() == [("dp", 4), ("tp", 1)]
    assert ParallelDims(dp=4, dp_shard=4, tp=2).mesh_dims() == [("dp", 4), ("tp", 2)]
    hsdp = ParallelDims(dp=4, dp_shard=2, tp=2, pp=2)
    assert hsdp.hsdp and hsdp.dp_replicate == 2
    assert hsdp.mesh_dims() == [("pp", 2), ("dp_replicate", 2), ("dp_shard", 2), ("tp", 2)]


def test_sharded_checkpoint_converts_exactly_and_resumes(tmp_path, char_data):
    """checkpoint_format='sharded' (DCP, each rank writes its shards) from FSDP dp 2 x tp 2 real with
    loss_parallel: converted on one process it is bitwise the full-format ckpt.pt of the same run (GPT keys
    and shapes, unpadded vocabulary, AdamW moments); resumed at dp 1 with DDP it continues the uninterrupted
    one-process run; resumed in another tp layout it is refused in one line that says how to convert."""
    import torch

    common = [SPD, "--loss_parallel=True", "--lr_decay_iters=6", "--eval_interval=3",
              "--gradient_accumulation_steps=2", "--always_save_checkpoint=True"]
    real = ["--tp_mode=real", "--data_parallel=fsdp"]
    full, sharded, ref = tmp_path / "full", tmp_path / "sharded", tmp_path / "ref"
    train(full, char_data, *common, *real, "--max_iters=3", nproc=4)
    train(sharded, char_data, *common, *real, "--max_iters=3", "--checkpoint_format=sharded", nproc=4)
    assert not (sharded / "ckpt.pt").exists() and (sharded / "ckpt_sharded").is_symlink()
    r = run_script("-m", "tpcomm.train.sharded_checkpoint", str(sharded), timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    a, b = (torch.load(d / "ckpt.pt", weights_only=True) for d in (full, sharded))
    assert sorted(a) == sorted(b) and a["model_options"] == b["model_options"] and b["iter_num"] == 3
    assert b["model_options"]["loss_parallel"] is True
    assert list(a["model"]) == list(b["model"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert b["model"]["lm_head.weight"].shape[0] == b["model_args"]["vocab_size"]  # padding removed
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sorted(sa) == sorted(sb) and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    # resume from the sharded checkpoint itself at another dp (1, DDP): the uninterrupted run's losses
    (sharded / "ckpt.pt").unlink()
    train(ref, char_data, *common, "--max_iters=6")
    train(sharded, char_data, *common, "--max_iters=6", "--tp_mode=real", "--checkpoint_format=sharded",
          "--init_from=resume", nproc=2)
    assert_same(losses(ref), losses(sharded), 1e-5, "sharded resume")
    assert sorted(p.name for p in sharded.iterdir() if p.name.startswith("ckpt_sharded")) == \
        ["ckpt_sharded", "ckpt_sharded.6"]  # the link moved to the new save, the old one was removed
    r = run_script("train.py", SPD, *TINY, f"--data_dir={char_data}", f"--out_dir={sharded}",
                   "--init_from=resume", "--checkpoint_format=sharded", "--max_iters=8", timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "tp_real=True (this run: False)" in r.stderr and "tpcomm.train.sharded_checkpoint" in r.stderr
