"""Local launcher: a point's N workers as processes on this machine, torchrun-style environment, loopback rendezvous.

If a worker dies the others are stopped at once and the run fails with that rank and the tail of its stderr;
a run past its time limit is stopped the same way. Nothing is left running when the launcher itself is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ddlrepro.launchers.base import JobSpec, RunFailed, WorkerSpec
from ddlrepro.points import Point
from ddlrepro.rundir import OutputCollector

POLL_INTERVAL_S = 0.05
STOP_GRACE_S = 3.0


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def render(point: Point, timeout_s: float, run_dir: Path) -> JobSpec:
    """The exact commands and environment each worker will get (no process is started)."""
    port = free_loopback_port()
    workers = []
    for rank in range(point.workers):
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(point.workers),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(point.workers),
            "OMP_NUM_THREADS": str(point.threads_per_worker),
            "PYTHONUNBUFFERED": "1",
            "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
        }
        workers.append(WorkerSpec(rank, [sys.executable, "-m", "ddlrepro.workloads", point.to_json()], env))
    return JobSpec("local", workers, timeout_s, {"master_addr": "127.0.0.1", "master_port": port})


@dataclass
class _Worker:
    spec: WorkerSpec
    process: subprocess.Popen[str]
    readers: list[threading.Thread]


def execute(spec: JobSpec, output: OutputCollector) -> None:
    """Run every worker to completion; raise RunFailed naming the first rank that failed."""
    workers: list[_Worker] = []
    try:
        for worker_spec in spec.workers:
            workers.append(_start(worker_spec, output))
        _wait(workers, spec.timeout_s, output)
    finally:
        _stop(workers)


def _start(spec: WorkerSpec, output: OutputCollector) -> _Worker:
    process = subprocess.Popen(
        spec.command,
        env={**os.environ, **spec.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    readers = [
        threading.Thread(target=_pump, args=(stream, spec.rank, name, output), daemon=True)
        for stream, name in ((process.stdout, "stdout"), (process.stderr, "stderr"))
    ]
    for reader in readers:
        reader.start()
    return _Worker(spec, process, readers)


def _pump(stream, rank: int, name: str, output: OutputCollector) -> None:
    for line in stream:
        output.add_line(rank, name, line.rstrip("\n"))


def _wait(workers: list[_Worker], timeout_s: float, output: OutputCollector) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        failed = [w for w in workers if w.process.poll() not in (None, 0)]
        if failed:
            first = failed[0]
            _stop(workers)
            _drain(workers)
            raise RunFailed(
                first.spec.rank, _describe_exit(first.process.returncode), output.stderr_tail(first.spec.rank)
            )
        if all(w.process.returncode == 0 for w in workers):
            _drain(workers)
            return
        if time.monotonic() > deadline:
            _stop(workers)
            _drain(workers)
            raise RunFailed(None, f"timed out after {timeout_s:g} s", output.stderr_tail(0))
        time.sleep(POLL_INTERVAL_S)


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _drain(workers: list[_Worker]) -> None:
    for worker in workers:
        for reader in worker.readers:
            reader.join(timeout=STOP_GRACE_S)


def _stop(workers: list[_Worker]) -> None:
    """SIGTERM every live worker's process group, then SIGKILL what is left after a grace period."""
    live = [w for w in workers if w.process.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for worker in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(w.process.poll() is None for w in live):
            time.sleep(POLL_INTERVAL_S)
        live = [w for w in live if w.process.poll() is None]
        if not live:
            return
