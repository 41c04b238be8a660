"""A fork server for the tests' script runs: `python train.py ...` without paying Python's start and
torch's import each time.

Most of a tiny script run's wall time is its imports: torch and torch._dynamo (which torch's own optimizers
and meta-device init import) took 13 s of a bad-input run's 13.5 s on a loaded 2-core host, ~2 s on a quiet
one, and the suite runs entry scripts a few hundred times. This server imports them (and numpy, tqdm) once;
each request forks a child that becomes `python SCRIPT ARGS` as the command line would make it (sys.argv,
sys.path[0], cwd, environment, stdin from /dev/null, stdout/stderr to the caller's files, its own session so a
timeout kills its whole process tree) and runs the script as `__main__` (runpy). An exception nobody catches
ends the child as it ends `python`: the interpreter prints the traceback and exits 1, atexit handlers and
non-daemon threads run. The caller gets the exit status (negative: the signal) as subprocess.run reports it.

What differs from a fresh `python`: those modules are already imported (as the scripts' own imports would make
them), and nothing else is: no repository module; and the child ends without the interpreter's teardown of
every module and object (exit_like_python: threads, atexit handlers and files left open are seen to as at any
exit). conftest.run_script therefore sends here only a script or `-m module` run with the default environment
(or one adding only variables no preloaded module reads at import, FORKABLE_ENV), torchrun's agent among them,
and a torchrun launch's ranks through tests/support/forkclient.py; so does a forked script for its own such
children (NestedPopen); `-c` code (a test may check what it imports) and runs given other variables still
start a fresh interpreter.

Protocol (one request per connection, each served by a waiter process of its own, so requests run side by
side): the client sends one JSON line {"argv", "env", "cwd"} with the child's stdin, stdout and stderr
descriptors attached (SCM_RIGHTS: conftest's are /dev/null and the test's output files, a rank's are its own);
the server answers the child's pid, then, once it exited, its wait status, each as a line. A client that hangs
up first has its child killed.
"""
import atexit
import gc
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading

FORKCLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkclient.py")
# Variables no module this server preloads (torch, numpy, tqdm) reads at import: a run whose environment adds
# only these is forked like one with the default environment. torchrun's (read at init_process_group), Hugging
# Face's (read when transformers or huggingface_hub is imported, in the child) and TMPDIR (become() clears
# tempfile's cached directory, which a fresh interpreter computes at its first use), and PYTHONPATH (run()
# puts its entries after the script's folder, as an interpreter's start does; the preloaded modules stay the
# server's).
FORKABLE_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "TMPDIR", "PYTHONPATH",
                "TPCOMM_FORKSERVER"}
# the server's own (conftest starts it with them)
SERVER_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def through_server(cmd, env, server):
    """(cmd, env) for subprocess: `python SCRIPT ...` or `python -m ...` rewritten to go through this
    server (`server`: its socket) with tests/support/forkclient.py standing in for the interpreter, a
    torchrun launch's ranks too; any other command, or an environment adding variables beyond
    FORKABLE_ENV to this process's, unchanged."""
    base = os.environ
    changed = {k for k in set(base) | set(env or {}) if env is not None and base.get(k) != env.get(k)
               and (k not in SERVER_ENV or env.get(k) != SERVER_ENV[k])}
    if not (isinstance(cmd, list) and cmd[:1] == [sys.executable] and len(cmd) > 1 and (
            cmd[1] == "-m" or cmd[1].endswith(".py")) and changed <= FORKABLE_ENV):
        return cmd, env
    rest = cmd[1:]
    if rest[:2] == ["-m", "torch.distributed.run"]:
        rest = rest[:2] + ranks_through_client(rest[2:])
    return [sys.executable, FORKCLIENT, *rest], dict(base if env is None else env, TPCOMM_FORKSERVER=server)


def ranks_through_client(torchrun_args):
    """torchrun's arguments with tests/support/forkclient.py as the script, the script (or
    torchrun's `-m MODULE`) its arguments: each rank is then forked by the server. torchrun's own
    options come first, all as --key=value."""
    args = list(torchrun_args)
    for i, arg in enumerate(args):
        # the script, or torchrun's --module: the client runs `-m MODULE`
        if arg == "-m" or not arg.startswith("-"):
            return args[:i] + [FORKCLIENT] + args[i:]
    raise ValueError(f"no script in a torchrun command line: {torchrun_args}")


class NestedPopen(subprocess.Popen):
    """subprocess.Popen (and so subprocess.run) in a child whose request names the server (TPCOMM_FORKSERVER):
    a script's own `python SCRIPT ...` children (a sweep's train.py runs, gpu-scale's copies of itself, a
    torchrun launch and its ranks) are forked from the server too, as conftest.run_script's are."""

    def __init__(self, args, *rest, env=None, **kwargs):
        args, env = through_server(args, env, os.environ["TPCOMM_FORKSERVER"])
        super().__init__(args, *rest, env=env, **kwargs)


def serve(path):
    """Answer requests forever, each in a waiter process of its own (so a torchrun launch's ranks start
    together); returns only in a forked script child, its request set up as `python ARGV` would be."""
    # what is imported stays put: children share its pages, and gc.get_objects() lists only their own
    gc.freeze()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters, reaped by the kernel
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return waiter(conn)
        conn.close()


def waiter(conn):
    """Read the request and the caller's stdin/stdout/stderr descriptors, fork the script child, answer its
    pid and then its wait status; kill it if the caller hangs up first. Returns the request in the child."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        if not chunk:
            os._exit(0)
        data, fds = data + chunk, fds + got
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        conn.close()
        become(request, fds)
        return request["argv"]
    for fd in fds:
        os.close(fd)
    exited = os.pidfd_open(pid)  # readable once the child exits (Linux), so the wait below wakes at once
    try:
        conn.sendall(f"{pid}\n".encode())
        while True:
            ready = select.select([conn, exited], [], [])[0]
            if exited in ready:
                conn.sendall(f"{os.waitpid(pid, 0)[1]}\n".encode())
                break
            if not conn.recv(1):  # the caller hung up (or was killed) first
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
    except OSError:  # the caller gave up (its timeout killed the child) and hung up
        pass
    os._exit(0)


def become(request, fds):
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    # the caller's stdin, stdout, stderr (a torchrun rank's: the agent's, shared)
    for fd, opened in enumerate(fds):
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # computed again from this environment's TMPDIR at first use, as in a fresh interpreter
    tempfile.tempdir = None
    # a fresh interpreter's numpy draws its own seed; forked children would share
    sys.modules["numpy"].random.seed()
    # the server's (preload() imported numpy)
    if "TPCOMM_FORKSERVER" in os.environ:
        subprocess.Popen = NestedPopen


def run(argv):
    """What `python ARGV` runs: a script file or `-m module`, with PYTHONPATH's entries after its folder."""
    sys.path[0] = os.getcwd() if argv[0] == "-m" else os.path.dirname(os.path.abspath(argv[0]))
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in dict.fromkeys(extra) if p not in sys.path]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


def exit_like_python(code):
    """End the child as the interpreter's exit would, less its teardown of every module and object: with
    torch loaded that took 1.5 s of a trivial script's 1.6 s (the agent and each rank of a torchrun
    launch pay it too). What a script can see of an exit still happens: non-daemon threads are joined,
    atexit handlers run, and every open file's buffer is flushed (a file left open is written as at
    exit); then the process ends with `code`."""
    threading._shutdown()  # what Py_FinalizeEx does first
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # the child's own objects (the server's are frozen)
        try:
            # type(): isinstance() of a dead proxy raises
            if issubclass(type(obj), io.IOBase) and not obj.closed:
                obj.flush()
        except Exception:  # noqa: B902 (a file that cannot be flushed is not written at exit either)
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def preload():
    """What the children would import first, imported once, in the server only (conftest imports
    this module for its constants alone: the pytest process that only hands out tests to xdist's
    workers never needs torch)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401
    # torch.optim and meta-device init import it: most of the rest of the start
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401  (every script and torchrun's agent import it)
    import tqdm  # noqa: F401  (the training scripts' progress bars)


def main(path):
    preload()
    argv = serve(path)  # returns in a forked child only
    try:
        run(argv)
    # as the interpreter handles it: None is 0, an int is the status, anything else printed
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            exit_like_python(e.code or 0)
        print(e.code, file=sys.stderr)
        exit_like_python(1)
    except Exception:  # noqa: B902 (uncaught: the traceback, status 1, as `python` ends)
        sys.excepthook(*sys.exc_info())
        exit_like_python(1)
    exit_like_python(0)  # KeyboardInterrupt and the like end as the interpreter ends them (raised, above)


if __name__ == "__main__":
    main(sys.argv[1])
