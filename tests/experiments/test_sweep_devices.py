"""Sweep processes run side by side on a GPU machine each get GPUs of their own
(CUDA_VISIBLE_DEVICES in the env of the train.py they start), the gpt2 sweep runs one process per
GPU of the node, and its config does not ask wandb for a login it cannot get. No GPU needed: the
GPUs torch sees are faked and train.py is not started."""

import os
import subprocess
import threading
import time

import pytest
import torch

from tpcomm.experiments import gpu_claim, sweep, sweep_plan


class FakeProc:
    """What run_job reads of a Popen: a finished train.py that printed nothing."""
    stdout, returncode = iter(()), 0

    def wait(self):
        return 0


def job(tmp_path, name, nproc):
    return sweep.Job(sweep_plan.Run(name, "fake.py"), 1, str(tmp_path / name), [], {"max_iters": 1}, nproc)


@pytest.fixture
def eight_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_claim, "gpu_lock_dir", lambda: str(tmp_path / "gpu-locks"))


def test_runs_side_by_side_get_disjoint_gpus(eight_gpus, tmp_path, monkeypatch):
    """Three sweeps' runs at once (2, 4 and 2 processes): the first two start while the others still run, and
    every train.py is pinned to GPUs no running neighbour has; the third, started once the first ended, reuses
    the first's GPUs."""
    envs = {}
    jobs = [job(tmp_path, "a", 2), job(tmp_path, "b", 4), job(tmp_path, "c", 2)]

    def popen(cmd, *, env, **kwargs):
        envs[len(envs)] = env["CUDA_VISIBLE_DEVICES"]
        if len(envs) == 1:  # while run a trains, another sweep process starts run b
            sweep.run_job(jobs[1])
        return FakeProc()

    monkeypatch.setattr(subprocess, "Popen", popen)
    sweep.run_job(jobs[0])  # a, and inside it b
    sweep.run_job(jobs[2])  # c, after both ended
    a, b, c = (set(envs[i].split(",")) for i in range(3))
    assert len(a) == 2 and len(b) == 4 and not a & b, envs
    assert c == a  # freed when a's train.py ended
    with open(os.path.join(jobs[0].out_dir, "train.log")) as f:
        assert f"CUDA_VISIBLE_DEVICES={envs[0]}" in f.readline()  # the log says where it ran


def test_a_claim_waits_for_free_gpus_and_respects_the_users_choice(eight_gpus, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # the user gave this sweep three GPUs
    assert gpu_claim.visible_gpus() == ["4", "5", "6"]
    said = []
    with gpu_claim.GPUClaim(2) as first:
        assert first == ["4", "5"]
        waiting = gpu_claim.GPUClaim(2, poll=0.01, say=said.append)
        got = []
        t = threading.Thread(target=lambda: got.append(waiting.__enter__()))
        t.start()
        deadline = time.monotonic() + 30  # a loaded CI host may take a while to run the thread's first poll
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.is_alive() and said and "waiting for 2 free GPU(s)" in said[0]  # only "6" is free
    t.join(5)
    # any two of the user's three:
    assert len(got) == 1 and len(set(got[0])) == 2 and set(got[0]) <= {"4", "5", "6"}
    # the first claim frees "4" and "5" one after the other, so a poll between the two may take "5" and "6"
    waiting.__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="needs 4 GPUs, this sweep sees 3"):
        gpu_claim.GPUClaim(4).__enter__()


def test_cpu_runs_hold_no_gpu(eight_gpus, monkeypatch, tmp_path):
    envs = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, *, env, **kw: envs.append(env) or FakeProc())
    cpu_job = job(tmp_path, "on-cpu", 1)
    cpu_job.cfg["device"] = "cpu"
    with gpu_claim.GPUClaim(8):  # every GPU taken: a CPU run does not wait for one
        sweep.run_job(cpu_job)
    assert "CUDA_VISIBLE_DEVICES" not in envs[0]


def test_no_gpus_no_pinning(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    envs = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, *, env, **kw: envs.append(env) or FakeProc())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sweep.run_job(job(tmp_path, "cpu-run", 2))
    assert "CUDA_VISIBLE_DEVICES" not in envs[0] and gpu_claim.node_gpus() == 1


def test_gpt2_sweep_uses_the_nodes_gpus_and_no_wandb(eight_gpus, tmp_path):
    jobs = sweep.plan(sweep_plan.SWEEPS["gpt2"], sweep_dir=str(tmp_path / "gpt2"), seeds=[1337],
                      check_data=False)
    assert {j.nproc for j in jobs} == {8}
    assert all(sweep.command(j)[1:4] == ["-m", "torch.distributed.run", "--standalone"] for j in jobs)
    assert not any(j.cfg["wandb_log"] for j in jobs)  # a login it cannot ask for in a subprocess
    jobs = sweep.plan(sweep_plan.SWEEPS["gpt2"], sweep_dir=str(tmp_path / "gpt2"), seeds=[1337], nproc=4,
                      check_data=False)
    assert {j.nproc for j in jobs} == {4}  # --nproc still overrides
