"""A fork server for the tests' script runs: `python train.py ...` without paying Python's start and torch's import
each time.

Most of a tiny script run's wall time is its imports: torch and torch._dynamo (which the package's
`torch.compiler.disable` imports) took 13 s of a bad-input run's 13.5 s on a loaded 2-core host, ~2 s on a quiet one,
and the suite runs entry scripts a few hundred times. This server imports them (and numpy, tqdm) once; each request forks
a child that becomes `python SCRIPT ARGS` as the command line would make it (sys.argv, sys.path[0], cwd,
environment, stdin from /dev/null, stdout/stderr to the caller's files, its own session so a timeout kills its
whole process tree) and runs the script as `__main__` (runpy). An exception nobody catches ends the child as it ends
`python`: the interpreter prints the traceback and exits 1, atexit handlers and non-daemon threads run. The caller
gets the exit status (negative: the signal) as subprocess.run reports it.

What differs from a fresh `python`: those modules are already imported (as the scripts' own imports would make
them), and nothing else is: no repository module; and the child ends without the interpreter's teardown of every
module and object (exit_like_python: threads, atexit handlers and files left open are seen to as at any exit). conftest.run_script therefore sends here only a script or
`-m module` run with the default environment (or one adding only variables no preloaded module reads at import,
conftest.FORKABLE_ENV), torchrun's agent among them, and a torchrun launch's ranks through
tests/support/forkclient.py; `-c` code (a test may check what it imports) and runs given other variables still start
a fresh interpreter.

Protocol (one request per connection, each served by a waiter process of its own, so requests run side by side):
the client sends one JSON line {"argv", "env", "cwd"} with the child's stdin, stdout and stderr descriptors
attached (SCM_RIGHTS: conftest's are /dev/null and the test's output files, a rank's are its own); the server
answers the child's pid, then, once it exited, its wait status, each as a line. A client that hangs up first has
its child killed.
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
import sys
import threading

import numpy as np
import torch
import torch._dynamo  # noqa: F401  (imported by the package's torch.compiler.disable; most of the rest of the start)
import torch.distributed  # noqa: F401  (preloaded for the children: every script and torchrun's agent import it)
import tqdm  # noqa: F401  (preloaded for the children: the training scripts' progress bars)


def serve(path):
    """Answer requests forever, each in a waiter process of its own (so a torchrun launch's ranks start together);
    returns only in a forked script child, its request set up as `python ARGV` would be."""
    gc.freeze()  # what is imported stays put: children share its pages, and gc.get_objects() lists only their own
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
    """Read the request and the caller's stdin/stdout/stderr descriptors, fork the script child, answer
    its pid and then its wait status; kill it if the caller hangs up first. Returns the request in the child."""
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
    for fd, opened in enumerate(fds):  # the caller's stdin, stdout, stderr (a torchrun rank's: the agent's, shared)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    np.random.seed()  # a fresh interpreter's numpy draws its own seed; forked children would share the server's


def run(argv):
    """What `python ARGV` runs: a script file or `-m module`."""
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def exit_like_python(code):
    """End the child as the interpreter's exit would, less its teardown of every module and object: with torch
    loaded that took 1.5 s of a trivial script's 1.6 s (the agent and each rank of a torchrun launch pay it too).
    What a script can see of an exit still happens: non-daemon threads are joined, atexit handlers run, and every
    open file's buffer is flushed (a file left open is written as at exit); then the process ends with `code`."""
    threading._shutdown()  # what Py_FinalizeEx does first
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # the child's own objects (the server's are frozen)
        try:
            if issubclass(type(obj), io.IOBase) and not obj.closed:  # type(): isinstance() of a dead proxy raises
                obj.flush()
        except Exception:  # noqa: B902 (a file that cannot be flushed is not written at exit either)
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(path):
    argv = serve(path)  # returns in a forked child only
    try:
        run(argv)
    except SystemExit as e:  # as the interpreter handles it: None is 0, an int is the status, anything else printed
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
