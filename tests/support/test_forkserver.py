"""The tests' fork server (tests/support/forkserver.py, tests/support/forkclient.py): a script run
through it, alone or as the ranks of a torchrun launch, behaves as `python SCRIPT` would: its output,
its exit status, an uncaught exception's traceback, torchrun's environment per rank, and a timeout
that leaves no process behind."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TORCHRUN, run_script

SCRIPT = """
import os, sys, time
what = sys.argv[1]
print("rank", os.environ.get("RANK", "-"), "of", os.environ.get("WORLD_SIZE", "-"), "args", sys.argv[1:2],
      flush=True)
if what == "fail" and os.environ.get("RANK", "1") == "1":
    sys.exit(3)
if what == "raise":
    raise ValueError("bad value")
if what == "message":
    sys.exit("error: a message")
if what == "at_exit":  # what the end of the interpreter does: join threads, run atexit, write files left open
    import atexit, threading, weakref
    class Gone: pass
    gone = Gone()
    sys.dead_proxy = weakref.proxy(gone)  # kept to the end, its object gone (torch.compile leaves some such):
    del gone                              # isinstance() of it raises
    left_open = open(sys.argv[2], "w")
    left_open.write("written at exit;")
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
if what == "sleep":  # argv[2]: a folder for the pids of what must not outlive a timeout
    open(os.path.join(sys.argv[2], f"rank{os.environ['RANK']}"), "w").write(f"{os.getpid()} {os.getppid()}")
    time.sleep(600)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return str(path)


def fresh(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))


@pytest.mark.parametrize("what", ["ok", "fail", "raise", "message", "at_exit"])
def test_a_forked_run_is_a_fresh_run(script, what, tmp_path):
    """The same output, status and exit: the forked child skips the interpreter's teardown
    (forkserver.py's exit_like_python) but joins threads, runs atexit handlers and writes a file
    left open, as `python` does."""
    forked, plain = run_script(script, what, str(tmp_path / "forked")), fresh(script, what,
                                                                              str(tmp_path / "plain"))
    assert (forked.returncode, forked.stdout) == (plain.returncode, plain.stdout)
    # ValueError: bad value, or nothing
    assert forked.stderr.splitlines()[-1:] == plain.stderr.splitlines()[-1:]
    assert forked.returncode == {"ok": 0, "fail": 3, "raise": 1, "message": 1, "at_exit": 0}[what]
    if what == "at_exit":
        assert forked.stdout.splitlines()[1:] == ["thread joined", "atexit ran"], forked.stdout
        assert (tmp_path / "forked").read_text() == (tmp_path / "plain").read_text() == "written at exit;"


def test_torchrun_ranks_get_their_environment_and_output(script):
    r = run_script(*TORCHRUN, "--nproc_per_node=2", script, "ok", timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 of 2 args ['ok']", "rank 1 of 2 args ['ok']"]


def test_torchrun_reports_a_failing_rank(script):
    r = run_script(*TORCHRUN, "--nproc_per_node=2", script, "fail", timeout=120)
    # torchrun's summary names the rank's status
    assert r.returncode == 1 and "exitcode  : 3" in r.stderr, r.stderr


def test_a_timeout_leaves_no_rank_behind(script, tmp_path):
    """The test's timeout kills torchrun's agent; its ranks (forked by the server, each in a session of its
    own) and their clients (torchrun's children) must go too."""
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(*TORCHRUN, "--nproc_per_node=2", script, "sleep", str(tmp_path), timeout=8)
    pids = [int(pid) for f in ("rank0", "rank1") for pid in (tmp_path / f).read_text().split()]
    assert len(pids) == 4  # each rank's pid and its waiter's (the server's child)

    def alive():
        return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]

    deadline = time.time() + 10
    while alive() and time.time() < deadline:
        time.sleep(0.2)
    assert not alive()


PARENT = """
import json, os, subprocess, sys
child = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
out = {}
for name, extra in (("plain", {}), ("tmpdir", {"TMPDIR": sys.argv[1]}),
                    ("pythonpath", {"PYTHONPATH": sys.argv[1]}), ("hashseed", {"PYTHONHASHSEED": "7"})):
    r = subprocess.run([sys.executable, child], env=dict(os.environ, **extra), capture_output=True, text=True)
    out[name] = json.loads(r.stdout)
print(json.dumps(out))
"""
CHILD = """
import json, sys, tempfile
print(json.dumps({"forked": "torch" in sys.modules, "tmp": tempfile.gettempdir(), "path": sys.path[1]}))
"""


def test_a_forked_scripts_python_children_fork_too(tmp_path):
    """A forked script's own `python SCRIPT` children are forked (torch already imported when they start),
    with TMPDIR read afresh and PYTHONPATH's entries after the script's folder; one given PYTHONHASHSEED (read
    at an interpreter's start) is a fresh interpreter: the check can fail."""
    (tmp_path / "parent.py").write_text(PARENT)
    (tmp_path / "child.py").write_text(CHILD)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = run_script(str(tmp_path / "parent.py"), str(tmp))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["plain"]["forked"] and out["tmpdir"]["forked"] and out["tmpdir"]["tmp"] == str(tmp)
    assert out["pythonpath"]["forked"] and out["pythonpath"]["path"] == str(tmp)  # as `python` puts it
    assert not out["hashseed"]["forked"]
