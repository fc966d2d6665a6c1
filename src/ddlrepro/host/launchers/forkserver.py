"""The host side of the in-place runtime's fork server (rank/elastic/forkserver.py): started with the job, it hands
back cold joiners as `Started` processes like those `processes.start` makes, their output on pipes of their own.

`ForkServer.fork` waits for the server to have imported its modules (once, when the first cold joiner comes) and
returns None where it cannot fork (the server failed to start or died): the caller then starts the worker as a
new process, as before. While idle the server is one process holding the imported modules (its memory is shared
copy-on-write with the children it forks: benchmarks/elastic_resize.py records its resident size).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil

from ddlrepro.host.launchers.base import WorkerSpec
from ddlrepro.host.launchers.processes import POLL_INTERVAL_S, Started, drain, pumped, start, stop
from ddlrepro.rank.elastic.forkserver import READY

SERVER_MODULE = "ddlrepro.rank.elastic.forkserver"
READY_TIMEOUT_S = 120.0  # importing torch on a loaded 2-core machine
STDERR_LINES = 40


class ForkedProcess:
    """Popen's interface as the launchers use it (pid, poll, wait, returncode, send_signal, kill), for a child of the
    fork server: its exit code comes over the child's connection."""

    def __init__(self, pid: int, connection: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._watch, args=(connection,), name=f"forked-{pid}", daemon=True).start()

    def _watch(self, connection: socket.socket) -> None:
        with connection, connection.makefile("r") as lines:
            reported = lines.readline().strip()
        if not reported:  # the server is gone before the child: wait until the child is too
            while running(self.pid):
                time.sleep(POLL_INTERVAL_S)
        self.returncode = int(reported) if reported else -signal.SIGKILL
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether process `pid` still runs (gone or a zombie: no; it may end between any two looks)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ForkServer:
    """The job's fork server: `start()` it with the workers' common environment, `fork()` joiners, `stop()` it."""

    def __init__(self, env: dict[str, str], preload: list[str]) -> None:
        self.env, self.preload = env, preload
        self.folder = Path(tempfile.mkdtemp(prefix="forkserver-"))  # the run's private TMPDIR
        self.path = self.folder / "socket"
        self.server: Started | None = None
        self.process: subprocess.Popen[str] | None = None
        self.ready = threading.Event()
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)

    def start(self) -> ForkServer:
        command = [sys.executable, "-m", SERVER_MODULE, str(self.path), *self.preload]
        self.server = start(WorkerSpec(None, command, self.env), self._on_line)
        self.process = self.server.process
        return self

    def _on_line(self, stream: str, line: str) -> None:
        """Its readiness, and the last lines of its stderr (why it failed, if it did)."""
        if stream == "stdout" and line == READY:
            self.ready.set()
        elif stream == "stderr":
            self.stderr_tail.append(line)

    def usable(self) -> bool:
        """Whether joiners can be forked: waits for the server's imports the first time."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready.wait(POLL_INTERVAL_S):
            if self.process is None or self.process.poll() is not None or time.monotonic() > deadline:
                return False
        return self.process is not None and self.process.poll() is None

    def fork(self, spec: WorkerSpec, on_line: Callable[[str, str], None]) -> Started | None:
        """`spec` (`python -m MODULE ARGS...`) forked by the server, or None where it cannot be."""
        command = spec.command
        if len(command) < 3 or command[1] != "-m" or not self.usable():
            return None
        request = {"module": command[2], "argv": command[3:], "env": spec.env}
        pipes = [os.pipe(), os.pipe()]
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(str(self.path))
            socket.send_fds(connection, [b"F"], [write for _, write in pipes])
            connection.sendall(json.dumps(request).encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = connection.recv(256)
                if not chunk:
                    raise OSError("the fork server closed the connection")
                answer += chunk
            pid = int(answer)
        except (OSError, ValueError):
            connection.close()
            for read, _ in pipes:
                os.close(read)
            return None
        finally:
            for _, write in pipes:
                os.close(write)
        readers = pumped([os.fdopen(read, "r") for read, _ in pipes], on_line)
        return Started(spec, ForkedProcess(pid, connection), readers)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.server is not None:
            stop([self.server])
            drain([self.server])
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
            self.folder.rmdir()
