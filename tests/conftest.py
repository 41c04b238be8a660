import atexit
import fcntl
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# The repository, and every folder of tests/ (it mirrors tpcomm/'s subpackages, docs/tests.md): a test imports
# another's helpers by its module name (`from test_tensor_parallel import make_gpt`), wherever that file
# lives; basenames are unique across the folders (pytest imports each test file as a top-level module of its
# name).
TEST_FOLDERS = sorted(d for d, _, files in os.walk(TESTS) if "__pycache__" not in d and any(
    f.endswith(".py") for f in files))
sys.path[:0] = [ROOT] + [d for d in TEST_FOLDERS if d not in sys.path]

from forkserver import (FORKABLE_ENV, SERVER_ENV, ranks_through_client,  # noqa: E402 (tests/support)
                        through_server)

# Bytecode for every process the tests start (the fork server's children import the repository's modules anew:
# compiling their source took 0.8 s of a 1.5 s `experiment.py --dry-run` where PYTHONDONTWRITEBYTECODE is
# set), kept outside the clone (PYTHONPYCACHEPREFIX mirrors each source's path; a changed source is compiled
# again).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), f"tpcomm-pycache-{os.getuid()}")
sys.dont_write_bytecode, sys.pycache_prefix = False, os.environ["PYTHONPYCACHEPREFIX"]

# torch.compile's disk caches (inductor's C++ kernels, FX graphs, AOTAutograd's) start empty in each pytest
# process and every process it starts, as on a clean CI machine: the inductor test took 8 s on a cache an
# earlier run had left in the shared default folder and 122 s without one (docs/tests.md), so a warm cache hid
# the suite's own time.
INDUCTOR_CACHE = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpcomm-inductor-")
atexit.register(lambda pid=os.getpid(): os.getpid() == pid and shutil.rmtree(INDUCTOR_CACHE,
                                                                             ignore_errors=True))


def run_script(*args, env=None, timeout=600):
    """Run a repo script as a user would; returns the CompletedProcess. A script or `-m module` run
    with the default environment, or one adding only FORKABLE_ENV's variables, goes through the fork
    server (tests/support/forkserver.py: the same process, without a new torch import); so do a
    torchrun launch's agent and, through tests/support/forkclient.py, its ranks, and the script's own
    `python SCRIPT` children."""
    full_env = dict(os.environ, **SERVER_ENV, **(env or {}))
    if set(env or ()) <= FORKABLE_ENV and (args[0].endswith(".py") or args[0] == "-m"):
        argv = list(args)
        if argv[:2] == ["-m", "torch.distributed.run"]:
            argv[2:] = ranks_through_client(argv[2:])
        return _forked(argv, dict(full_env, TPCOMM_FORKSERVER=_server_path()), timeout)
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def fork_server_for_children(monkeypatch, module):
    """`module`'s own subprocess.Popen and subprocess.run of `python SCRIPT ...` or `python -m ...` (a sweep's
    train.py runs, the calibration's torchrun launch, and their ranks) go through the fork server, as
    run_script's do (forkserver.through_server)."""
    def popen(cmd, *args, env=None, **kwargs):
        cmd, env = through_server(cmd, env, _server_path())
        return subprocess.Popen(cmd, *args, env=env, **kwargs)

    def run(cmd, *args, env=None, **kwargs):
        cmd, env = through_server(cmd, env, _server_path())
        return subprocess.run(cmd, *args, env=env, **kwargs)

    shim = types.ModuleType("subprocess")
    shim.__dict__.update(vars(subprocess))
    shim.Popen, shim.run = popen, run
    monkeypatch.setattr(module, "subprocess", shim)


_server = {}


def _server_path():
    """The fork server's socket; one server per pytest process, started at its first script run."""
    if "proc" not in _server:
        path = f"/tmp/tpcomm-forkserver-{os.getpid()}.sock"
        if os.path.exists(path):
            os.unlink(path)
        proc = subprocess.Popen([sys.executable, os.path.join(TESTS, "support", "forkserver.py"), path],
                                cwd=ROOT, env=dict(os.environ, **SERVER_ENV))
        deadline = time.time() + 300
        while not os.path.exists(path) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        _server.update(proc=proc, path=path)
        atexit.register(lambda: (proc.kill(), os.path.exists(path) and os.unlink(path)))
    if _server["proc"].poll() is not None:
        raise RuntimeError(f"the tests' fork server (tests/support/forkserver.py) exited with "
                           f"{_server['proc'].returncode}")
    return _server["path"]


def _forked(args, env, timeout):
    path = _server_path()
    with tempfile.TemporaryDirectory() as d:
        out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s, open(os.devnull) as stdin, \
                open(out, "w") as stdout, open(err, "w") as stderr:
            s.connect(path)
            s.settimeout(timeout)
            request = json.dumps(dict(argv=args, env=env, cwd=ROOT)) + "\n"
            socket.send_fds(s, [request.encode()], [stdin.fileno(), stdout.fileno(), stderr.fileno()])
            f = s.makefile("r")
            pid = int(f.readline())  # a server that died mid-request answers '': ValueError, a failed test
            try:
                status = int(f.readline())
            except TimeoutError:
                os.killpg(pid, signal.SIGKILL)  # the server reaps it
                raise subprocess.TimeoutExpired([sys.executable, *args], timeout, open(out).read(),
                                                open(err).read())
        return subprocess.CompletedProcess([sys.executable, *args], os.waitstatus_to_exitcode(status),
                                           open(out).read(), open(err).read())


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    """A tiny character-level dataset made from the repo's own text."""
    d = tmp_path_factory.mktemp("chardata")
    text = open(os.path.join(ROOT, "model.py")).read() * 4
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(0.9 * len(ids))
    ids[:n].tofile(d / "train.bin")
    ids[n:].tofile(d / "val.bin")
    with open(d / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return str(d)


# A tiny train.py run. gradient_accumulation_steps: 2, not train.py's 40 (nanoGPT's 5 x 8), which made 95% of
# a tiny run's compute; 2 keeps accumulation in every run and divides over 2 data-parallel ranks (4 need their
# own).
TINY = ["--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=2", "--n_head=4", "--n_embd=32",
        "--block_size=32", "--batch_size=4", "--eval_iters=4", "--log_interval=1", "--warmup_iters=5",
        "--dropout=0.0", "--gradient_accumulation_steps=2"]


def one_line_error(r, status=2):
    """The one stderr line of a script that failed as a user error should (exit
    status `status`, no traceback)."""
    assert r.returncode == status, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


# ---------- train.py runs compared through their metrics.jsonl ----------

TORCHRUN = ["-m", "torch.distributed.run", "--standalone"]


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return list(map(json.loads, f))


def losses(out_dir):
    return {r["iter"]: r["loss"] for r in metrics(out_dir) if "loss" in r}


def val_losses(out_dir):
    return {r["iter"]: r["val_loss"] for r in metrics(out_dir) if "val_loss" in r}


def train(out_dir, data, *extra, nproc=None):
    """train.py [a config file: extra's first] TINY data_dir out_dir [the rest of extra]."""
    config = [extra[0]] if extra and extra[0].endswith(".py") else []
    args = ["train.py", *config, *TINY, f"--data_dir={data}", f"--out_dir={out_dir}", *extra[len(config):]]
    if nproc:
        args = [*TORCHRUN, f"--nproc_per_node={nproc}", *args]
    r = run_script(*args, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    return r


def assert_same(a, b, rel, what):
    assert sorted(a) == sorted(b) and a, (what, sorted(a), sorted(b))
    for it in a:
        assert b[it] == pytest.approx(a[it], rel=rel), (what, it, a[it], b[it])


def differs(a, b, rel):
    """a and b are told apart at tolerance rel (the comparison above would fail)."""
    return any(b[it] != pytest.approx(a[it], rel=rel) for it in a)


# ---------- shared torchrun launches (tests/support/run_workers.py) ----------
# A test module declares the multi-process jobs its fixtures need, as data:
#     SHARED_LAUNCHES = {"fixture_name": {param: (nproc, [script, arg, ...])}}   (param None: no params)
# where "{dir}" in an argument becomes the job's own output folder, and the fixture's body is one line:
#     return json.load(open(shared_launch(request, SHARED_LAUNCHES) / "results.json"))["results"]
# Every job of one world size that the selected tests need runs in one torchrun launch (run_workers.py), once
# per session, also under pytest-xdist (the workers share the folder and take turns through a lock file).

def _declared_jobs(item):
    """(nproc, argv) of the shared-launch jobs the fixtures of this collected test need."""
    jobs = []
    for name, defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).items():
        module = sys.modules.get(getattr(defs[-1].func, "__module__", ""))
        spec = getattr(module, "SHARED_LAUNCHES", {}).get(name)
        if spec:
            param = getattr(item, "callspec", None) and item.callspec.params.get(name)
            jobs += [spec[param]] if param in spec else list(spec.values())
    return jobs


def pytest_collection_finish(session):
    needed = {}
    for item in session.items:
        for nproc, argv in _declared_jobs(item):
            needed.setdefault(nproc, {})[json.dumps(argv)] = list(argv)
    session.config.shared_launch_jobs = {n: list(jobs.values()) for n, jobs in needed.items()}


def _launch_root(tmp_path_factory):
    """One folder per pytest session, shared by its xdist workers (each has its own basetemp below it)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared_launches"
    root.mkdir(exist_ok=True)
    return root


def _job_dir(root, nproc, argv):
    key = hashlib.sha1(json.dumps([nproc, argv]).encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9]+", "_", " ".join(os.path.basename(a) for a in argv[:2] if "{dir}" not in a))
    return root / f"{nproc}procs_{slug.strip('_')}_{key}"


def shared_launch(request, launches):
    """The output folder of this fixture's job (launches[request.fixturename][param]), run in the shared
    launch of its world size; the job's traceback (and the launch's log) if it failed."""
    nproc, argv = launches[request.fixturename][getattr(request, "param", None)]
    config = request.config
    root = _launch_root(request.getfixturevalue("tmp_path_factory"))
    mine = _job_dir(root, nproc, argv)
    with open(root / f"{nproc}procs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another xdist worker may be running this world's launch now
        if not (mine / "launch").exists():
            jobs = [j for j in getattr(config, "shared_launch_jobs", {}).get(nproc, []) if j != list(argv)]
            jobs = [list(argv)] + [j for j in jobs if not (_job_dir(root, nproc, j) / "launch").exists()]
            _run_launch(root, nproc, jobs)
    errors = sorted(mine.glob("error.rank*.txt"))
    log = (mine / "launch").read_text()
    if errors or not (mine / "done").exists():
        detail = "".join(f"--- {e.name}\n{e.read_text()}" for e in errors) or (
            "the job did not finish (not run when an earlier job of the launch ended it: see the log)")
        raise AssertionError(f"{' '.join(argv)} in {os.path.basename(log)} failed:\n{detail}\n--- launch log "
                             "tail\n" + open(log).read()[-5000:])
    return mine


def _run_launch(root, nproc, jobs):
    specs = []
    for argv in jobs:
        d = _job_dir(root, nproc, argv)
        d.mkdir(exist_ok=True)
        specs.append(dict(dir=str(d), argv=[a.replace("{dir}", str(d)) for a in argv]))
    n = len(list(root.glob(f"launch{nproc}procs_*.json")))
    jobs_file, log = root / f"launch{nproc}procs_{n}.json", root / f"launch{nproc}procs_{n}.log"
    jobs_file.write_text(json.dumps(specs, indent=1))
    start = time.time()
    try:  # each job was given 300-400 s as a launch of its own
        r = run_script(*TORCHRUN, f"--nproc_per_node={nproc}", "tests/support/run_workers.py", str(jobs_file),
                       timeout=300 * len(jobs))
        text = f"exit status {r.returncode}\n{r.stdout}\n{r.stderr}"
    except subprocess.TimeoutExpired as e:
        text = f"timed out after {e.timeout} s\n{e.stdout}\n{e.stderr}"
    log.write_text(f"{time.time() - start:.1f} s, {len(jobs)} jobs\n{text}")
    for spec in specs:
        with open(os.path.join(spec["dir"], "launch"), "w") as f:
            f.write(str(log))


def pytest_configure(config):
    # pytest-xdist hands out the files with the most tests first
    if hasattr(config.option, "loadscopereorder"):
        # unless told not to (3.8+); ORDER above is the order we want
        config.option.loadscopereorder = False
    config.addinivalue_line("markers", "fast: in `make test-fast`, the few-minute tier (README, Tests)")
    config.addinivalue_line("markers", "slow: minutes on 2 cores; in the full suite only")


# `make test-fast` (pytest -m fast): each block type against the reference, sim == real at tp 2, torch.compile
# tracing once, one train / resume / sample round, the documented commands, bad input at tiny sizes. A file
# maps to None (all its tests) or to the test names (a parametrized test: all its cases, or those whose id
# holds the given text after '['). Names are matched exactly (a parametrized test by its function name), or by
# prefix when they hold '['.
FAST = {"test_model.py": None, "test_tensor_parallel.py": None, "test_generate.py": None,
        "test_configurator.py": None, "test_docs.py": None,
        "test_compile.py": ["test_compiled_traces_once_and_equals_eager",
                            "test_recompile_detection_can_fail"],
        "test_real_tp.py": ["test_logits_loss_and_gradients_match_simulation[tp2",
                            "test_dropout_masks_match_simulation[tp2", "test_comparisons_can_fail[tp2",
                            "test_bad_launch_outside_torchrun"],
        "test_train.py": ["test_resume_reproduces_uninterrupted_run", "test_bad_input_one_line_exit_2",
                          "test_bad_input_keeps_checkpoint"],
        "test_sample.py": ["test_sample_from_a_checkpoint", "test_sample_bad_input",
                           "test_sample_bad_settings"], "test_bench.py": ["test_bad_values_are_one_line",
                                                                          "test_cli_error_has_no_traceback"],
        "test_checkpoints.py": ["test_unreadable_checkpoint_is_one_line",
                                "test_nanogpt_reads_our_checkpoint"],
        "test_overlap.py": ["test_chunked_equals_unchunked_and_the_per_shard_reference",
                            "test_dropout_masks_are_the_unchunked_ones",
                            "test_keep_mask_rows_are_the_whole_masks_rows",
                            "test_counts_k_times_the_all_reduces_each_1_over_k_of_the_bytes",
                            "test_config_refuses_bad_tp_overlap"],
        "test_sequence_parallel.py": ["test_equals_the_per_shard_reference", "test_dropout_equals_without_sp",
                                      "test_counts_reduce_scatters_and_all_gathers_apart",
                                      "test_config_refuses_ladder_and_overlap",
                                      "test_activation_prediction_is_megatrons_formula"],
        "test_compression.py": ["test_roundtrip_error_bounds", "test_off_is_the_plain_all_reduce_bit_for_bit",
                                "test_simulated_equals_per_shard_reference[tp-parallel-ladder-ladder-int8",
                                "test_counted_bytes_are_the_compressed_payload",
                                "test_config_refuses_bad_compression",
                                "test_real_tp2_equals_simulated[int8"],}


# The order xdist hands the files out in (--dist loadfile: one file per worker at a time, in collection order,
# as pytest_configure below turns off xdist's own reordering by test count). test_real_tp.py goes first: its
# first two tests start the shared launches of 2 and 4 processes (~270 s of both cores, every job of that size
# in the session). Beside them the other worker runs the files that need no shared launch, longest first; a
# file that needs one would wait on its lock with the core idle. Then the files whose launches are done (or
# that launch their own torchrun), longest first; the rest, a few seconds each, in pytest's order, so the
# workers end together.
ORDER = ["test_real_tp.py", "test_experiment.py", "test_checkpoints.py", "test_figures.py",
         "test_train_reliability.py", "test_prepare.py", "test_hostile_inputs.py", "test_entry_points.py",
         "test_train_fsdp.py", "test_train_pipeline.py", "test_backward_overlap.py",
         "test_compiled_real_tp.py", "test_compile.py", "test_pipeline.py", "test_gpu_check.py",
         "test_gpu_node.py", "test_gpu_scale.py", "test_forkserver.py", "test_trace.py", "test_house.py",
         "test_ladder.py", "test_bench.py", "test_train.py"]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = FAST.get(os.path.basename(str(item.fspath)), ())
        if names is None or any(item.name.startswith(n) if "[" in n else item.originalname == n
                                for n in names):
            item.add_marker("fast")
    result = yield  # -m and -k deselect, pytest groups parametrized fixtures
    order = {name: i for i, name in enumerate(ORDER)}
    # stable: within a file
    items.sort(key=lambda item: order.get(os.path.basename(str(item.fspath)), len(order)))
    # pytest's order stays
    return result
