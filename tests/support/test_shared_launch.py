"""The shared torchrun launch (tests/support/run_workers.py, conftest.shared_launch): a job that fails fails
only the tests that read it, with its traceback; the jobs around it run on the same process group, each from
the global RNG state of a fresh process."""

import json
import time

import pytest
import torch

from conftest import TORCHRUN, run_script, shared_launch

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


def test_a_job_failing_on_one_rank_ends_its_launch_instead_of_hanging(tmp_path):
    """Rank 1 raises while rank 0 waits in an all-reduce it will never finish: after TPCOMM_PEER_WAIT_S the
    launch ends, the error file says why, and the job after it is not run (before: the launch hung until
    conftest's timeout of 300 s a job)."""
    dirs = [tmp_path / "raise-one", tmp_path / "after"]
    jobs = [dict(dir=str(d), argv=[WORKER, mode, str(d / "results.json")]) for d,
            mode in zip(dirs, ("raise-one", "ok"))]
    for d in dirs:
        d.mkdir()
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    start = time.time()
    r = run_script(*TORCHRUN, "--nproc_per_node=2", "tests/support/run_workers.py",
                   str(tmp_path / "jobs.json"), env=dict(TPCOMM_PEER_WAIT_S="2"), timeout=120)
    assert r.returncode != 0 and time.time() - start < 100, r.stdout + r.stderr
    error = (dirs[0] / "error.rank1.txt").read_text()
    assert "fails on rank 1 alone" in error and "the launch ends here" in error
    assert not (dirs[1] / "done").exists()


def test_each_job_starts_from_a_fresh_processes_rng(healthy):
    """The job's first draws are those right after seeding with the process's initial seed, whatever jobs ran
    before it in the launch."""
    fresh = torch.rand(3, generator=torch.Generator().manual_seed(healthy["seed"])).tolist()
    assert healthy["rand"] == fresh
    # can fail
    assert torch.rand(3, generator=torch.Generator().manual_seed(healthy["seed"] + 1)).tolist() != fresh


def test_the_hand_out_order_names_test_files_and_starts_with_the_launches(request):
    """conftest.ORDER: every name a test file under tests/ (a stale name would silently order
    nothing), none twice; its first file declares the shared launches of 2 and 4 processes (the
    other worker runs lock-free files beside them); and under xdist, xdist's own reordering by test
    count is off, so ORDER is the order handed out."""
    import glob
    import importlib
    import os

    import conftest

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = {os.path.basename(p): p for p in glob.glob(os.path.join(tests, "**", "test_*.py"),
                                                       recursive=True)}
    assert [n for n in conftest.ORDER
            if n not in files] == [] and len(set(conftest.ORDER)) == len(conftest.ORDER)
    first = importlib.import_module(os.path.relpath(files[conftest.ORDER[0]], tests)[:-3].replace(os.sep,
                                                                                                  "."))
    assert {nproc for spec in first.SHARED_LAUNCHES.values() for nproc, _ in spec.values()} >= {2, 4}
    if hasattr(request.config.option, "loadscopereorder"):
        assert request.config.option.loadscopereorder is False
