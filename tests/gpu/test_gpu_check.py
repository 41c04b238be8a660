"""`make gpu-check` rehearsed on CPU (tpcomm/gpu/gpu_check.py --sizes=tiny): every section runs and reports
the fields docs/gpu.md reads, the markdown's generated section replaces only itself, a failing or overrunning
section is recorded while the others run, and bad options are one line with exit status 2."""

import json
import time

import pytest

from conftest import one_line_error, run_script
from tpcomm.errors import ConfigError
from tpcomm.gpu import gpu_check, gpu_report


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One CPU rehearsal (~20 s of CPU time; 2 processes for the real-TP section),
    into a temp dir, never docs/."""
    out = tmp_path_factory.mktemp("gpu_check")
    (out / "gpu.md").write_text(f"# GPUs\n\nhand-written "
                                f"guide\n\n{gpu_report.BEGIN}\nold\n{gpu_report.END}\n\ntail\n")
    r = run_script("-m", "tpcomm.gpu.gpu_check", "--sizes=tiny", "--device=cpu", f"--out_dir={out}",
                   timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((out / "gpu.json").read_text()), (out / "gpu.md").read_text(), r.stdout


def test_every_section_runs_on_cpu(tiny):
    report, _, stdout = tiny
    assert list(report["sections"]) == list(gpu_check.SECTIONS)
    for name, section in report["sections"].items():
        assert section["error"] is None, (name, section["error"])
        assert section["seconds"] >= 0
    for key in ("device_name", "torch", "cuda", "date", "peak_flops", "sizes", "total_s"):
        assert key in report
    assert report["device"] == "cpu" and report["sizes"] == "tiny"
    assert "wrote" in stdout


def test_training_and_decode_fields(tiny):
    s = tiny[0]["sections"]
    for mode in ("eager", "compiled"):
        m = s["gpt_train"][mode]
        assert m["ms_per_iter"] > 0 and m["tokens_per_s"] > 0
        assert m["mfu"] is None  # no peak for a CPU: n/a, not a made-up number
    assert s["gpt_train"]["compiled_graphs"] == 1 and s["gpt_train"]["graph_breaks"] == 0
    assert set(s["sim_tp8"]["ratio_to_gpt"]) == set(gpu_report.COMPRESSIBLE_TYPES)
    assert all(r > 0 for r in s["sim_tp8"]["ratio_to_gpt"].values())
    rows = {(r["model"], r["batch"]): r["ms_per_token"] for r in s["decode"]["rows"]}
    assert set(rows) == {(m, b) for m in ("gpt", "tp", "spd") for b in (1, 16)}
    assert all(v > 0 for v in rows.values())


def test_real_tp_equals_simulation_and_comm_time_is_sane(tiny):
    s = tiny[0]["sections"]
    real = s["real_tp"]
    assert real["ok"] and real["max_abs_diff"] <= gpu_check.REAL_TOL and real["dtype"] == "float64"
    for p in real["patterns"].values():
        assert len(p["real"]) == gpu_check.REAL_STEPS
        assert p["real"][0] != p["real"][-1]  # the steps trained (not a comparison of one repeated number)
    assert set(real["options"]) == {name for name, _, _ in gpu_check.OPTION_CASES}
    for o in real["options"].values():  # each option through real TP, within its bound
        assert o["ok"] and o["max_abs_diff"] <= o["tolerance"] and len(o["real"]) == gpu_check.OPTION_STEPS
        assert o["real"][0] != o["real"][-1]
    c = s["comm_sanity"]
    assert c["mib"] == 64 and c["ok"] and c["floor_ms"] < c["in_collective_ms"] <= c["step_ms"]


def test_identity_and_cost_model_fields(tiny):
    s = tiny[0]["sections"]
    dev = s["bf16_identity"]["max_deviation"]
    # every block type at tp 2, 4, 8 and GPT, and two sequence-parallel patterns at each tp: all exactly 0 on
    # CPU (tests/model/test_bf16_identity.py), reported on a GPU whatever they are
    sp = [f"{p} tp{t} sequence parallel" for p in (["spd", "parallel", "tp", "parallel"],
                                                   ["parallel", "spd", "parallel", "tp"]) for t in (2, 4, 8)]
    assert set(dev) == {"gpt"} | {f"{k} tp{t}" for k in gpu_report.COMPRESSIBLE_TYPES
                                  for t in (2, 4, 8)} | set(sp)
    assert set(dev.values()) == {0.0} and s["bf16_identity"]["ok"] is True, dev
    # and in training passes, gradients on, with each option the validator allows
    # (tests/gpu/test_bf16_train_identity.py)
    train = s["bf16_identity"]["train_loss_deviation"]
    assert len(train) == 3 * 13 and set(train.values()) == {0.0}, train
    assert ("parallel tp8 (tp_async_grad=True)" in train and "spd tp4 (tp_async_grad=True, "
            "tp_overlap=2)" in train)
    assert s["cost_model"]["assumed_mfu"] == pytest.approx(0.40) and s["cost_model"]["measured_mfu"] is None


def test_markdown_replaces_only_its_section(tiny):
    _, md, _ = tiny
    assert md.startswith("# GPUs\n\nhand-written guide\n\n") and md.endswith("\n\ntail\n")
    assert "\nold\n" not in md and md.count(gpu_report.BEGIN) == 1 and md.count(gpu_report.END) == 1
    for text in ("CPU (rehearsal)", "torch ", "| eager |", "| compiled |", "all `ladder`", "ms/token",
                 "`real_tp`", "`comm_sanity`", "`bf16_identity`", "assumed MFU 40%"):
        assert text in md, text


def test_a_failing_or_slow_section_is_recorded_and_the_rest_run(tmp_path, monkeypatch):
    def broken(st):
        raise RuntimeError("boom")

    def slow(st):
        time.sleep(5)

    monkeypatch.setitem(gpu_check.RUNNERS, "gpt_train", broken)
    monkeypatch.setitem(gpu_check.RUNNERS, "sim_tp8", slow)
    monkeypatch.setitem(gpu_check.SIZES, "tiny", dict(gpu_check.SIZES["tiny"], budget=dict(
        gpu_check.SIZES["tiny"]["budget"], sim_tp8=0.2)))
    cfg = dict(gpu_check.DEFAULTS, sizes="tiny", device="cpu", out_dir=str(tmp_path),
               sections="gpt_train,sim_tp8,cost_model")
    t0 = time.time()
    report = gpu_check.run_check(cfg, say=lambda *a: None)
    assert time.time() - t0 < 4  # the sleeping section was cut at its box
    s = report["sections"]
    assert s["gpt_train"]["error"] == "RuntimeError: boom"
    assert "timed out" in s["sim_tp8"]["error"]
    assert s["cost_model"]["error"] is None and s["cost_model"]["measured_mfu"] is None
    md = (tmp_path / "gpu.md").read_text()
    assert "**failed** (RuntimeError: boom)" in md and md.startswith("# GPU check")
    assert json.loads((tmp_path
                       / "gpu.json").read_text())["sections"]["gpt_train"]["error"] == "RuntimeError: boom"


def test_some_sections_rerun_replace_only_theirs(tmp_path, monkeypatch):
    """A GPU lent briefly: after a fix, one section rerun replaces that section of the committed report
    (same device name and sizes), the others stay, and the page says what was rerun, when and at which
    code state. On another device's report (or none) a rerun into docs/ is refused in one line, so the
    figures never mix two GPUs."""
    monkeypatch.setitem(gpu_check.RUNNERS, "cost_model", lambda st: dict(assumed_mfu=0.4, measured_mfu=None,
                                                                         measured_from=None))
    base = dict(schema=1, sizes="tiny", device="cuda", device_name="CPU (rehearsal)", torch="t", cuda=None,
                date="2026-11-27 17:30 UTC", peak_flops=None, dtype="bfloat16", total_s=1.0,
                git=dict(commit="8a5aaf4" + "0" * 33, dirty=False),
                sections=dict(decode=dict(error="kept"), cost_model=dict(error="replaced")))
    (tmp_path / "gpu.json").write_text(json.dumps(base))
    cfg = dict(gpu_check.DEFAULTS, sizes="tiny", device="cpu", out_dir=str(tmp_path), sections="cost_model")
    gpu_check.run_check(cfg, say=lambda *a: None)
    merged = json.loads((tmp_path / "gpu.json").read_text())
    assert (merged["sections"]["decode"] == dict(error="kept")
            and merged["sections"]["cost_model"]["error"] is None)
    assert merged["git"] == base["git"] and [r["sections"] for r in merged["reruns"]] == [["cost_model"]]
    md = (tmp_path / "gpu.md").read_text()
    assert "at 8a5aaf4." in md and "in place of the first run's: `cost_model`" in md, md
    assert not gpu_report.mergeable(dict(base, device_name="NVIDIA H200"), merged)  # the comparison can fail
    monkeypatch.setattr(gpu_check, "is_docs", lambda out_dir: True)  # docs/ holding another device's report
    (tmp_path / "gpu.json").write_text(json.dumps(dict(base, device_name="NVIDIA H200")))
    with pytest.raises(ConfigError, match="sections='cost_model': docs/gpu.json is not a full check on CPU"):
        gpu_check.run_check(cfg, say=lambda *a: None)


@pytest.mark.parametrize("arg, key", [("--sizes=huge", "sizes"), ("--sections=gpt_train,nope", "sections"),
                                      ("--out_dir=/nonexistent/dir", "out_dir"), ("--device=tpu", "device")])
def test_bad_options_name_key_and_value(arg, key):
    k, v = arg[2:].split("=", 1)
    with pytest.raises(ConfigError, match=f"^{key}.*{v}"):
        gpu_check.validate(dict(gpu_check.DEFAULTS, **{k: v}))


def test_bad_option_is_one_line():
    line = one_line_error(run_script("-m", "tpcomm.gpu.gpu_check", "--sizes=huge", timeout=120))
    assert line == "error: sizes must be one of ['full', 'tiny'], got 'huge'"


def test_full_sizes_need_a_gpu(tmp_path):
    with pytest.raises(ConfigError, match="sizes='full' needs a CUDA GPU"):
        gpu_check.run_check(dict(gpu_check.DEFAULTS, device="cpu", out_dir=str(tmp_path)),
                            say=lambda *a: None)
    assert not (tmp_path / "gpu.json").exists()


def test_cost_calibration_fields(tiny):
    """The shard block eager and compiled (fwd, bwd, the model's terms, an
    efficiency), the GEMMs whole and at 1/tp of the tokens, int8 and fp8 codecs beside the model's
    term; its line in gpu.md."""
    report, md, _ = tiny
    r = report["sections"]["cost_calibration"]
    assert [b["mode"] for b in r["blocks"]] == ["eager", "compiled"]
    for b in r["blocks"]:
        assert b["fwd_ms"] > 0 and b["bwd_ms"] > 0 and b["model_bwd_ms"] == pytest.approx(2
                                                                                          * b["model_fwd_ms"])
        assert 0 < b["gemm_efficiency"]
    tokens = r["shape"]["batch"] * r["shape"]["seq"]
    assert {g["m"] for g in r["gemms"]} == {tokens, tokens // r["shape"]["tp"]}
    assert [k["codec"] for k in r["codecs"]] == ["int8", "fp8"] and all(k["model_ms"] > 0
                                                                        for k in r["codecs"])
    assert "`cost_calibration`: one tp-8 shard block" in md
