"""A block type is one class and one registry entry (tpcomm/model/block_types/registry.register): a toy type
defined here alone, with an option of its own, runs through the validator (its option from the --key=value
form), the cost model, a pipeline cut, train.py simulated and under real tp 2 (3 steps, a checkpoint, a
resume), and real tp 2 against the simulation (this file is also its worker); an unregistered name is refused
in one line, and every registered type's facts equal what its code does (the collectives it runs, GPT at tp 1,
its function across tp_size, the stream it leaves, the options it runs under)."""

import json
import os
import sys
from dataclasses import dataclass

# the torchrun worker: the repository and tests/ on the path, as the other workers do
if __name__ == "__main__":
    HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), os.path.join(os.path.dirname(HERE), "workers"),
                    HERE]

import pytest  # noqa: E402
import torch  # noqa: E402

from tpcomm.errors import ConfigError  # noqa: E402
from tensor_parallel_model import DistributedGPT  # noqa: E402
from tpcomm.costmodel import cost_model as cm  # noqa: E402
from tpcomm.model.block_types.registry import BLOCK_TYPES, register  # noqa: E402
from tpcomm.model.block_types.tp import TP  # noqa: E402
from tpcomm.model.options import model_config  # noqa: E402
from tpcomm.parallel.pipeline import DESYNCED, SYNCED, StageModule  # noqa: E402
from real_tp_worker import (TOL, batch, compare_step, forward_backward, make_gpt, name,  # noqa: E402
                            write_results)

TOY_PATTERNS = [["toy"] * 4, ["toy", "parallel", "toy", "spd"], ["parallel", "toy", "caat", "toy"]]
SIZES = dict(n_layer=4, n_head=8, n_embd=32, block_size=32, vocab_size=61)


@dataclass(frozen=True)
class ToyOptions:
    gain: float = 1.0  # the config key toy_gain

    def check(self, *, n_embd, tp_size):
        g = self.gain
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not g > 0:
            raise ConfigError(f"toy_gain must be a positive number, got {g!r}")


class Toy(TP):
    """A toy block type: 'tp''s equations under its own name, its output times its option `gain` (1: 'tp'
    exactly), and one fact of its own: it claims no tp_collective_matmul (so the validator must read that from
    here, not from the name 'tp')."""
    collective_matmul = False
    Options = ToyOptions

    def forward(self, xbar, r, T, kv=None, *, sequence_parallel=False):
        x, r = super().forward(xbar, r, T, kv, sequence_parallel=sequence_parallel)
        return (x if self.options.gain == 1 else x * self.options.gain), r


@pytest.fixture
def toy():
    """The toy's one registry entry, removed afterwards (the registry is the process's)."""
    register("toy", Toy)
    yield "toy"
    del BLOCK_TYPES["toy"]


def config(**kw):
    return model_config("distributed_gpt", dict(SIZES, tp_size=2, **kw))


# ---------- the toy through every place ----------

def test_validator_accepts_the_toy_and_reads_its_facts(toy):
    from tpcomm.train import train_config

    for pattern in TOY_PATTERNS:
        assert config(block_types=pattern).block_types == pattern
        run = dict(train_config.defaults(), model_type="distributed_gpt", **SIZES, tp_size=2,
                   block_types=pattern)
        train_config.check_offline(run)  # train.py's checks of a run's options
    assert config(block_types="toy").block_types == ["toy"] * 4
    assert config(block_types="toy", tp_overlap=2).tp_overlap == 2  # it overlaps, as 'tp' does
    assert config(block_types="toy", sequence_parallel=True).sequence_parallel
    with pytest.raises(ConfigError, match=r"tp_collective_matmul=True runs 'tp' blocks only, got "
                       r"block_types=\['toy'"):
        config(block_types="toy", sequence_parallel=True, tp_collective_matmul=True)


def test_the_toys_option_is_a_config_key(toy):
    """toy_gain, the toy's option, is a --key=value of train.py and bench.py, checked by the toy's own
    check, refused where nothing reads it; 1 (its default) is 'tp' exactly, 2 another model (so the
    comparison above can fail)."""
    from tpcomm.bench import bench_config
    from tpcomm.configuration import configure
    from tpcomm.train import train_config

    for defaults in (train_config.defaults(), bench_config.defaults()):
        assert configure(defaults, ["--toy_gain=2.0"])["toy_gain"] == 2.0
    assert config(block_types="toy", toy_gain=2.0).type_options["toy"].gain == 2.0
    for bad, words in ((dict(block_types="toy", toy_gain=0), "toy_gain must be a positive number, got 0"),
                       (dict(block_types="toy", toy_gain="big"), "toy_gain must be a positive number, got "
                        "'big'"), (dict(block_types="tp", toy_gain=2.0), "toy_gain=2.0 has no effect without "
                                   "'toy' blocks")):
        with pytest.raises(ConfigError, match=words):
            config(**bad)
    with pytest.raises(ConfigError, match="toy_gain=2.0 needs model_type='distributed_gpt'"):
        model_config("gpt", dict(SIZES, toy_gain=2.0))
    gpt = make_gpt()
    idx, tgt = batch(0)
    tp = DistributedGPT.from_gpt(gpt, 2, "tp")(idx, tgt)[0]
    assert torch.equal(DistributedGPT.from_gpt(gpt, 2, "toy", toy_gain=1.0)(idx, tgt)[0], tp)
    assert not torch.allclose(DistributedGPT.from_gpt(gpt, 2, "toy", toy_gain=2.0)(idx, tgt)[0], tp,
                              atol=1e-3)


def test_train_py_trains_checkpoints_and_resumes_the_toy(toy, tmp_path, char_data):
    """train.py, the toy registered by its launcher (this file): 3 steps simulated and under real tp
    2 (gloo) with toy_gain=2, the same losses; the checkpoint keeps the option, a resume continues
    from it, and a resume that contradicts it is refused in one line. Each step counts the toy's
    syncs, as the cost model prices them."""
    from conftest import TINY, TORCHRUN, assert_same, losses, metrics, one_line_error, run_script

    def launch(out, *extra, nproc=None):
        args = ["tests/model/test_block_registry.py", "train", *TINY, f"--data_dir={char_data}",
                f"--out_dir={out}", "--model_type=distributed_gpt", "--tp_size=2", "--block_types=toy",
                *extra]
        return run_script(*([*TORCHRUN, f"--nproc_per_node={nproc}"] if nproc else []), *args, timeout=300)

    common = ("--toy_gain=2.0", "--max_iters=2", "--eval_interval=2", "--always_save_checkpoint=True")
    sim, real = tmp_path / "sim", tmp_path / "real"
    for out, extra in ((sim, ()), (real, ("--tp_mode=real",))):
        r = launch(out, *common, *extra, nproc=2 if extra else None)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert_same(losses(sim), losses(real), 1e-5, "real tp 2 against simulated")
    steps = [rec for rec in metrics(sim) if "loss" in rec]
    assert len(steps) == 3 and all(rec["fwd_allreduces"] == cm.forward_syncs(["toy"] * 2) for rec in steps)
    ckpt = torch.load(sim / "ckpt.pt", weights_only=True)
    assert ckpt["model_options"]["toy_gain"] == 2.0 and ckpt["model_options"]["block_types"] == ["toy"] * 2
    r = launch(sim, "--init_from=resume", "--max_iters=4", "--eval_interval=2")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert sorted(losses(sim)) == [0, 1, 2, 3, 4]
    assert torch.load(sim / "ckpt.pt", weights_only=True)["iter_num"] == 4
    line = one_line_error(launch(sim, "--init_from=resume", "--max_iters=6", "--toy_gain=3.0"))
    assert "toy_gain=3.0 contradicts the checkpoint's toy_gain=2.0" in line, line


def test_an_unregistered_type_is_refused_in_one_line():
    assert "toy" not in BLOCK_TYPES
    with pytest.raises(ConfigError) as e:
        config(block_types=["tp", "toy", "tp", "tp"])
    assert str(e.value) == ("block_types: unknown block type(s) ['toy']; use ['tp', 'spd', 'parallel', "
                            "'ladder', 'caat']")
    with pytest.raises(ValueError, match=r"^unknown block type 'toy'; the registered types are \['tp'"):
        cm.forward_syncs(["tp", "toy"])  # the cost model prices no type it does not know (it once counted 0)
    with pytest.raises(TypeError, match="not a BlockType"):
        register("toy", object)
    assert "toy" not in BLOCK_TYPES


def test_cost_model_prices_the_toy(toy):
    for pattern in TOY_PATTERNS:
        as_tp = [k.replace("toy", "tp") for k in pattern]
        assert cm.forward_syncs(pattern) == cm.forward_syncs(as_tp) and cm.forward_syncs(pattern) > 0
        assert cm.backward_syncs(pattern) == cm.backward_syncs(as_tp)
    shape, kw = cm.TABLE_SHAPES[0], dict(tp=8, link=cm.LINKS[0], tokens=8192, seq_len=1024, mfu=0.4)
    toy_step = cm.step_seconds(shape, fwd_syncs=cm.forward_syncs(["toy"] * shape.n_layer), **kw)
    assert toy_step == cm.step_seconds(shape, fwd_syncs=cm.forward_syncs(["tp"] * shape.n_layer), **kw)
    assert toy_step[1] > 0


def test_pipeline_cuts_a_toy_model(toy):
    gpt = make_gpt()
    model = DistributedGPT.from_gpt(gpt, 2, TOY_PATTERNS[1])  # toy, parallel, toy, spd
    idx, tgt = batch(0)
    whole, _ = model(idx, tgt)
    for cut, stream in ((1, SYNCED), (2, DESYNCED)):  # after the toy, after 'parallel'
        first = StageModule(model, 0, cut, is_first=True, is_last=False)
        last = StageModule(model, cut, 4, is_first=False, is_last=True)
        assert first.stream_out == last.stream_in == stream
        torch.testing.assert_close(last(*first(idx)), whole, rtol=1e-5, atol=1e-5)


def test_toy_computes_what_tp_computes(toy):
    gpt = make_gpt()
    idx, tgt = batch(0)
    for pattern in TOY_PATTERNS:
        a = DistributedGPT.from_gpt(gpt, 2, pattern)
        b = DistributedGPT.from_gpt(gpt, 2, [k.replace("toy", "tp") for k in pattern])
        assert [blk.sites["attn"][1] for blk in a.transformer.h] == pattern  # traced under its own name
        torch.testing.assert_close(a(idx, tgt)[0], b(idx, tgt)[0], rtol=0, atol=0)


def test_real_tp2_toy_equals_simulation(toy, tmp_path):
    from conftest import TORCHRUN, run_script

    out = tmp_path / "results.json"
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "tests/model/test_block_registry.py", str(out),
                   timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == sorted(f"fwd_bwd/float64/{name(p)}" for p in TOY_PATTERNS)
    for pattern in TOY_PATTERNS:
        result = results[f"fwd_bwd/float64/{name(pattern)}"]
        assert result["ratio"] <= 1.0, result
        real, sim = result["fwd_allreduces"]
        assert real == sim == cm.forward_syncs(pattern)


def worker(out_path):
    """Under torchrun (2 ranks, gloo): each toy pattern real against simulated, float64."""
    from tpcomm.parallel.parallel_dims import init_parallel, shutdown

    register("toy", Toy)
    pd = init_parallel(dp=1, tp=int(os.environ["WORLD_SIZE"]), device_type="cpu", backend="gloo")
    try:
        gpt, (idx, tgt), results = make_gpt(), batch(0), {}
        for pattern in TOY_PATTERNS:
            real, sim = (DistributedGPT.from_gpt(gpt, pd.tp, pattern, pd=p).double() for p in (pd, None))
            results[f"fwd_bwd/float64/{name(pattern)}"] = compare_step(
                forward_backward(real, idx, tgt), forward_backward(sim, idx, tgt), TOL["float64"], real)
        write_results(pd, results, out_path)
    finally:
        shutdown(pd)


# ---------- every registered type's facts against its code ----------

def measured(model, idx):
    comm = model.comm_per_forward(idx)
    return comm["fwd_allreduces"], comm["bwd_allreduces"]


@pytest.mark.parametrize("kind", list(BLOCK_TYPES))
def test_facts_equal_the_code(kind):
    gpt = make_gpt()
    idx, tgt = batch(0)
    cls = BLOCK_TYPES[kind]
    for pattern in ([kind] * 4, ["parallel", kind, kind, "tp"], ["spd", kind, "parallel", kind]):
        model = DistributedGPT.from_gpt(gpt, 2, pattern)
        assert measured(model, idx) == (cm.forward_syncs(pattern), cm.backward_syncs(pattern)), pattern
        assert [model.desynced_after(i) for i in range(4)] == [BLOCK_TYPES[k].desyncs for k in pattern]
    def logits(model):  # GPT's (B, T, V), whatever the head
        return model.gathered_logits(model(idx, tgt)[0], idx.shape)
    at = {tp: logits(DistributedGPT.from_gpt(gpt, tp, kind)) for tp in (1, 2)}
    same = dict(rtol=1e-5, atol=1e-5)
    assert torch.allclose(at[1], gpt(idx, tgt)[0], **same) == cls.gpt_at_tp1
    assert torch.allclose(at[2], at[1], **same) != cls.tp_dependent
    kw = dict(block_types=kind)
    assert cm.overlapped_syncs([kind] * 2) == (3 if cls.delays else 0)
    for fact, option in (("overlaps", dict(tp_overlap=2)), ("sequence_parallel",
                                                            dict(sequence_parallel=True)),
                         ("compressible", dict(tp_comm_dtype="int8"))):
        try:
            config(**kw, **option)
            runs = True
        except ConfigError:
            runs = False
        assert runs == getattr(cls, fact), (kind, fact)


def train_worker(argv):
    """train.py's main with the toy registered (as a plug-in's own launcher would register it)."""
    import train
    register("toy", Toy)
    train.main(argv)


if __name__ == "__main__":
    train_worker(sys.argv[2:]) if sys.argv[1] == "train" else worker(sys.argv[1])
