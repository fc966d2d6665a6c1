"""Slurm launcher: inside the allocation Snakemake's Slurm executor obtained, one `srun` step starts every worker.

`allocation()` is what a point asks Slurm for (the run rule's resources: nodes, tasks, CPUs per task, memory,
runtime, GPUs, partition, account); `render()` the exact srun command and the rendezvous taken from the
allocation (first host of the node list, a port derived from the job id). Workers read their rank from Slurm's
SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; `--label` prefixes every line with its rank.
"""

from __future__ import annotations

import math
import os
import re
import sys
from functools import partial
from pathlib import Path
from typing import Any

from ddlrepro.launchers.base import JobSpec, RunFailed, WorkerSpec
from ddlrepro.launchers.processes import run_to_completion
from ddlrepro.points import Point
from ddlrepro.rundir import OutputCollector

LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
FAILED_TASK = re.compile(r"task (\d+)")
PORT_BASE, PORT_RANGE = 15000, 20000
SINGLE_NODE_LAUNCHERS = {"elastic", "torchrun"}
UNSUPPORTED = {"framework": {"horovod", "tensorflow"}, "backend": {"mpi"}}


def allocation(point: Point, slurm: dict[str, Any], runtime_min: int) -> dict[str, Any]:
    """The sbatch settings of a point: one task per worker, packed `tasks_per_node` to a node. Elastic points
    (their own launcher starts and stops the workers) get one node with room for their largest cluster."""
    single_node = point.params.get("launcher") in SINGLE_NODE_LAUNCHERS
    per_node = point.workers if single_node else min(point.workers, slurm["tasks_per_node"])
    settings = {
        "nodes": math.ceil(point.workers / per_node),
        "tasks": point.workers,
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


def first_host(nodelist: str) -> str:
    """First host of a Slurm node list: `gpu[01-08],login1` → `gpu01`, `node[3,5-7]` → `node3`, `a1,b2` → `a1`."""
    match = re.match(r"([^,\[]+)(?:\[([^,\]-]+))?", nodelist)
    if not match:
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    return match.group(1) + (match.group(2) or "")


def render(
    point: Point, timeout_s: float, run_dir: Path, environ: dict[str, str] | None = None, container: str | None = None
) -> JobSpec:
    """The srun step this job will run (nothing is started); `environ` defaults to this job's environment.

    With a container image (`.sif`), every worker runs inside it through `apptainer exec` (`--nv` with GPUs).
    Only torch.distributed points: Horovod, TensorFlow and MPI points need a rendezvous of their own (horovodrun's,
    TF_CONFIG, mpirun) that this launcher does not set up yet; they are refused here rather than failing later.
    """
    unsupported = [
        f"{key} {point.params[key]!r}" for key, values in UNSUPPORTED.items() if point.params.get(key) in values
    ]
    if unsupported:
        raise RunFailed(
            None, f"cannot run {' and '.join(unsupported)} under the Slurm launcher (local launcher only)", []
        )
    environ = dict(os.environ if environ is None else environ)
    job_id = environ.get("SLURM_JOB_ID", "0")
    master = first_host(environ["SLURM_JOB_NODELIST"]) if "SLURM_JOB_NODELIST" in environ else "127.0.0.1"
    port = PORT_BASE + int(job_id) % PORT_RANGE
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
    }
    gpus = environ.get("SLURM_GPUS_ON_NODE")
    with_gpus = bool(gpus) and int(gpus) > 0
    inside = (
        ["apptainer", "exec", *(["--nv"] if with_gpus else []), container, "python"] if container else [sys.executable]
    )
    command = [
        "srun",
        f"--ntasks={point.workers}",
        f"--cpus-per-task={point.threads_per_worker}",
        "--kill-on-bad-exit=1",
        "--overlap",
        "--label",
        "--unbuffered",
        *(["--gpus-per-task=1"] if with_gpus else []),
        *inside,
        "-m",
        "ddlrepro.workloads",
        point.to_json(),
    ]
    rendezvous = {"master_addr": master, "master_port": port, "job_id": job_id}
    return JobSpec("slurm", [WorkerSpec(None, command, env)], timeout_s, rendezvous)


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
