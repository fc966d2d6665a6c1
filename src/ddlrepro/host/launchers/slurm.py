"""Slurm launcher: inside the allocation Snakemake's Slurm executor obtained, one `srun` step starts every worker.

`allocation()` is what a point asks Slurm for (the run rule's resources: nodes, tasks, CPUs per task, memory,
runtime, GPUs, partition, account); `render()` the exact srun command, with ports derived from the job id. Each
srun task turns Slurm's task variables into its rank's environment (slurm_task.py): the rendezvous is the first
node of the step. `--label` prefixes every line with its rank. Every framework of the local launcher runs here
too: torch, TensorFlow, Horovod over gloo or MPI, and the MPI all-reduce (MPI through Slurm's PMIx plugin).

Snakemake's Slurm job-step executor removes the allocation's SLURM_* variables (node list, tasks per node, GPUs)
from the job's environment, so this launcher relies only on the job id and its settings; the tasks srun starts
get Slurm's step variables afresh.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ddlrepro.host.config import ConfigError
from ddlrepro.host.launchers.base import JobSpec, RunFailed, WorkerSpec
from ddlrepro.host.launchers.local import check_image_can_run, launch_mode, peak_workers
from ddlrepro.host.launchers.processes import run_to_completion
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point

LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
FAILED_TASK = re.compile(r"task (\d+)")
# Each job takes a block of ports chosen by its id: torch's rendezvous, Horovod's, then one per TensorFlow task on
# its node. Blocks repeat every PORT_BLOCKS job ids (jobs that far apart rarely share a node at the same time), and
# stay below Linux's ephemeral ports (32768 on).
PORT_BASE, PORTS_PER_JOB, PORT_BLOCKS = 15000, 64, 275
SINGLE_NODE_LAUNCHERS = {"elastic", "torchrun"}
JOB_CGROUP = re.compile(r"^job_\d+$")


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


def own_cpu_counter(
    proc_cgroup: Path = Path("/proc/self/cgroup"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> tuple[str, Callable[[], float] | None]:
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


def allocation(point: Point, slurm: dict[str, Any], runtime_min: int) -> dict[str, Any]:
    """The sbatch settings of a point: one task per worker, packed `tasks_per_node` to a node. Elastic points
    (their own launcher starts and stops the workers) get one node with room for their largest cluster."""
    nodes, per_node = node_shape(point, slurm)
    settings = {
        "nodes": nodes,
        "tasks": peak_workers(point),
        "tasks_per_node": per_node,
        "cpus_per_task": point.threads_per_worker,
        "mem_mb": slurm["mem_mb_per_worker"] * per_node,
        "runtime": runtime_min,
        "slurm_partition": slurm.get("partition") or "",
        "slurm_account": slurm.get("account") or "",
        # The plugin leaves srun to a multi-task job's command (ours); it wraps a single-task one in srun itself.
        "mpi": "srun" if point.workers > 1 else "",
    }
    if slurm["gpus_per_node"]:
        settings["gres"] = f"gpu:{min(slurm['gpus_per_node'], per_node)}"
    return settings


def check_cluster_limits(point: Point, slurm: dict[str, Any]) -> None:
    """Refuse a point over the cluster's declared `max_nodes` or `cpus_per_node` (each checked only if set)."""
    nodes, per_node = node_shape(point, slurm)
    cpus = per_node * point.threads_per_worker
    if nodes > slurm.get("max_nodes", nodes):
        raise ConfigError(
            f"{point.figure} point {point.id}: needs {nodes} nodes ({peak_workers(point)} workers, {per_node} per"
            f" node), over launcher.slurm.max_nodes {slurm['max_nodes']}"
        )
    if cpus > slurm.get("cpus_per_node", cpus):
        raise ConfigError(
            f"{point.figure} point {point.id}: {per_node} workers × {point.threads_per_worker} threads = {cpus} CPUs "
            f"on one node, over launcher.slurm.cpus_per_node {slurm['cpus_per_node']}"
        )


def node_shape(point: Point, slurm: dict[str, Any]) -> tuple[int, int]:
    """(nodes, tasks per node): one task per worker, `tasks_per_node` to a node; elastic points on one node, with
    room for their peak (largest cluster plus standbys, counted as the local and Kubernetes launchers do)."""
    workers = peak_workers(point)
    single_node = point.params.get("launcher") in SINGLE_NODE_LAUNCHERS
    per_node = workers if single_node else min(workers, slurm["tasks_per_node"])
    return math.ceil(workers / per_node), per_node


def render(
    point: Point,
    timeout_s: float,
    run_dir: Path,
    environ: dict[str, str] | None = None,
    container: str | None = None,
    settings: dict[str, Any] | None = None,
) -> JobSpec:
    """The srun step this job will run (nothing is started); `environ` defaults to this job's environment,
    `settings` are the config's `launcher.slurm` (tasks and GPUs per node, the srun MPI plugin; without them:
    one node, no GPUs).

    Every point is one srun step shaped as its allocation, a task per worker, ranks in block order; each task turns
    Slurm's step variables into its rank's environment (slurm_task.py). MPI points (Horovod over MPI, the MPI
    all-reduce) are started by srun directly through Slurm's MPI plugin (`--mpi=pmix`). With a container image
    (`.sif`), every task runs inside it through `apptainer exec` (`--nv` with GPUs).
    """
    settings = settings or {}
    mode = launch_mode(point)
    if container:
        check_image_can_run(point)
    nodes, per_node = node_shape(point, {"tasks_per_node": point.workers, **settings})
    job_id = (os.environ if environ is None else environ).get("SLURM_JOB_ID", "0")
    port = PORT_BASE + int(job_id) % PORT_BLOCKS * PORTS_PER_JOB
    env = {
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
    }
    # MASTER_ADDR: each task takes the first node of its step.
    rendezvous = {"master_addr": None, "master_port": port, "job_id": job_id, "mode": mode}
    if mode == "horovod-gloo":
        rendezvous["horovod_port"] = port + 1  # Horovod's rendezvous server, run by rank 0's task
        env["DDLREPRO_HOROVOD_PORT"] = str(port + 1)
    if point.params.get("framework") == "tensorflow":
        if 2 + per_node > PORTS_PER_JOB:
            raise ValueError(f"{per_node} TensorFlow tasks per node need more than the job's {PORTS_PER_JOB} ports")
        rendezvous["tensorflow_port"] = port + 2  # the first of each node's ports, one per task on it
        env["DDLREPRO_TENSORFLOW_PORT"] = str(port + 2)
    with_gpus = int(settings.get("gpus_per_node") or 0) > 0
    mpi = settings.get("mpi", "pmix") if mode == "mpirun" else None
    step = WorkerSpec(None, srun_command(point, (nodes, per_node), with_gpus, container, mpi), env)
    return JobSpec("slurm", [step], timeout_s, rendezvous)


def srun_command(
    point: Point, shape: tuple[int, int], with_gpus: bool, container: str | None, mpi: str | None
) -> list[str]:
    """One srun step with a task per worker on (nodes, tasks per node), ranks in block order, each line labelled
    with its rank (`mpi`: Slurm's MPI plugin)."""
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
        *(["--gpus-per-task=1"] if with_gpus else []),
        *inside,
        "-m",
        "ddlrepro.rank.slurm_task",
        point.to_json(),
    ]


def execute(spec: JobSpec, output: OutputCollector) -> None:
    """Run the srun step to completion; raise RunFailed naming the Slurm job and the failed task."""
    (step,) = spec.workers
    failed_tasks: list[int] = []
    code = run_to_completion(step, partial(_file_line, output, failed_tasks), spec.timeout_s)
    job = f"in Slurm job {spec.rendezvous.get('job_id')}"
    if code is None:
        raise RunFailed(None, f"timed out after {spec.timeout_s:g} s {job}", output.stderr_tail(-1))
    if code != 0:
        rank = failed_tasks[0] if failed_tasks else None
        tail = output.stderr_tail(rank if rank is not None else -1) + output.stderr_tail(-1)
        raise RunFailed(rank, f"failed {job} (srun exit code {code})", tail)


def _file_line(output: OutputCollector, failed_tasks: list[int], stream: str, line: str) -> None:
    """File srun's labelled lines under their rank; srun's own messages (unlabelled) under rank -1."""
    labelled = LABEL.match(line)
    if labelled:
        output.add_line(int(labelled.group(1)), stream, labelled.group(2))
        return
    found = FAILED_TASK.search(line) if line.startswith("srun: error") else None
    if found:
        failed_tasks.append(int(found.group(1)))
    output.add_line(-1, stream, line)
