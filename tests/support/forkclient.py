"""`python tests/support/forkclient.py SCRIPT ARGS` (or `-m MODULE ARGS`) behaves as `python SCRIPT
ARGS`, the script run by a child of the tests' fork server (tests/support/forkserver.py) rather than by a
new interpreter that imports torch.

conftest.run_script puts it in front of the script of a torchrun launch: torchrun starts this client per rank
(a Python start without torch, tens of milliseconds), and the client hands its environment (torchrun's RANK,
WORLD_SIZE, MASTER_PORT, ...), working directory and standard streams (the descriptors themselves, so the
ranks share the agent's output as they would) to the server, which forks the rank from its preloaded process.
The client then stands in for the rank: it exits with the rank's status (a signal as that signal), and a
SIGTERM or SIGINT from torchrun is passed on to the rank's process group, and so is the agent's death (a
test's timeout kills the agent, whose ranks live in sessions of their own: Linux's parent-death signal). If
the client is killed outright, the server's waiter sees the connection close and kills the rank.
"""
import ctypes
import json
import os
import signal
import socket
import sys


def main(argv):
    agent, path = os.getppid(), os.environ["TPCOMM_FORKSERVER"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        request = dict(argv=argv, env=dict(os.environ), cwd=os.getcwd())
        socket.send_fds(s, [(json.dumps(request) + "\n").encode()], [0, 1, 2])
        f = s.makefile("r")
        pid = int(f.readline())

        def forward(sig, _frame):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM here when the agent dies
        if os.getppid() != agent:  # it died before that
            forward(signal.SIGTERM, None)
        code = os.waitstatus_to_exitcode(int(f.readline()))
    if code < 0:  # killed by a signal: end the same way, so torchrun reports what a plain rank would
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
