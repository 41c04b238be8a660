"""bench.py: bad values are one line (exit 2) before any work; the timing reads the collectives through the
model interface (reset_comm_counts / comm_report), whichever model it holds."""

import pytest
import torch

import bench
from tpcomm.bench import bench_config
from conftest import one_line_error, run_script
from model import GPTConfig
from tpcomm.bench import op_profile
from tpcomm.model.interface import PlainGPT

TINY = ["--device=cpu", "--dtype=float32", "--n_layer=2", "--n_head=4", "--n_embd=32", "--block_size=16",
        "--batch_size=2", "--vocab_size=65", "--iters=3", "--warmup=1"]


def error_line(capsys, argv):
    """Run bench.main in this process; return its one stderr line (after checking exit status 2)."""
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("arg, words", [("--n_layer=0", "n_layer must be an int >= 1, got 0"),
                                        ("--n_head=-2", "n_head must be an int >= 1, got -2"),
                                        ("--n_embd=0", "n_embd must be an int >= 1, got 0"),
                                        ("--block_size=0", "block_size must be an int >= 1, got 0"),
                                        ("--batch_size=0", "batch_size must be an int >= 1, got 0"),
                                        ("--vocab_size=None", "vocab_size: expected int (default 50304), got "
                                         "None"), ("--iters=0", "iters must be an int >= 1, got 0"),
                                        ("--warmup=-1", "warmup must be an int >= 0, got -1"),
                                        ("--n_embd=30", "n_embd (30) must be divisible by n_head (4)"),
                                        ("--dtype=float8", "dtype must be 'auto', 'float32', 'bfloat16' or "
                                         "'float16', got 'float8'"), ("--device=tpu", "'tpu'"),
                                        ("--mode=infer", "mode must be 'train', 'decode', 'memory' or "
                                         "'pipeline', got 'infer'"), ("--mode=decode --batch_sizes=[0]",
                                                                      "batch_sizes must be a non-empty list "
                                                                      "of ints >= 1, got [0]"),
                                        ("--mode=decode --prompt_len=10 --new_tokens=10", "prompt_len + "
                                         "new_tokens <= block_size (16)"), ("--profile=-1", "profile must be "
                                                                            "an int >= 0 (steps per model "
                                                                            "and round), got -1"),
                                        ("--mode=decode --profile=2", "profile breaks training steps down: "
                                         "it needs mode='train', got mode='decode'"),])
def test_bad_values_are_one_line(capsys, arg, words):
    assert words in error_line(capsys, [*TINY, *arg.split()])


@pytest.mark.parametrize("device", ["cuda", "cuda:7", "mps"])
def test_a_device_this_machine_lacks_is_one_line(capsys, device):
    if device.startswith("cuda") and torch.cuda.device_count() > int(device.partition(":")[2] or 0):
        pytest.skip(f"this machine has {device}")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has mps")
    assert repr(device) in error_line(capsys, [*TINY, f"--device={device}"])


def test_cli_error_has_no_traceback():
    r = run_script("bench.py", *TINY, "--n_layer=0")
    assert r.returncode == 2 and r.stderr.strip() == "error: n_layer must be an int >= 1, got 0", r.stderr


class CountingGPT(PlainGPT):
    """GPT that reports made-up collective time through the model interface, and counts the calls."""

    def __init__(self, config):
        super().__init__(config)
        self.calls = {"reset_comm_counts": 0, "sync_replicated_grads": 0}

    def reset_comm_counts(self):
        self.calls["reset_comm_counts"] += 1

    def sync_replicated_grads(self):
        self.calls["sync_replicated_grads"] += 1

    def comm_report(self, *, micro_steps, tokens):
        return {"comm_seconds": 0.3, "comm_busy_seconds": 0.6}  # since the last reset, all steps together


def test_timing_reads_collectives_through_the_model_interface():
    cfg = dict(bench_config.DEFAULTS, vocab_size=65, block_size=16, batch_size=2, warmup=1, compile=False)
    model = CountingGPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=65))
    dt, exposed, busy = bench.timed_steps(model, cfg, "cpu", "cpu", "float32", 3)
    # 0.3 s and 0.6 s over 3 steps
    assert dt > 0 and exposed == pytest.approx(0.1) and busy == pytest.approx(0.2)
    assert model.calls == {"reset_comm_counts": 1, "sync_replicated_grads": 4}  # after warm-up; every step
    dt, exposed, busy = bench.timed_steps(PlainGPT(model.config), cfg, "cpu", "cpu", "float32", 2)
    assert exposed == busy == 0.0  # GPT's report is empty: no collectives


def test_tiny_bench_prints_a_line_per_model(capsys):
    bench.main([*TINY, "--model_type=distributed_gpt", "--tp_size=2", "--patterns=['spd', 'tp']"])
    out = capsys.readouterr().out.splitlines()
    lines = {line.split()[0]: line for line in out[1:] if line.strip() and not line.startswith("|")}
    table = [line for line in out if line.startswith("| `")]  # one row per pattern (GPT has no collectives)
    assert [row.split("|")[1].strip() for row in table] == ["`spd`", "`tp`"]
    assert all(row.split("|")[6].strip() == "n/a (simulated)" for row in table)
    assert "all-reduces fwd 2 bwd 2" in lines["spd"] and "all-reduces fwd 4 bwd 4" in lines["tp"]
    assert "all-reduces" not in lines["gpt"] and "ratio" in lines  # GPT's comm_per_forward is {}
    assert "collectives" not in lines["tp"]  # simulated: no time in real collectives to report


def test_decode_mode_times_prefill_and_tokens(tmp_path):
    """--mode=decode: a latency row per pattern and batch size, measured all-reduces, and the plot."""
    plot = tmp_path / "decode.png"
    r = run_script("bench.py", *TINY, "--model_type=distributed_gpt", "--tp_size=2", "--mode=decode",
                   "--batch_sizes=[1, 3]", "--new_tokens=4", "--patterns=['tp', 'parallel']",
                   f"--plot={plot}")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| `")]
    assert [(row.split("|")[1].strip(), row.split("|")[2].strip(), row.split("|")[3].strip())
            for row in rows] == [("`tp`", "4 (0)", "1"), ("`tp`", "4 (0)", "3"), ("`parallel`", "1 (0)", "1"),
                                 ("`parallel`", "1 (0)", "3"), ("`gpt`", "0 (0)", "1"),
                                 ("`gpt`", "0 (0)", "3")]
    assert plot.stat().st_size > 1000
    # the plotted numbers beside it, their digest in the PNG (report --check compares them); the title names
    # the model, the prompt and the tokens generated
    from tpcomm.figures import command_figures, png

    data, _ = command_figures.load(str(plot))
    assert png.png_digest(str(plot)) == png.data_digest(data) and len(data["rows"]) == 6
    assert data["new_tokens"] == 4 and "layers x" in data["model"] and data["prompt_len"] > 0


def test_variants_time_every_pattern_with_every_way_to_move_its_syncs(capsys):
    """--variants: a row per (pattern, variant) in one run, counts measured (tp_overlap=2: twice the
    all-reduces, all asynchronous; SP: reduce-scatters and all-gathers instead; int8: fewer ring bytes); a
    pair that cannot run (ladder with SP or tp_overlap) is listed as skipped, not an error."""
    bench.main([*TINY, "--model_type=distributed_gpt", "--tp_size=2", "--batch_size=2", "--patterns=['tp', "
                "'ladder']", "--variants=[{}, {'tp_overlap': 2}, {'sequence_parallel': True}, "
                "{'tp_comm_dtype': 'int8'}]"])
    out = capsys.readouterr().out
    rows = {r[0].strip("`"): r[1:] for r in ([c.strip() for c in line.split("|")[1:-1]]
                                             for line in out.splitlines() if line.startswith("| `"))}
    assert list(rows) == ["tp", "tp +overlap2", "tp +sp", "tp +int8/32", "ladder", "ladder +int8/32"]
    n = 2 * 2  # two tp blocks in TINY
    assert rows["tp"][:2] == [f"{n} (0)", "0 / 0"] and rows["tp +overlap2"][:2] == [f"{2 * n} ({2 * n})", "0 "
                                                                                    "/ 0"]
    assert rows["tp +sp"][:2] == ["0 (0)", f"{n} / {n + 1}"]  # + the gather before ln_f
    ring = {k: float(v[2].replace(",", "")) for k, v in rows.items()}
    assert ring["tp +int8/32"] < ring["tp"] == ring["tp +overlap2"]
    assert "skipped ladder +sp: sequence_parallel=True does not run with 'ladder'" in out
    assert "skipped ladder +overlap2: tp_overlap=2 has nothing to overlap" in out


@pytest.mark.parametrize("variants, words", [("[{'tp_overlap': 0}]", "tp_overlap"), ("[{'foo': 1}]", "foo"),
                                             ("{}", "variants must be a non-empty list")])
def test_bad_variants_are_one_line(variants, words):
    line = one_line_error(run_script("bench.py", *TINY, "--model_type=distributed_gpt", "--tp_size=2",
                                     f"--variants={variants}"))
    assert words in line, line


def test_profile_breaks_each_step_down_by_op_group(capsys):
    """--profile: a column per model and one per difference from GPT; in each column the groups sum
    to the total (the steps' span: self times partition it; 9 entries printed to 0.01 ms, so 0.05 ms
    of rounding), and the difference column is the difference of the totals (three printed values,
    each off by up to 0.005 ms)."""
    bench.main([*TINY, "--model_type=distributed_gpt", "--tp_size=2", "--patterns=['spd']", "--profile=1"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    body = lines[lines.index("| self CPU ms/step | `spd` | `gpt` | `spd` - `gpt` |") + 2:]
    rows = {r[0]: [float(v) for v in r[1:]]
            for r in ([c.strip() for c in line.split("|")[1:-1]] for line in body if line.startswith("| "))}
    assert list(rows) == [*op_profile.ORDER, "total"]
    spd, gpt, diff = zip(*rows.values())
    for column in (spd, gpt, diff):
        assert sum(column[:-1]) == pytest.approx(column[-1], abs=0.051)
    assert spd[-1] > 0 and gpt[-1] > 0 and diff[-1] == pytest.approx(spd[-1] - gpt[-1], abs=0.016)
    # not all in one bucket: both models' matmuls and layer norms are found by name
    assert all(rows[g][i] > 0 for g in ("matmul", "layer_norm", "optimizer") for i in (0, 1))


def test_op_groups_find_the_ops_they_name():
    """Anti-vacuity for the grouping: op names land in their groups, and a step of matmuls alone is mostly
    'matmul' (the rest: the profiler's and Python's own time between ops, which 'python' holds)."""
    assert [op_profile.group_of(n) for n in ("aten::baddbmm", "autograd::engine::evaluate_function: "
                                             "MmBackward0", "aten::native_layer_norm_backward",
                                             "aten::_scaled_dot_product_flash_attention_for_cpu",
                                             "aten::copy_", "aten::gelu_backward",
                                             "Optimizer.step#AdamW.step", "aten::view",
                                             op_profile.STEP)] == ["matmul", "matmul", "layer_norm",
                                                                   "attention", "copies", "elementwise",
                                                                   "optimizer", "other", "python"]
    # ~10 ms a matmul on one core: the profiler's own time is small beside it (at 256 x 256
    a = torch.randn(768, 768)
    # a loaded host read 65% matmul)
    groups, total = op_profile.op_breakdown(lambda: [a @ a for _ in range(4)], 3)
    assert sum(groups.values()) == pytest.approx(total, rel=1e-6)  # exact but for float summation
    assert groups["matmul"] > 0.8 * total and groups["layer_norm"] == 0.0


def test_real_tp_training_plot_splits_each_step(tmp_path):
    """--plot in training mode under real TP: each pattern's step split into compute, exposed and hidden
    communication, from the table's own numbers, written beside the PNG (report --check compares them)."""
    from conftest import TORCHRUN

    from tpcomm.figures import command_figures, png

    plot = tmp_path / "steps.png"
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "bench.py", *TINY, "--model_type=distributed_gpt",
                   "--tp_size=2", "--tp_mode=real", "--patterns=['tp', 'ladder']", f"--plot={plot}",
                   timeout=300)
    assert r.returncode == 0, r.stderr
    data, _ = command_figures.load(str(plot))
    assert png.png_digest(str(plot)) == png.data_digest(data)
    table = {line.split("|")[1].strip(" `"): line.split("|") for line in r.stdout.splitlines()
             if line.startswith("| `")}
    assert [row[0] for row in data["rows"]] == ["tp", "ladder"] == list(table)
    for name, ms, busy, exposed in data["rows"]:  # the plotted numbers are the printed ones
        assert (f"{ms:.2f}", f"{busy:.2f}", f"{exposed:.2f}") == tuple(table[name][k].strip()
                                                                       for k in (5, 6, 7))
        assert 0 <= exposed <= busy and exposed <= ms
