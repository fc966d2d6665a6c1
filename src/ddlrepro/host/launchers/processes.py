"""Starting, watching and stopping the processes a launcher runs (workers, or an srun step), line by line."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from ddlrepro.host.launchers.base import WorkerSpec

POLL_INTERVAL_S = 0.05
STOP_GRACE_S = 3.0
# The environment of ranks that all run on this host: gloo's pair sockets on loopback (unset, gloo binds the address
# the host's name resolves to, reachable from its network); testbed placement sets its hosts' own interfaces.
ON_THIS_HOST = {"GLOO_SOCKET_IFNAME": "lo"}


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return cast("int", probe.getsockname()[1])


@dataclass
class Started:
    """A running process of a job, with the threads that hand its output on line by line."""

    spec: WorkerSpec
    process: subprocess.Popen[str]
    readers: list[threading.Thread]


def start(spec: WorkerSpec, on_line: Callable[[str, str], None], pass_fds: tuple[int, ...] = ()) -> Started:
    """Start `spec` in its own process group (inheriting the descriptors `pass_fds`); `on_line(stream, line)` gets
    every stdout/stderr line."""
    process = subprocess.Popen(
        spec.command,
        env={**os.environ, **spec.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        pass_fds=pass_fds,
    )
    return Started(spec, process, pumped([process.stdout, process.stderr], on_line))


def run_to_completion(spec: WorkerSpec, on_line: Callable[[str, str], None], timeout_s: float) -> int | None:
    """Run one command that starts every rank (srun, mpirun) until it exits; its exit code, None on a timeout.
    It is stopped either way and all its output handed on before this returns."""
    started = [start(spec, on_line)]
    try:
        return started[0].process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        stop(started)
        drain(started)


def pumped(streams: Sequence[IO[str] | None], on_line: Callable[[str, str], None]) -> list[threading.Thread]:
    """Started threads handing every line of a process's stdout and stderr (in that order) to `on_line`."""
    readers = [
        threading.Thread(target=_pump, args=(stream, name, on_line), daemon=True)
        for stream, name in zip(streams, ("stdout", "stderr"), strict=True)
    ]
    for reader in readers:
        reader.start()
    return readers


def _pump(stream: IO[str] | None, name: str, on_line: Callable[[str, str], None]) -> None:
    for line in stream or ():  # None: a stream that was not piped
        on_line(name, line.rstrip("\n"))


def drain(started: list[Started]) -> None:
    """Wait for the output of finished processes to be handed on."""
    for one in started:
        for reader in one.readers:
            reader.join(timeout=STOP_GRACE_S)


def stop(started: list[Started]) -> None:
    """SIGTERM every live process group, then SIGKILL what is left after a grace period."""
    live = [one for one in started if one.process.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for one in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(one.process.pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(one.process.poll() is None for one in live):
            time.sleep(POLL_INTERVAL_S)
        live = [one for one in live if one.process.poll() is None]
        if not live:
            return


# The private folders of the runs this process executes now, newest last, and TMPDIR as it was before the first:
# runs executed at once on threads (tests do) end in any order, and TMPDIR must never be left naming a removed one.
_LIVE_FOLDERS: list[str] = []
_tmpdir_outside: str | None = None
_FOLDERS_LOCK = threading.Lock()


@contextlib.contextmanager
def private_temporary_folder() -> Iterator[Path]:
    """A fresh TMPDIR for the processes started while this lasts, removed after with whatever they left there
    (torchrun's log folders, TensorFlow's autograph sources, Open MPI's session folder): runs leave nothing in /tmp.
    When it ends, TMPDIR names the newest folder still in use, else what it was before any."""
    global _tmpdir_outside
    with tempfile.TemporaryDirectory(prefix="ddlrepro-run-") as folder:
        with _FOLDERS_LOCK:
            if not _LIVE_FOLDERS:
                _tmpdir_outside = os.environ.get("TMPDIR")
            _LIVE_FOLDERS.append(folder)
            os.environ["TMPDIR"] = folder
        try:
            yield Path(folder)
        finally:
            with _FOLDERS_LOCK:
                _LIVE_FOLDERS.remove(folder)
                restored = _LIVE_FOLDERS[-1] if _LIVE_FOLDERS else _tmpdir_outside
                if restored is None:
                    os.environ.pop("TMPDIR", None)
                else:
                    os.environ["TMPDIR"] = restored


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
