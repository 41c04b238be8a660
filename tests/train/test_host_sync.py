"""train.py synchronises the host with the device only at log, evaluation and checkpoint steps:
over 10 steps of real tp 2 that are none of these, no call that would wait for a CUDA device
(tests/workers/host_sync_worker.py counts them: the collectives' event-clock reads, tensor values read by the
repository's code, device syncs). Before the fix the communication report was read at every step (its event
clock read at each). And the logged step time is the device-synchronised clock's over each log
interval, evaluation left out.
"""

import json

import train
from conftest import TINY, TORCHRUN, metrics, run_script
from tpcomm.train.runtime import DeviceClock


def test_no_host_sync_between_log_steps(char_data, tmp_path):
    out = tmp_path / "run"
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "tests/workers/host_sync_worker.py", str(tmp_path), *TINY,
                   f"--data_dir={char_data}", f"--out_dir={out}", "--model_type=distributed_gpt",
                   "--tp_size=2", "--tp_mode=real", "--block_types=['tp', 'spd']", "--max_iters=11",
                   "--log_interval=20", "--eval_interval=100", "--eval_iters=2", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    for rank in (0, 1):
        calls = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # iterations 1..10: neither logged (log_interval 20: iteration 0 is), evaluated nor saved (iteration
        # 11 is)
        assert [c for c in calls if c[0] in range(1, 11)] == [], calls
        # anti-vacuity: the counters see the syncs of the log step (its loss and report) and of the evaluation
        at_log = {what for it, what in calls if it == 0}
        assert "event read" in at_log and "device sync" in at_log and any("tolist" in w
                                                                          for w in at_log), calls
        assert any(it == "eval" for it, _ in calls), calls


def test_logged_step_time_is_the_synchronised_interval_mean(char_data, tmp_path, monkeypatch):
    """A fake device whose clock moves only inside train_step (step k takes k + 1 s) and evaluation
    (100 s): with log_interval 3 the logged time is the mean over the interval's 3 steps, evaluation
    (at 6 and 9) left out, so
    dt_ms = 1000 x the iteration (1000 at 0), read after the device's work is waited for. The old host timer
    (perf_counter around one step) logged the host's milliseconds."""
    now, syncs = [0.0], []
    step, evaluate = train.train_step, train.evaluate

    def timed_step(training, **kw):
        now[0] += training.iter_num + 1
        return step(training, **kw)

    def timed_evaluate(training):
        now[0] += 100.0
        return evaluate(training)

    monkeypatch.setattr(train, "train_step", timed_step)
    monkeypatch.setattr(train, "evaluate", timed_evaluate)
    monkeypatch.setattr(train, "DeviceClock", lambda device: DeviceClock(
        device, clock=lambda: syncs.append(now[0]) or now[0]))
    out = tmp_path / "run"
    train.main([*TINY, f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=9", "--log_interval=3",
                "--eval_interval=6"])
    logged = {r["iter"]: r for r in metrics(out) if "loss" in r}
    assert sorted(logged) == [0, 3, 6, 9]
    for it, r in logged.items():
        assert r["dt_ms"] == 1000.0 * max(it, 1), (it, r)
        assert r["tokens_per_s"] == 2 * 4 * 32 / max(it, 1)  # TINY's tokens per step over the interval's mean
    # read at the start, around each of the 3 evaluations and at each of the 4 log lines (its end and the next
    # start)
    assert len(syncs) == 1 + 2 * 3 + 2 * 4, syncs
