"""Slurm launcher: inside the allocation Snakemake's Slurm executor obtained, one `srun` step starts every worker.

`allocation()` is what a point asks Slurm for (the run rule's resources: nodes, tasks, CPUs per task, memory,
runtime, GPUs, partition, account); `SlurmLauncher.render()` the exact srun command, with ports derived from the
job id. Each srun task turns Slurm's task variables into its rank's environment (slurm_task.py): the rendezvous
is the first node of the step. `--label` prefixes every line with its rank. Every framework of the local launcher
runs here too: torch, TensorFlow, Horovod over gloo or MPI, and the MPI all-reduce (MPI through Slurm's PMIx plugin).

Elastic points run under their runtime (hosting.py) on the one node of their allocation, started from the batch
step as local processes.

Snakemake's Slurm job-step executor removes the allocation's SLURM_* variables (node list, tasks per node, GPUs)
from the job's environment, so this launcher relies only on the job id and its settings; the tasks srun starts
get Slurm's step variables afresh.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Self

from ddlrepro.host.config import ConfigError
from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers import hosting
from ddlrepro.host.launchers.base import CpuCounter, JobSpec, Options, RunFailed, WorkerSpec
from ddlrepro.host.launchers.local import check_image_can_run
from ddlrepro.host.launchers.processes import run_to_completion
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point

LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
# srun's own lines naming where a step failed: "srun: error: node2: task 3: Killed", "... Node failure on node2".
FAILED_TASK = re.compile(r"(?:(?P<node>[^\s:]+): )?tasks? (?P<task>\d+)")
NODE_FAILURE = re.compile(r"Node failure on (?P<node>[^\s:,]+)")
# Each job takes a block of ports chosen by its id: torch's rendezvous, Horovod's, then one per TensorFlow task on
# its node. Blocks repeat every PORT_BLOCKS job ids (jobs that far apart rarely share a node at the same time), and
# stay below Linux's ephemeral ports (32768 on).
PORT_BASE, PORTS_PER_JOB, PORT_BLOCKS = 15000, 64, 275
JOB_CGROUP = re.compile(r"^job_\d+$")
# The run rule's resources (Snakemake's Slurm executor reads them), from `allocation()`. Not `tasks_per_node`: the
# executor refuses it beside `tasks` for a job with `mpi` set; the packing goes to sbatch as `slurm_extra`.
RESOURCES = (
    "nodes",
    "tasks",
    "cpus_per_task",
    "mem_mb",
    "runtime",
    "slurm_partition",
    "slurm_account",
    "mpi",
    "gres",
    "slurm_extra",
)
PLACEMENT = ("slurm_partition", "slurm_account")  # asked for only when the config names them (placement())


def job_cgroup_cpu(proc_cgroup: Path, cgroup_root: Path) -> Callable[[], float] | None:
    """A reader of the CPU seconds of this Slurm job's cgroup on this node (every step: the batch script and the
    srun step whose tasks are the ranks), or None when this process is in no `job_<id>` cgroup.

    cgroup v2 (`0::/…/job_<id>/step_batch/…`): `usage_usec` of the job's cpu.stat; v1 (`…:cpuacct…:/…`):
    the job's cpuacct.usage in nanoseconds."""
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        parts = Path(path).parts
        job = next((index for index, part in enumerate(parts) if JOB_CGROUP.match(part)), None)
        if job is None:
            continue
        relative = Path(*parts[1 : job + 1])
        if controllers == "":
            return partial(_cpu_stat_seconds, cgroup_root / relative / "cpu.stat")
        if "cpuacct" in controllers.split(","):
            return partial(_cpuacct_seconds, cgroup_root / controllers / relative / "cpuacct.usage")
    return None


def _cpu_stat_seconds(cpu_stat: Path) -> float:
    fields = dict(line.split() for line in cpu_stat.read_text().splitlines())
    return int(fields["usage_usec"]) / 1e6


def _cpuacct_seconds(usage: Path) -> float:
    return int(usage.read_text()) / 1e9


@dataclass(frozen=True)
class SlurmOptions:
    """`launcher` (timeout) and `launcher.slurm`; `container`: the Apptainer image every task runs in (the
    configured one, else the one the workflow builds with `images.build: apptainer`)."""

    timeout_s: float
    partition: str | None
    account: str | None
    tasks_per_node: int
    gpus_per_node: int
    mem_mb_per_worker: int
    max_nodes: int | None
    cpus_per_node: int | None
    mpi: str
    container: str | None

    @classmethod
    def from_config(cls, config: dict[str, Any], image: dict[str, Any] | None = None) -> Self:
        slurm, images = config["launcher"]["slurm"], config["images"]
        if images["build"] not in (None, "apptainer"):
            raise ConfigError(
                f"images.build: {images['build']} images are not run by the slurm launcher (launcher.name); use "
                "local or kubernetes, or images.build: apptainer or null"
            )
        built = f"results/images/ddlrepro-{images['variant']}.sif" if images["build"] else None
        return cls(timeout_s=config["launcher"]["timeout_s"], **{**slurm, "container": slurm["container"] or built})


@dataclass(frozen=True)
class SlurmRequest:
    """The one srun step of a job (the exact command and the environment it sets) and its rendezvous: ports
    derived from the job id, the first node of the step as the master."""

    mode: str
    job_id: str
    ranks: int
    step: WorkerSpec
    master_port: int
    horovod_port: int | None
    tensorflow_port: int | None


class SlurmLauncher:
    """Inside the allocation Snakemake's Slurm executor obtained, one srun step starts every worker."""

    name: ClassVar[str] = "slurm"
    elastic_runtimes: ClassVar[frozenset[str]] = frozenset(hosting.RUNTIMES)
    options_type: ClassVar[type[Options]] = SlurmOptions

    def __init__(self, options: SlurmOptions, environ: Mapping[str, str] | None = None) -> None:
        """`environ`: where the job id is read (this job's environment unless given)."""
        self.options = options
        self.environ = os.environ if environ is None else environ
        named = placement(options)
        self.resource_names = tuple(name for name in RESOURCES if name not in PLACEMENT or name in named)

    def render(self, point: Point, run_dir: Path) -> JobSpec[Any]:
        """The srun step this job will run, or an elastic point's job on the allocation's node (nothing starts)."""
        if launch_of(point).runtime:
            return hosting.render_elastic(point, run_dir, self.name, self.options.timeout_s)
        return JobSpec(self.name, self.options.timeout_s, self.request(point, run_dir))

    def request(self, point: Point, run_dir: Path) -> SlurmRequest:
        """Every point is one srun step shaped as its allocation, a task per worker, ranks in block order; each task
        turns Slurm's step variables into its rank's environment (slurm_task.py). MPI points (Horovod over MPI, the
        MPI all-reduce) are started by srun directly through Slurm's MPI plugin (`--mpi=pmix`). With a container
        image (`.sif`), every task runs inside it through `apptainer exec` (`--nv` with GPUs)."""
        options = self.options
        launch = launch_of(point)
        mode = launch.ranks
        if options.container:
            check_image_can_run(point)
        job_id = self.environ.get("SLURM_JOB_ID", "0")  # outside a job (`ddlrepro render`): job 0
        port = PORT_BASE + int(job_id) % PORT_BLOCKS * PORTS_PER_JOB
        env = {
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": str(point.threads_per_worker),
            "PYTHONUNBUFFERED": "1",
            "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
        }
        shape = node_shape(point, options.tasks_per_node)
        horovod_port = tensorflow_port = None
        if mode == "horovod-gloo":
            horovod_port = port + 1  # Horovod's rendezvous server, run by rank 0's task
            env["DDLREPRO_HOROVOD_PORT"] = str(horovod_port)
        if launch.tensorflow_cluster:
            if 2 + shape[1] > PORTS_PER_JOB:
                raise ValueError(f"{shape[1]} TensorFlow tasks per node need more than the job's {PORTS_PER_JOB} ports")
            tensorflow_port = port + 2  # the first of each node's ports, one per task on it
            env["DDLREPRO_TENSORFLOW_PORT"] = str(tensorflow_port)
        mpi = options.mpi if mode == "mpirun" else None
        command = srun_command(point, shape, options.gpus_per_node > 0, options.container, mpi)
        # MASTER_ADDR: each task takes the first node of its step.
        return SlurmRequest(
            mode, job_id, point.workers, WorkerSpec(None, command, env), port, horovod_port, tensorflow_port
        )

    def execute(self, spec: JobSpec[Any], output: OutputCollector) -> None:
        """Run the srun step (or the elastic job) to completion; raise RunFailed naming the Slurm job and the
        failed task."""
        if hosting.is_elastic(spec):
            hosting.execute_elastic(spec, output)
        else:
            execute_step(spec, output)

    def check_fits(self, point: Point) -> None:
        check_cluster_limits(point, self.options)

    def host_cores(self, point: Point, workflow_cores: Callable[[], int]) -> int:
        """The run's allocation is its own: every worker's threads on its node(s)."""
        return launch_of(point).peak_workers * point.threads_per_worker

    def resources(self, point: Point) -> dict[str, Any]:
        return allocation(point, self.options)

    def own_cpu_counter(self, spec: JobSpec[Any]) -> CpuCounter:
        return own_cpu_counter()


def own_cpu_counter(
    proc_cgroup: Path = Path("/proc/self/cgroup"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> CpuCounter:
    """How a run's own CPU is counted inside the allocation: the job's cgroup, whose processes are the run's
    (srun's tasks are children of slurmstepd, not of this process); unknown without one."""
    counter = job_cgroup_cpu(proc_cgroup, cgroup_root) if proc_cgroup.exists() else None
    if counter is None:
        return "unknown: this process is in no Slurm job cgroup", None
    try:
        counter()
    except (OSError, KeyError, ValueError) as error:
        return f"unknown: the Slurm job's cgroup CPU time cannot be read ({error})", None
    return "the Slurm job's cgroup on this node", counter


def placement(options: SlurmOptions) -> dict[str, str]:
    """The partition and account the config names. Left unset, the job asks for none, so that a Slurm profile's
    default-resources (a site's or user's account and partition) give them."""
    named = {"slurm_partition": options.partition, "slurm_account": options.account}
    return {name: value for name, value in named.items() if value is not None}


def allocation(point: Point, options: SlurmOptions) -> dict[str, Any]:
    """The sbatch settings of a point (RESOURCES, and `tasks_per_node`): one task per worker, packed
    `tasks_per_node` to a node, for the launcher's timeout (whole minutes, rounded up). Elastic points (their
    runtime starts and stops the workers) get one node with room for their largest cluster."""
    nodes, per_node = node_shape(point, options.tasks_per_node)
    return {
        "nodes": nodes,
        "tasks": launch_of(point).peak_workers,
        "tasks_per_node": per_node,
        "cpus_per_task": point.threads_per_worker,
        "mem_mb": options.mem_mb_per_worker * per_node,
        "runtime": max(1, math.ceil(options.timeout_s / 60)),
        **placement(options),
        # The plugin leaves srun to a multi-task job's command (ours); it wraps a single-task one in srun itself.
        "mpi": "srun" if point.workers > 1 else "",
        "gres": f"gpu:{min(options.gpus_per_node, per_node)}" if options.gpus_per_node else "",
        "slurm_extra": f"--ntasks-per-node={per_node}",
    }


def check_cluster_limits(point: Point, options: SlurmOptions) -> None:
    """Refuse a point over the cluster's declared `max_nodes` or `cpus_per_node` (each checked only if set)."""
    nodes, per_node = node_shape(point, options.tasks_per_node)
    cpus = per_node * point.threads_per_worker
    if options.max_nodes is not None and nodes > options.max_nodes:
        workers = launch_of(point).peak_workers
        raise ConfigError(
            f"{point.figure} point {point.id}: needs {nodes} nodes ({workers} workers, {per_node} per"
            f" node), over launcher.slurm.max_nodes {options.max_nodes}"
        )
    if options.cpus_per_node is not None and cpus > options.cpus_per_node:
        raise ConfigError(
            f"{point.figure} point {point.id}: {per_node} workers × {point.threads_per_worker} threads = {cpus} CPUs "
            f"on one node, over launcher.slurm.cpus_per_node {options.cpus_per_node}"
        )


def node_shape(point: Point, tasks_per_node: int) -> tuple[int, int]:
    """(nodes, tasks per node): one task per worker, `tasks_per_node` to a node; elastic points on one node, with
    room for their peak processes (`launch.Launch.peak_workers`, counted as the local and Kubernetes launchers do)."""
    launch = launch_of(point)
    workers = launch.peak_workers
    per_node = workers if launch.runtime else min(workers, tasks_per_node)
    return math.ceil(workers / per_node), per_node


def srun_command(
    point: Point, shape: tuple[int, int], with_gpus: bool, container: str | None, mpi: str | None
) -> list[str]:
    """One srun step with a task per worker on (nodes, tasks per node), ranks in block order, each line labelled
    with its rank (`mpi`: Slurm's MPI plugin). The step gets all of the job's GPUs (srun's default; no
    --gpus-per-task, whose binding would show each task one GPU as device 0): a node's ranks share its GPUs, rank
    i takes device i, as under the local launcher."""
    inside = (
        ["apptainer", "exec", *(["--nv"] if with_gpus else []), container, "python"] if container else [sys.executable]
    )
    return [
        "srun",
        f"--ntasks={point.workers}",
        f"--nodes={shape[0]}",
        f"--ntasks-per-node={shape[1]}",
        "--distribution=block",
        f"--cpus-per-task={point.threads_per_worker}",
        "--kill-on-bad-exit=1",
        "--overlap",
        "--label",  # srun hands on whole lines, each labelled (--unbuffered would cut lines apart)
        *([f"--mpi={mpi}"] if mpi else []),
        *inside,
        "-m",
        "ddlrepro.rank.slurm_task",
        point.to_json(),
    ]


def execute_step(spec: JobSpec[SlurmRequest], output: OutputCollector) -> None:
    """Run the srun step to completion; raise RunFailed naming the Slurm job and the failed task."""
    failed_tasks: list[int] = []
    failed_nodes: list[str] = []
    on_line = partial(_file_line, output, failed_tasks, failed_nodes)
    job = f"in Slurm job {spec.request.job_id}"
    try:
        code = run_to_completion(spec.request.step, on_line, spec.timeout_s)
    except SystemExit:  # SIGTERM: Slurm ends the job (a node failed, it was cancelled); srun has said why by now
        raise RunFailed(None, f"was terminated {job}{_on_node(failed_nodes)}", output.stderr_tail(-1)) from None
    if code is None:
        raise RunFailed(None, f"timed out after {spec.timeout_s:g} s {job}", output.stderr_tail(-1))
    if code != 0:
        rank = failed_tasks[0] if failed_tasks else None
        tail = output.stderr_tail(rank if rank is not None else -1) + output.stderr_tail(-1)
        raise RunFailed(rank, f"failed {job}{_on_node(failed_nodes)} (srun exit code {code})", tail)


def _on_node(nodes: list[str]) -> str:
    return f" on node {nodes[0]}" if nodes else ""


def _file_line(output: OutputCollector, tasks: list[int], nodes: list[str], stream: str, line: str) -> None:
    """File srun's labelled lines under their rank; srun's own messages (unlabelled) under rank -1, noting the
    first failed task and node they name."""
    labelled = LABEL.match(line)
    if labelled:
        output.add_line(int(labelled.group(1)), stream, labelled.group(2))
        return
    if line.startswith("srun: error"):
        node_failure = NODE_FAILURE.search(line)
        failed = FAILED_TASK.match(line.removeprefix("srun: error: "))
        if node_failure:
            nodes.append(node_failure.group("node"))
        elif failed:
            tasks.append(int(failed.group("task")))
            if failed.group("node"):
                nodes.append(failed.group("node"))
    output.add_line(-1, stream, line)
