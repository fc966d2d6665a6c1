"""Local launcher: a point's N workers as processes on this machine, torchrun-style environment, loopback rendezvous.

If a worker dies the others are stopped at once and the run fails with that rank and the tail of its stderr;
a run past its time limit is stopped the same way. Nothing is left running when the launcher itself is killed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from ddlrepro.launchers.base import JobSpec, RunFailed, WorkerSpec
from ddlrepro.launchers.processes import POLL_INTERVAL_S, Started, describe_exit, drain, start, stop
from ddlrepro.points import Point
from ddlrepro.rundir import OutputCollector


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def render(
    point: Point, timeout_s: float, run_dir: Path, container: str | None = None, container_run: list[str] | None = None
) -> JobSpec:
    """The exact commands and environment each worker will get (no process is started).

    With `container` (an image) and `container_run` (e.g. `podman run`), every worker runs in its own container
    on the host's network, with the figure's run folders mounted at the same path."""
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
        command = [sys.executable, "-m", "ddlrepro.workloads", point.to_json()]
        if container and container_run:
            command = in_container(container_run, container, container_name(point, rank), env, run_dir, command)
        workers.append(WorkerSpec(rank, command, env))
    rendezvous: dict = {"master_addr": "127.0.0.1", "master_port": port}
    if container and container_run:
        rendezvous["containers"] = [container_name(point, rank) for rank in range(point.workers)]
        rendezvous["container_engine"] = container_run[: container_run.index("run")]
    return JobSpec("local", workers, timeout_s, rendezvous)


def container_name(point: Point, rank: int) -> str:
    return f"ddlrepro-{point.id}-{rank}"


def in_container(
    run: list[str], image: str, name: str, env: dict[str, str], run_dir: Path, command: list[str]
) -> list[str]:
    """`command` run by `run` (podman/docker run) in `image`, with only `env` from this side (no secrets)."""
    runs = str(run_dir.resolve().parent)
    settings = [flag for key, value in env.items() for flag in ("-e", f"{key}={value}")]
    inside = ["python", *command[1:]]
    return [*run, "--rm", "--network=host", "--name", name, "-v", f"{runs}:{runs}", *settings, image, *inside]


def execute(spec: JobSpec, output: OutputCollector) -> None:
    """Run every worker to completion; raise RunFailed naming the first rank that failed."""
    workers: list[Started] = []
    try:
        for worker in spec.workers:
            workers.append(start(worker, partial(output.add_line, worker.rank)))
        _wait(workers, spec.timeout_s, output)
    finally:
        stop(workers)
        remove_containers(spec)


def remove_containers(spec: JobSpec) -> None:
    """Containers outlive a killed `podman run`/`docker run` client: remove them by name (gone already is fine)."""
    names = spec.rendezvous.get("containers")
    if names:
        subprocess.run([*spec.rendezvous["container_engine"], "rm", "--force", *names], capture_output=True)


def _wait(workers: list[Started], timeout_s: float, output: OutputCollector) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        failed = [w for w in workers if w.process.poll() not in (None, 0)]
        if failed:
            first = failed[0]
            stop(workers)
            drain(workers)
            rank = first.spec.rank
            raise RunFailed(rank, describe_exit(first.process.returncode), output.stderr_tail(rank))
        if all(w.process.returncode == 0 for w in workers):
            drain(workers)
            return
        if time.monotonic() > deadline:
            stop(workers)
            drain(workers)
            raise RunFailed(None, f"timed out after {timeout_s:g} s", output.stderr_tail(0))
        time.sleep(POLL_INTERVAL_S)
