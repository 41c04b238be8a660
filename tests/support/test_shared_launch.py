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


def test_the_hand_out_order_names_test_files_and_starts_with_the_launches(request):
    """conftest.ORDER: every name a test file under tests/ (a stale name would silently order nothing), none twice;
    its first file declares the shared launches of 2 and 4 processes (the other worker runs lock-free files beside
    them); and under xdist, xdist's own reordering by test count is off, so ORDER is the order handed out."""
    import glob
    import importlib
    import os

    import conftest

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = {os.path.basename(p): p for p in glob.glob(os.path.join(tests, "**", "test_*.py"), recursive=True)}
    assert [n for n in conftest.ORDER if n not in files] == [] and len(set(conftest.ORDER)) == len(conftest.ORDER)
    first = importlib.import_module(os.path.relpath(files[conftest.ORDER[0]], tests)[:-3].replace(os.sep, "."))
    assert {nproc for spec in first.SHARED_LAUNCHES.values() for nproc, _ in spec.values()} >= {2, 4}
    if hasattr(request.config.option, "loadscopereorder"):
        assert request.config.option.loadscopereorder is False
