"""The in-place runtime's fork server: `python -m ddlrepro.rank.elastic.forkserver SOCKET MODULE...`.

A cold joiner would spend most of its start importing Python's and torch's modules (torch, and torch._dynamo, which
its first optimizer imports: about 2 s of a 2.2 s cold grow here). The fork server imports them once, when the job
starts, and then forks a joiner on request: the child starts with everything imported, takes its own output pipes,
process group (made before its pid is answered) and environment, and runs its module as `python -m MODULE ARGS...`
would (runpy). The server forks before any thread, process group or OpenMP pool exists in it: it only imports,
listens and waits, in one thread. (The same way `multiprocessing`'s forkserver start method and Ray's worker pools
avoid the cost.)

The protocol, one connection per child on a unix socket only this user can reach: the client sends the child's
stdout and stderr descriptors (SCM_RIGHTS) with a one-byte message, then one JSON line `{"module", "argv", "env"}`;
the server answers the child's pid, and later its exit code (Popen's convention: -N for signal N), one line each.
The server exits when its parent does, or on SIGTERM.
"""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # a rank starting: no collections while it loads its libraries (startup.py)
    startup.pause_collection()

import contextlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback

REQUEST_LIMIT = 1 << 20  # one JSON request line (a point's JSON is a few KB)
POLL_S = 0.05  # how often finished children are reaped and the parent checked
FORKED_ENV = "DDLREPRO_FORKED"  # set in a forked child: its worker record says how it started
READY = "ready"


def serve(path: str, preload: list[str]) -> None:
    """Import `preload`, listen on `path`, and fork children until the parent goes."""
    # frozen before any fork, as CPython advises: a child's collections never write to them
    startup.resume_collection(after_loading=preload)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    print(READY, flush=True)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        readable, _, _ = select.select([listener], [], [], POLL_S)
        if readable:
            connection, _ = listener.accept()
            pid = fork_child(connection, listener, children)
            if pid is not None:
                children[pid] = connection
        report_exits(children)


def fork_child(connection: socket.socket, listener: socket.socket, children: dict[int, socket.socket]) -> int | None:
    """Read one request and fork its child; the child's pid (sent back too), or None for a bad request."""
    try:
        _, descriptors, _, _ = socket.recv_fds(connection, 1, 2)
        request = json.loads(read_line(connection))
        if len(descriptors) != 2:
            raise ValueError(f"expected the child's stdout and stderr, got {len(descriptors)} descriptors")
    except (OSError, ValueError) as error:
        connection.sendall(f"refused: {error}\n".encode())
        connection.close()
        return None
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in [connection, *children.values()]:
            other.close()
        run_child(request, *descriptors)
    with contextlib.suppress(OSError):  # the child does the same: whichever runs first, the group exists below
        os.setpgid(pid, pid)
    for descriptor in descriptors:
        os.close(descriptor)
    connection.sendall(f"{pid}\n".encode())
    return pid


def read_line(connection: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk or len(data) + len(chunk) > REQUEST_LIMIT:
            raise ValueError("the request ended early or is too long")
        data += chunk
    return data.decode()


def run_child(request: dict, stdout: int, stderr: int) -> None:
    """In the forked child: its own process group (the launchers stop a worker's group), output and environment,
    then its module as `python -m` runs it."""
    os.setpgid(0, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.close(stdout)
    os.close(stderr)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.update(request["env"], **{FORKED_ENV: "1"})
    sys.argv = [request["module"], *request["argv"]]
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as leaving:
        if isinstance(leaving.code, str):
            print(leaving.code, file=sys.stderr)
        code = leaving.code if isinstance(leaving.code, int) else int(leaving.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never back into the server's loop, and no interpreter teardown


def report_exits(children: dict[int, socket.socket]) -> None:
    """Send each finished child's exit code on its connection."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):  # the client is gone: nobody waits for this one
                connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            connection.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
