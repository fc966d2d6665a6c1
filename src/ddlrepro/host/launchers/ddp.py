"""Plain data-parallel runtime in a static world (a point's `elastic: ddp`, hosted by the local and Slurm
launchers): the non-elastic baseline of biggan-elasticity. Every rank gets torchrun's environment with a fixed
WORLD_SIZE (`rank/elastic/ddp_worker.py`); rank 0 hosts the rendezvous store. Nothing restarts a worker or takes a
new one: what the job does when a worker is late, killed or added (launchers/situations.py) is what torch does.

A worker that fails is an outcome here, not a failed run: the run records it (`exit_code`, per rank) and ends
when every member has exited. It fails only on a timeout.

The harness's config server (no part of DDP) tells rank 0 when the host stops the job (situations.py); rank 0
broadcasts it to the world after every step.
"""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ddlrepro.host.configserver import ClusterConfig, ConfigServer
from ddlrepro.host.launch import elastic_start
from ddlrepro.host.launchers.base import RunFailed, WorkerSpec
from ddlrepro.host.launchers.processes import (
    ON_THIS_HOST,
    POLL_INTERVAL_S,
    Started,
    drain,
    free_loopback_port,
    start,
    stop,
)
from ddlrepro.host.launchers.situations import Director, Situation, record
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point
from ddlrepro.rank.elastic.cluster import SERVER_ENV, TOKEN_ENV

WORKER_MODULE = "ddlrepro.rank.elastic.ddp_worker"


@dataclass(frozen=True)
class DdpRequest:
    """A static-world job: the worker command and environment (each rank adds RANK and WORLD_SIZE), its world
    size, and the situation the host acts out."""

    runtime: str
    worker: WorkerSpec
    world_size: int
    situation: Situation


def request(point: Point, run_dir: Path) -> DdpRequest:
    """What the job will start; no process is started."""
    situation = Situation.of(point.params)
    if situation is None:
        raise ValueError("elastic: ddp needs a point `situation` (late-start, killed or joins)")
    env = {
        **ON_THIS_HOST,
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_loopback_port()),
        SERVER_ENV: f"127.0.0.1:{free_loopback_port()}",
    }
    command = [sys.executable, "-m", WORKER_MODULE, point.to_json()]
    return DdpRequest("ddp", WorkerSpec(None, command, env), elastic_start(point).initial_workers, situation)


class StaticWorld:
    """The job's processes by rank; members are ranks below the world size, a joiner gets the next rank of a
    world one larger (the only way to start one more plain DDP process: the running world never counts it)."""

    def __init__(self, job: DdpRequest, output: OutputCollector, token: str) -> None:
        self.job = job
        self.output = output
        self.token = token
        self.processes: dict[int, Started] = {}

    def start(self, rank: int) -> None:
        world = max(self.job.world_size, rank + 1)
        env = {**self.job.worker.env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0"}
        env[TOKEN_ENV] = self.token
        spec = WorkerSpec(rank, self.job.worker.command, env)
        self.processes[rank] = start(spec, partial(self.output.add_line, rank))

    def add(self) -> None:
        self.start(len(self.processes))

    def members_exited(self) -> bool:
        members = [one for rank, one in list(self.processes.items()) if rank < self.job.world_size]
        return len(members) == self.job.world_size and all(one.process.poll() is not None for one in members)


def execute(job: DdpRequest, timeout_s: float, output: OutputCollector) -> None:
    """Run the world until every member has exited; raise RunFailed on a timeout."""
    token = secrets.token_urlsafe(24)
    world = StaticWorld(job, output, token)
    # Only the host's stop goes through it: nothing grows a static world.
    config = ClusterConfig(list(range(job.world_size)), lambda _count, _members: [], max_size=job.world_size)
    director = Director(job.situation, world.add, output, config.stop)
    host, _, port = job.worker.env[SERVER_ENV].rpartition(":")
    deadline = time.monotonic() + timeout_s
    try:
        with ConfigServer(config, token, host, int(port)):
            director.start(timeout_s)
            for rank in range(job.situation.workers_at_start(job.world_size)):
                world.start(rank)
            while not world.members_exited():
                director.check()
                if time.monotonic() > deadline:
                    raise RunFailed(None, f"timed out after {timeout_s:g} s", output.stderr_tail(0))
                time.sleep(POLL_INTERVAL_S)
            director.check()
    finally:
        director.stop()
        stop(list(world.processes.values()))
        drain(list(world.processes.values()))
        director.finish()
    for rank, one in world.processes.items():
        record(output, "exit_code", time.time(), rank=rank, value=float(one.process.returncode))
    if output.result is None:  # the outcome is what the figure reports; the run itself completed
        output.result = {"steps": None, "samples": None, "training": "failed"}
