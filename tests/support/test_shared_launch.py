"""The shared torchrun launch (tests/support/run_workers.py, conftest.shared_launch): a job that fails fails only the
tests that read it, with its traceback; the jobs around it run on the same process group, each from the global
RNG state of a fresh process."""

import json

import pytest
import torch

from conftest import shared_launch

WORKER = "tests/workers/shared_launch_worker.py"
SHARED_LAUNCHES = {
    "failing": {None: (2, [WORKER, "raise", "{dir}/results.json"])},
    "healthy": {None: (2, [WORKER, "ok", "{dir}/results.json"])},
}


@pytest.fixture(scope="module")
def failing(request):
    with pytest.raises(AssertionError) as e:
        shared_launch(request, SHARED_LAUNCHES)
    return str(e.value)


@pytest.fixture(scope="module")
def healthy(request):
    with open(shared_launch(request, SHARED_LAUNCHES) / "results.json") as f:
        return json.load(f)


def test_a_failing_job_reports_its_traceback_on_every_rank(failing):
    assert "shared_launch_worker.py raise" in failing
    for rank in (0, 1):
        assert f"error.rank{rank}.txt" in failing
    assert "RuntimeError: this job fails on purpose" in failing


def test_the_other_jobs_run_on_the_process_group(failing, healthy):
    assert healthy["world"] == 2 and healthy["sum"] == 1 + 2  # a real all-reduce over both ranks


def test_each_job_starts_from_a_fresh_processes_rng(healthy):
    """The job's first draws are those right after seeding with the process's initial seed, whatever jobs ran
    before it in the launch."""
    fresh = torch.rand(3, generator=torch.Generator().manual_seed(healthy["seed"])).tolist()
    assert healthy["rand"] == fresh
    assert torch.rand(3, generator=torch.Generator().manual_seed(healthy["seed"] + 1)).tolist() != fresh  # can fail
