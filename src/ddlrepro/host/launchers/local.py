"""Local launcher: a point's N workers as processes on this machine, torchrun-style environment, loopback rendezvous.

If a worker dies the others are stopped at once and the run fails with that rank and the tail of its stderr;
a run past its time limit is stopped the same way. Nothing is left running when the launcher itself is killed.

Three ways to start the ranks, by what the point runs (`launch_mode`):
- `ranks`: one process per rank, torchrun's environment (every torch and TensorFlow point);
- `horovod-gloo`: the same, plus Horovod's gloo environment and its rendezvous server, run by this launcher
  (rank/taskenv.py) instead of horovodrun, so failures and output are handled as for any other rank;
- `mpirun`: one `mpirun --tag-output` starting every rank (Horovod over MPI, the MPI all-reduce benchmark); its
  output lines are filed under the rank their tag names.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from ddlrepro.host.config import ConfigError
from ddlrepro.host.launchers.base import JobSpec, RunFailed, WorkerSpec
from ddlrepro.host.launchers.processes import (
    POLL_INTERVAL_S,
    Started,
    describe_exit,
    drain,
    run_to_completion,
    start,
    stop,
)
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point
from ddlrepro.rank import taskenv


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def peak_workers(point: Point) -> int:
    """Worker processes the point runs at once at most: an elastic schedule's largest cluster plus its standbys."""
    if "schedule" not in point.params:
        return point.workers
    from ddlrepro.rank.elastic.schedule import largest_size, parse_schedule

    largest = largest_size(parse_schedule(point.params["schedule"]), point.params["initial_workers"])
    return largest + point.params.get("standby", 0)


def check_fits_machine(point: Point, oversubscription: float, cores: int | None = None) -> None:
    """Refuse a point whose workers × threads exceed this machine's usable cores × `oversubscription`."""
    cores = cores or len(os.sched_getaffinity(0))
    workers = peak_workers(point)
    needed = workers * point.threads_per_worker
    if needed > cores * oversubscription:
        raise ConfigError(
            f"{point.figure} point {point.id}: {workers} workers × {point.threads_per_worker} threads = {needed} "
            f"threads, more than this machine's {cores} usable cores × launcher.oversubscription {oversubscription}"
        )


def launch_mode(point: Point) -> str:
    """`ranks`, `horovod-gloo` or `mpirun` (see the module's docstring)."""
    params = point.params
    if params.get("framework") == "horovod":
        return "mpirun" if params.get("horovod_controller", "gloo") == "mpi" else "horovod-gloo"
    return "mpirun" if params.get("backend") == "mpi" else "ranks"


def check_image_can_run(point: Point) -> None:
    """Raise unless the training image can run `point`: it carries neither Horovod nor MPI."""
    if launch_mode(point) != "ranks":
        raise ValueError(f"point {point.id} needs Horovod or MPI, which the training image does not carry")


def render(
    point: Point, timeout_s: float, run_dir: Path, container: str | None = None, container_run: list[str] | None = None
) -> JobSpec:
    """The exact commands and environment each worker will get (no process is started).

    With `container` (an image) and `container_run` (e.g. `podman run`), every worker runs in its own container
    on the host's network, with the figure's run folders mounted at the same path (torch and TensorFlow points:
    the training image carries neither Horovod nor MPI)."""
    in_image = bool(container and container_run)
    if in_image:
        check_image_can_run(point)
    port = free_loopback_port()
    mode = launch_mode(point)
    common = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
    }
    rendezvous = {"master_addr": "127.0.0.1", "master_port": port, "mode": mode}
    worker_command = [sys.executable, "-m", "ddlrepro.rank.workloads", point.to_json()]
    if mode == "mpirun":
        rendezvous["ranks"] = point.workers
        return JobSpec(
            "local", [WorkerSpec(None, mpirun_command(point.workers, worker_command), common)], timeout_s, rendezvous
        )
    if mode == "horovod-gloo":
        rendezvous["horovod_port"] = free_loopback_port()
    if point.params.get("framework") == "tensorflow":
        rendezvous["tensorflow_workers"] = [f"127.0.0.1:{free_loopback_port()}" for _ in range(point.workers)]
    workers = []
    for rank in range(point.workers):
        env = {
            **common,
            "RANK": str(rank),
            "WORLD_SIZE": str(point.workers),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(point.workers),
        }
        if mode == "horovod-gloo":
            env.update(taskenv.local_rank_env(rank, point.workers, rendezvous["horovod_port"]))
        if "tensorflow_workers" in rendezvous:
            env["TF_CONFIG"] = taskenv.tf_config(rendezvous["tensorflow_workers"], rank)
        command = worker_command
        if in_image:
            command = in_container(container_run, container, container_name(point, rank), env, run_dir, command)
        workers.append(WorkerSpec(rank, command, env))
    if in_image:
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


def mpirun_command(workers: int, command: list[str]) -> list[str]:
    """Open MPI's mpirun starting `workers` copies of `command` here, each line tagged with its rank."""
    as_root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *as_root, "-np", str(workers), "--bind-to", "none", "--tag-output", *command]


def execute(spec: JobSpec, output: OutputCollector) -> None:
    """Run every worker to completion; raise RunFailed naming the first rank that failed."""
    if spec.rendezvous.get("mode") == "mpirun":
        _execute_mpirun(spec, output)
        return
    workers: list[Started] = []
    size = len(spec.workers)
    port = spec.rendezvous.get("horovod_port")
    server = taskenv.rendezvous_server([(taskenv.LOCALHOST, size)], port) if port else contextlib.nullcontext()
    with server:
        try:
            for worker in spec.workers:
                workers.append(start(worker, partial(output.add_line, worker.rank)))
            _wait(workers, spec.timeout_s, output)
        finally:
            stop(workers)
            remove_containers(spec)


MPIRUN_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$")


def _execute_mpirun(spec: JobSpec, output: OutputCollector) -> None:
    """Run the one mpirun command; its tagged lines are filed under their rank, its own messages under rank -1."""
    (step,) = spec.workers
    code = run_to_completion(step, partial(_file_tagged_line, output), spec.timeout_s)
    if code is None:
        raise RunFailed(None, f"timed out after {spec.timeout_s:g} s", output.stderr_tail(-1))
    if code != 0:
        ranks = [-1, *range(spec.rendezvous["ranks"])]
        tails = [f"[rank {rank}] {line}" for rank in ranks for line in output.stderr_tail(rank)]
        raise RunFailed(None, f"failed (mpirun {describe_exit(code)})", tails)


def _file_tagged_line(output: OutputCollector, stream: str, line: str) -> None:
    tagged = MPIRUN_TAG.match(line)
    if tagged:
        output.add_line(int(tagged.group(1)), tagged.group(2), tagged.group(3))
    else:
        output.add_line(-1, stream, line)


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
