"""Local launcher: a point's N workers as processes on this machine, torchrun-style environment, loopback rendezvous.

If a worker dies the others are stopped at once and the run fails with that rank and the tail of its stderr;
a run past its time limit is stopped the same way. Nothing is left running when the launcher itself is killed.

Three ways to start the ranks, by what the point runs (its launch's `ranks`, host/launch.py):
- `ranks`: one process per rank, torchrun's environment (every torch and TensorFlow point);
- `horovod-gloo`: the same, plus Horovod's gloo environment and its rendezvous server, run by this launcher
  (rank/taskenv.py) instead of horovodrun, so failures and output are handled as for any other rank;
- `mpirun`: one `mpirun --tag-output` starting every rank (Horovod over MPI, the MPI all-reduce benchmark); its
  output lines are filed under the rank their tag names.

With `images.build` podman or docker, every rank runs in the built image (its own container on the host's network).
Elastic points run under their runtime (hosting.py), as processes on this machine. A point whose launch names
testbed hosts runs its ranks one per host of its own testbed, with competing traffic (testbed_ranks.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Self

from ddlrepro.host import leftovers, owners
from ddlrepro.host.config import ConfigError
from ddlrepro.host.cpuquota import CpuQuotas
from ddlrepro.host.hostload import process_tree_cpu
from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers import hosting, isolation, testbed_ranks
from ddlrepro.host.launchers.base import CpuCounter, JobSpec, Options, RunFailed, WorkerSpec
from ddlrepro.host.launchers.processes import (
    ON_THIS_HOST,
    POLL_INTERVAL_S,
    Started,
    describe_exit,
    drain,
    free_loopback_port,
    private_temporary_folder,
    run_to_completion,
    start,
    stop,
)
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point
from ddlrepro.rank import devicetypes, taskenv

CONTAINER_ENGINES = ("podman", "docker")


@dataclass(frozen=True)
class LocalOptions:
    """`launcher` (timeout), `launcher.local` and, with a podman/docker image, how to run a rank in it: `container`
    is the built image (its digest, known once built), `container_run` the engine's run command."""

    timeout_s: float
    exclusive: bool
    oversubscription: float
    container_run: list[str] | None
    container: str | None
    rootfs: bool = False  # `container` is a root file system (podman --rootfs), not an image: run this Python

    @classmethod
    def from_config(cls, config: dict[str, Any], image: dict[str, Any] | None = None) -> Self:
        launcher, images = config["launcher"], config["images"]
        if images["build"] not in (None, *CONTAINER_ENGINES):
            raise ConfigError(
                f"images.build: {images['build']} images are not run by the local launcher (launcher.name); use "
                f"slurm, or images.build: {' or '.join(CONTAINER_ENGINES)} or null"
            )
        in_image = images["build"] in CONTAINER_ENGINES
        return cls(
            timeout_s=launcher["timeout_s"],
            exclusive=launcher["local"]["exclusive"],
            oversubscription=launcher["local"]["oversubscription"],
            container_run=[images["build"], *images["engine_args"], "run", *images["run_args"]] if in_image else None,
            container=image["digest"].removeprefix("sha256:") if in_image and image else None,
        )


@dataclass(frozen=True)
class LocalRequest:
    """The processes of a job on this machine: one per rank (or the one mpirun line, rank None) and the rendezvous
    they share (loopback ports; Horovod's, TensorFlow's), and the containers they run in, if any."""

    mode: str
    ranks: int
    workers: list[WorkerSpec]
    master_addr: str
    master_port: int
    horovod_port: int | None = None
    tensorflow_workers: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    container_engine: list[str] = field(default_factory=list)
    testbed: testbed_ranks.TestbedPlacement | None = None
    cpu_quotas: dict[int, float] = field(default_factory=dict)
    network_namespace: str | None = None  # the run's own (isolation.py), for what binds every interface
    # The launcher binds 127.0.0.1:master_port before any rank starts and hands the socket to rank 0 (its rendezvous
    # store serves on it): between choosing the port and rank 0's store, no other process can take it.
    master_bound_here: bool = False


def check_fits_machine(point: Point, oversubscription: float, cores: int | None = None) -> None:
    """Refuse a point whose workers × threads exceed this machine's usable cores × `oversubscription`."""
    cores = cores or len(os.sched_getaffinity(0))
    workers = launch_of(point).peak_workers
    needed = workers * point.threads_per_worker
    if needed > cores * oversubscription:
        raise ConfigError(
            f"{point.figure} point {point.id}: {workers} workers × {point.threads_per_worker} threads = {needed} "
            f"threads, more than this machine's {cores} usable cores × launcher.local.oversubscription "
            f"{oversubscription}"
        )


def check_image_can_run(point: Point) -> None:
    """Raise unless the training image can run `point`: it carries neither Horovod nor MPI."""
    if launch_of(point).ranks != "ranks":
        raise ValueError(f"point {point.id} needs Horovod or MPI, which the training image does not carry")


def check_testbed_can_run(point: Point) -> None:
    """Refuse a testbed point (`testbed_hosts`) this launcher would not start as plain torch ranks on its hosts (in
    the training image it is skipped instead: run.unmet_requirement)."""
    launch = launch_of(point)
    if launch.testbed is None:
        return
    if launch.ranks != "ranks" or launch.tensorflow_cluster:
        how = "tensorflow" if launch.tensorflow_cluster else launch.ranks
        remedy = f"disable it (figures.{point.figure}.enabled: false)"
        raise ConfigError(f"{point.figure} point {point.id}: testbed hosts run plain torch ranks, not {how}: {remedy}")


class LocalLauncher:
    """Workers as processes on this machine (see the module's docstring)."""

    name: ClassVar[str] = "local"
    elastic_runtimes: ClassVar[frozenset[str]] = frozenset(hosting.RUNTIMES)
    options_type: ClassVar[type[Options]] = LocalOptions
    resource_names: tuple[str, ...] = ()

    def __init__(self, options: LocalOptions) -> None:
        self.options = options

    def render(self, point: Point, run_dir: Path) -> JobSpec[Any]:
        """The exact commands and environment each worker will get (no process is started)."""
        if launch_of(point).runtime:
            return hosting.render_elastic(point, run_dir, self.name, self.options.timeout_s)
        return JobSpec(self.name, self.options.timeout_s, self.request(point, run_dir))

    def request(self, point: Point, run_dir: Path) -> LocalRequest:
        container, container_run = self.options.container, self.options.container_run
        image = (container_run, container) if container and container_run else None
        in_image = image is not None
        if in_image:
            check_image_can_run(point)
        port = free_loopback_port()
        launch = launch_of(point)
        mode = launch.ranks
        common = {
            **ON_THIS_HOST,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": str(point.threads_per_worker),
            "PYTHONUNBUFFERED": "1",
            "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
        }
        rendezvous: dict[str, Any] = {
            "mode": mode,
            "ranks": point.workers,
            "master_addr": "127.0.0.1",
            "master_port": port,
        }
        worker_command = [sys.executable, "-m", "ddlrepro.rank.workloads", point.to_json()]
        if mode == "mpirun":
            namespace = isolation.planned_name()  # Open MPI's out-of-band listener binds every interface
            step = WorkerSpec(
                None,
                isolation.inside(namespace, mpirun_command(point.workers, worker_command, bool(namespace))),
                common,
            )
            return LocalRequest(**rendezvous, workers=[step], network_namespace=namespace)
        horovod_port = free_loopback_port() if mode == "horovod-gloo" else None
        tensorflow = launch.tensorflow_cluster
        tensorflow_workers = [f"127.0.0.1:{free_loopback_port()}" for _ in range(point.workers)] if tensorflow else []
        workers = []
        for rank in range(point.workers):
            env = {
                **common,
                "RANK": str(rank),
                "WORLD_SIZE": str(point.workers),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(point.workers),
                **launch.rank_variables[rank],
            }
            if horovod_port:
                env.update(taskenv.local_rank_env(rank, point.workers, horovod_port))
            if tensorflow_workers:
                env["TF_CONFIG"] = taskenv.tf_config(tensorflow_workers, rank)
            command = worker_command
            if image:
                command = in_container(
                    *image,
                    container_name(point, rank, run_dir),
                    env,
                    run_dir,
                    command,
                    self.options.rootfs,
                )
            workers.append(WorkerSpec(rank, command, env))
        check_testbed_can_run(point)
        placed = testbed_ranks.placement(launch.testbed, point.workers)
        if placed:
            workers, rendezvous["master_addr"] = testbed_ranks.placed_workers(workers, placed)
        namespace = isolation.planned_name() if tensorflow and not (placed or in_image) else None
        workers = [replace(worker, command=isolation.inside(namespace, worker.command)) for worker in workers]
        return LocalRequest(
            **rendezvous,
            testbed=placed,
            workers=workers,
            horovod_port=horovod_port,
            tensorflow_workers=tensorflow_workers,
            containers=[container_name(point, rank, run_dir) for rank in range(point.workers)] if in_image else [],
            container_engine=image[0][: image[0].index("run")] if image else [],
            cpu_quotas=launch.cpu_quotas,
            network_namespace=namespace,
            master_bound_here=not (placed or in_image or namespace),
        )

    def execute(self, spec: JobSpec[Any], output: OutputCollector) -> None:
        """Run every worker to completion, with a temporary folder of their own; raise RunFailed naming the first
        rank that failed."""
        if hosting.is_elastic(spec):
            with private_temporary_folder():
                hosting.execute_elastic(spec, output)
            return
        with private_temporary_folder(), isolation.own_network(spec.request.network_namespace):
            if spec.request.mode == "mpirun":
                _execute_mpirun(spec, output)
            else:
                _execute_ranks(spec, output)

    def check_fits(self, point: Point) -> None:
        check_fits_machine(point, self.options.oversubscription)
        check_testbed_can_run(point)

    def host_cores(self, point: Point, workflow_cores: Callable[[], int]) -> int:
        """Every process runs here: its workers' threads, or every core when runs must not share the machine."""
        needed = launch_of(point).peak_workers * point.threads_per_worker
        return max(needed, workflow_cores()) if self.options.exclusive else needed

    def resources(self, point: Point) -> dict[str, Any]:
        return {}

    def own_cpu_counter(self, spec: JobSpec[Any]) -> CpuCounter:
        """Local ranks are this process's descendants; podman/docker ranks run under the engine, outside its tree."""
        if getattr(spec.request, "containers", None):
            return "unknown: the ranks run in containers, outside this process's tree", None
        return "this process and its descendants", process_tree_cpu


def container_name(point: Point, rank: int, run_dir: Path) -> str:
    """Rank `rank`'s container: named after the point and its run folder (two checkouts running the same point
    never share a name, and so never remove each other's)."""
    folder = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return f"ddlrepro-{point.id}-{folder}-{rank}"


def in_container(
    run: list[str],
    image: str,
    name: str,
    env: dict[str, str],
    run_dir: Path,
    command: list[str],
    rootfs: bool = False,
) -> list[str]:
    """`command` run by `run` (podman/docker run) in `image`, with only `env` from this side (no secrets).
    `rootfs`: `image` is this machine's root file system (`run` ends in --rootfs), so this very Python runs, with
    this process's PYTHONPATH (where it finds the checkout)."""
    runs = str(run_dir.resolve().parent)
    path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if rootfs and "PYTHONPATH" in os.environ else {}
    settings = [flag for key, value in (env | path).items() for flag in ("-e", f"{key}={value}")]
    inside = command if rootfs else ["python", *command[1:]]
    options = ["--rm", "--network=host", "--name", name, *owners.container_labels(), "-v", f"{runs}:{runs}"]
    return [*run, *options, *settings, image, *inside]


# Open MPI's out-of-band and TCP byte-transfer sockets on loopback only: the ranks are all on this host.
MPI_ON_THIS_HOST = ["--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo"]


def mpirun_command(workers: int, command: list[str], isolated: bool = False) -> list[str]:
    """Open MPI's mpirun starting `workers` copies of `command` here, each line tagged with its rank. `isolated`: it
    runs in a namespace of its own, where this user may appear as root (isolation.py)."""
    as_root = ["--allow-run-as-root"] if os.geteuid() == 0 or isolated else []
    return ["mpirun", *as_root, *MPI_ON_THIS_HOST, "-np", str(workers), "--bind-to", "none", "--tag-output", *command]


def _execute_ranks(spec: JobSpec[LocalRequest], output: OutputCollector) -> None:
    job = spec.request
    workers: list[Started] = []
    port = job.horovod_port
    server = taskenv.rendezvous_server([(taskenv.LOCALHOST, job.ranks)], port) if port else contextlib.nullcontext()
    quotas = {} if job.containers else job.cpu_quotas  # a container's processes are the engine's, not ours
    run_name = Path(job.workers[0].env["DDLREPRO_RUN_DIR"]).name
    if job.containers:
        leftovers.sweep_containers(job.container_engine)
    with (
        server,
        master_listener(job) as master,
        CpuQuotas(run_name, quotas) as cpu,
        _line_handler(job, output) as on_line,
    ):
        try:
            for worker in job.workers:
                if worker.rank in quotas:
                    worker = replace(worker, env={**worker.env, devicetypes.QUOTA_STATUS_VARIABLE: cpu.status})
                handed = (master.fileno(),) if master is not None and worker.rank == 0 else ()
                if handed:
                    worker = replace(worker, env={**worker.env, taskenv.MASTER_LISTEN_FD_ENV: str(handed[0])})
                workers.append(start(worker, partial(on_line, worker.rank), pass_fds=handed))
                cpu.join(worker.rank, workers[-1].process.pid)
            _wait(workers, spec.timeout_s, output)
        finally:
            stop(workers)
            remove_containers(job)


@contextlib.contextmanager
def master_listener(job: LocalRequest) -> Iterator[socket.socket | None]:
    """The rendezvous port's listening socket, bound here before any rank starts (None where rank 0 binds it); a
    port another process took since it was chosen fails the run before anything starts."""
    if not job.master_bound_here:
        yield None
        return
    try:
        listener = socket.create_server((job.master_addr, job.master_port), backlog=taskenv.LISTEN_BACKLOG)
    except OSError as error:
        where = f"{job.master_addr}:{job.master_port}"
        raise RunFailed(None, f"the rendezvous port {where} was taken before any rank started: {error}", []) from None
    with listener:  # rank 0 holds its own copy once started
        yield listener


@contextlib.contextmanager
def _line_handler(job: LocalRequest, output: OutputCollector) -> Iterator[testbed_ranks.LineHandler]:
    """Where the ranks' lines go: the collector, through the testbed's traffic trigger when on testbed hosts."""
    if job.testbed is None:
        yield output.add_line
        return
    with testbed_ranks.hosted(job.testbed, output) as on_line:
        yield on_line


MPIRUN_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:(.*)$")


def _execute_mpirun(spec: JobSpec[LocalRequest], output: OutputCollector) -> None:
    """Run the one mpirun command; its tagged lines are filed under their rank, its own messages under rank -1."""
    (step,) = spec.request.workers
    code = run_to_completion(step, partial(_file_tagged_line, output), spec.timeout_s)
    if code is None:
        raise RunFailed(None, f"timed out after {spec.timeout_s:g} s", output.stderr_tail(-1))
    if code != 0:
        ranks = [-1, *range(spec.request.ranks)]
        tails = [f"[rank {rank}] {line}" for rank in ranks for line in output.stderr_tail(rank)]
        raise RunFailed(None, f"failed (mpirun {describe_exit(code)})", tails)


def _file_tagged_line(output: OutputCollector, stream: str, line: str) -> None:
    tagged = MPIRUN_TAG.match(line)
    if tagged:
        output.add_line(int(tagged.group(1)), tagged.group(2), tagged.group(3))
    else:
        output.add_line(-1, stream, line)


def remove_containers(job: LocalRequest) -> None:
    """Containers outlive a killed `podman run`/`docker run` client: remove them by name (gone already is fine)."""
    if job.containers:
        subprocess.run([*job.container_engine, "rm", "--force", *job.containers], capture_output=True)


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
