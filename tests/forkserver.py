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
them), and nothing else is: no repository module. conftest.run_script therefore sends here only a script or `-m module` run with the default
environment; `-c` code (a test may check what it imports), torchrun launches and runs given their own environment
still start a fresh interpreter.

Protocol (one request per connection, handled one at a time: an xdist worker runs its tests one at a time):
the client sends one JSON line {"argv", "env", "cwd", "stdout", "stderr"}; the server answers the child's pid,
then, once it exited, its wait status, each as a line.
"""
import json
import os
import runpy
import signal
import socket
import sys

import numpy as np
import torch
import torch._dynamo  # noqa: F401  (imported by the package's torch.compiler.disable; most of the rest of the start)
import torch.distributed  # noqa: F401
import tqdm  # noqa: F401


def serve(path):
    """Answer requests forever; returns only in a forked child, set up as `python ARGV` would be."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    while True:
        conn, _ = server.accept()
        with conn.makefile("r") as f:
            request = json.loads(f.readline())
        pid = os.fork()
        if pid == 0:
            server.close()
            conn.close()
            become(request)
            return request["argv"]
        try:
            conn.sendall(f"{pid}\n".encode())
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
        try:
            conn.sendall(f"{status}\n".encode())
        except OSError:  # the caller gave up (its timeout killed the child) and hung up
            pass
        conn.close()


def become(request):
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    for fd, name, mode in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                           (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(name, mode)
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


if __name__ == "__main__":
    run(serve(sys.argv[1]))
