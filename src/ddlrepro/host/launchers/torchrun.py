"""torchrun elastic runtime (a point's `elastic: torchrun`, hosted by the local and Slurm launchers): the elastic
baseline. One torchrun agent (an elastic "node" with one worker) per member,
c10d rendezvous on loopback; the launcher starts agents when the cluster grows and stops the newest when it
shrinks, and torchrun restarts every worker each time membership changes (`rank/elastic/torchrun_worker.py`
resumes them from the checkpoint).

Rendezvous settings as measured to work with the pinned torch (envs/requirements.txt): `last_call_timeout=1` with
`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (a fresh store per round), else restarts fail in gloo's connectFullMesh.

Shrinking: torch has no graceful way for one agent to leave. An agent stopped by a signal skips the rendezvous
shutdown on purpose (torch/distributed/launcher/api.py: closing it would end the rendezvous for every agent), so
the survivors wait until the leaver's keep-alive heartbeats are overdue, `keep_alive_interval` ×
`keep_alive_max_attempt` of the c10d rendezvous (5 s × 3 by default). The point parameter `torchrun_keep_alive`
picks torch's default or the tuned setting (`KEEP_ALIVE`); kungfu-fig7 runs both and compares with the faster.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ddlrepro.host.configserver import ClusterConfig, ConfigServer
from ddlrepro.host.launch import elastic_start
from ddlrepro.host.launchers.base import RunFailed, WorkerSpec
from ddlrepro.host.launchers.inplace import host_store, starting_workers, verify_continuity
from ddlrepro.host.launchers.processes import (
    ON_THIS_HOST,
    POLL_INTERVAL_S,
    Started,
    drain,
    free_loopback_port,
    start,
    stop,
)
from ddlrepro.host.launchers.situations import Director, Situation
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point
from ddlrepro.rank.elastic.cluster import SERVER_ENV, TOKEN_ENV, Cluster

WORKER_MODULE = "ddlrepro.rank.elastic.torchrun_worker"
BASE_RDZV_CONF = "last_call_timeout=1"
# After the host agent exits at the stop, how long the others get to exit by themselves before they are stopped.
STRAGGLER_GRACE_S = 5.0
# Tuned: 1 s is the smallest interval torch accepts (whole seconds). Heartbeats go out on a timer of that period
# but only once the last one is a full period old, so they can be nearly 2 periods apart: a window of 2 wrongly
# drops a live agent (measured here: a second, lone rendezvous formed), hence 3.
KEEP_ALIVE = {"default": "", "tuned": ",keep_alive_interval=1,keep_alive_max_attempt=3"}


def rdzv_conf(params: dict[str, Any]) -> str:
    """The c10d rendezvous settings of a point: the base, its keep-alive (`torchrun_keep_alive`, default torch's)."""
    keep_alive = params.get("torchrun_keep_alive", "default")
    if keep_alive not in KEEP_ALIVE:
        raise ValueError(f"torchrun_keep_alive: {keep_alive!r} is not one of {', '.join(KEEP_ALIVE)}")
    return BASE_RDZV_CONF + KEEP_ALIVE[keep_alive]


@dataclass(frozen=True)
class TorchrunRequest:
    """A torchrun elastic job: the agent command and environment (agent i adds its `--rdzv-conf`), the c10d
    rendezvous endpoint (its store hosted by the launcher), the config server, the schedule, the initial members
    and the situation the host acts out, if any (a late worker or a joiner: one more agent)."""

    runtime: str
    agent: WorkerSpec
    endpoint: str
    config_server: str
    schedule: str
    initial_workers: int
    max_size: int
    rdzv_conf: str
    situation: Situation | None = None


def request(point: Point, run_dir: Path) -> TorchrunRequest:
    """What the job will start; no process is started."""
    elastic = elastic_start(point)
    most = elastic.largest_cluster
    situation = Situation.of(point.params)
    port = free_loopback_port()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes=1:{most}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=ddlrepro",
        "--max-restarts=1000",
        "--monitor-interval=0.1",
        "-m",
        WORKER_MODULE,
        point.to_json(),
    ]
    env = {
        **ON_THIS_HOST,
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
        SERVER_ENV: f"127.0.0.1:{free_loopback_port()}",
    }
    return TorchrunRequest(
        runtime="torchrun",
        agent=WorkerSpec(None, command, env),
        endpoint=f"127.0.0.1:{port}",
        config_server=env[SERVER_ENV],
        schedule=point.params["schedule"],
        initial_workers=starting_workers(elastic.initial_workers, situation),
        max_size=most,
        rdzv_conf=rdzv_conf(point.params),
        situation=situation,
    )


class Agents:
    """The job's torchrun agents by member id; started and stopped as the cluster changes."""

    def __init__(self, job: TorchrunRequest, output: OutputCollector, token: str) -> None:
        self.template = job.agent
        self.rdzv_conf = job.rdzv_conf
        self.output = output
        self.token = token
        self.running: dict[int, Started] = {}
        self.stopping: set[int] = set()
        self.host_exited: float | None = None

    def start(self, agent: int) -> None:
        command = list(self.template.command)
        # No agent hosts the rendezvous store: `execute` does, listening on loopback only (torch's binds everywhere).
        command.insert(command.index(WORKER_MODULE) - 1, f"--rdzv-conf={self.rdzv_conf},is_host=0")
        env = {**self.template.env, TOKEN_ENV: self.token}
        self.running[agent] = start(WorkerSpec(agent, command, env), partial(self.output.add_line, agent))

    def new_agents(self, count: int, members: list[int]) -> list[int]:
        first = len(self.running)
        for agent in range(first, first + count):
            self.start(agent)
        return list(range(first, first + count))

    def follow(self, cluster: Cluster) -> None:
        """Stop the agents no longer in the cluster (in the background: stopping waits for them). At the stop
        (no members) the workers finish by themselves and so do their agents."""
        leaving = [a for a in list(self.running) if a not in cluster.members and a not in self.stopping]
        if not cluster.members or not leaving:
            return
        self.stopping.update(leaving)
        threading.Thread(target=stop, args=([self.running[a] for a in leaving],), daemon=True).start()

    def failed(self) -> list[int]:
        return [
            a for a, one in list(self.running.items()) if one.process.poll() not in (None, 0) and a not in self.stopping
        ]

    def all_exited(self) -> bool:
        return all(one.process.poll() is not None for one in list(self.running.values()))

    def finished(self) -> bool:
        """Every agent exited, or the first agent exited STRAGGLER_GRACE_S ago: the job is over, and an agent still
        running then (one that came too late to join) has no one left to rendezvous with."""
        if self.all_exited():
            return True
        host = self.running[0].process
        if host.poll() is None:
            return False
        self.host_exited = self.host_exited or time.monotonic()
        return time.monotonic() - self.host_exited > STRAGGLER_GRACE_S


def execute(job: TorchrunRequest, timeout_s: float, output: OutputCollector) -> None:
    """Run the agents until the schedule stops the job; raise RunFailed if an agent fails or on a timeout."""
    token = secrets.token_urlsafe(24)
    agents = Agents(job, output, token)
    config = ClusterConfig(list(range(job.initial_workers)), agents.new_agents, agents.follow, max_size=job.max_size)
    host, _, port = job.config_server.rpartition(":")
    deadline = time.monotonic() + timeout_s
    director = job.situation and Director(job.situation, lambda: agents.start(len(agents.running)), output, config.stop)
    store = host_store(job.endpoint, timeout_s)  # the c10d rendezvous' store, hosted here for the whole job
    try:
        with ConfigServer(config, token, host, int(port)):
            if director:
                director.start(timeout_s)
            for agent in range(job.initial_workers):
                agents.start(agent)
            while not (agents.finished() and not config.latest.members):
                if director:
                    director.check()
                failed = agents.failed()
                if failed:
                    raise RunFailed(failed[0], "(torchrun agent) failed", output.stderr_tail(failed[0]))
                if time.monotonic() > deadline:
                    raise RunFailed(None, f"timed out after {timeout_s:g} s", output.stderr_tail(0))
                time.sleep(POLL_INTERVAL_S)
        verify_continuity(output)
    finally:
        if director:
            director.stop()
        stop(list(agents.running.values()))
        drain(list(agents.running.values()))
        if director:
            director.finish()
        del store  # the rendezvous ends with the job
