"""In-place elastic runtime (a point's `elastic: inplace`, hosted by the local and Slurm launchers): runs the config
server and the store, and starts, keeps and watches the workers of an elastic point on this machine (or on the one
node of its Slurm allocation).

Workers are started cold when the cluster grows, or handed out from a pool of warm standbys (point parameter
`standby`: processes started up front that imported torch and built the model; in that mode leavers return to
the pool). A cold joiner is forked from the job's fork server, which imported torch and the worker's modules when
the job started (forkserver.py), where the job may grow beyond its standbys; it is started as a new process where
the server cannot fork it. A worker that dies is removed from the cluster at once; the survivors re-form without
it. The run fails only if the job times out or no member is left alive before the schedule's stop.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ddlrepro.host.configserver import ClusterConfig, ConfigServer, RequestError
from ddlrepro.host.launch import ElasticStart, elastic_start
from ddlrepro.host.launchers.base import RunFailed, WorkerSpec
from ddlrepro.host.launchers.forkserver import ForkServer
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
from ddlrepro.host.ledger import LedgerError, verify
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point
from ddlrepro.rank.elastic.cluster import SERVER_ENV, STORE_ENV, TOKEN_ENV, WORKER_ENV, publish_agreed, ready_key

if TYPE_CHECKING:
    import torch.distributed as dist

WORKER_MODULE = "ddlrepro.rank.elastic.inplace_worker"
# What a cold worker spends its start on: torch, and torch._dynamo, which the first optimizer and DDP import lazily
# (over 1 s here)
FORK_SERVER_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel", WORKER_MODULE]


@dataclass(frozen=True)
class InplaceRequest:
    """An in-place elastic job: the worker command and environment every worker gets (its id and the token are
    added at start), the config server's and the store's addresses, the schedule, the initial members and the
    warm standby pool; the situation the host acts out, if any (a late worker is added to the cluster when it
    comes, a joiner likewise)."""

    runtime: str
    worker: WorkerSpec
    config_server: str
    store: str
    schedule: str
    initial_workers: int
    standby: int
    max_size: int
    situation: Situation | None = None
    fork_server: bool = False  # cold joiners forked from a server that imported torch at the start (forkserver.py)


def request(point: Point, run_dir: Path) -> InplaceRequest:
    """What the job will start (no process is started; the token is made at start)."""
    env = {
        **ON_THIS_HOST,
        "OMP_NUM_THREADS": str(point.threads_per_worker),
        "PYTHONUNBUFFERED": "1",
        "DDLREPRO_RUN_DIR": str(run_dir.resolve()),
        SERVER_ENV: f"127.0.0.1:{free_loopback_port()}",
        STORE_ENV: f"127.0.0.1:{free_loopback_port()}",
    }
    situation, elastic = Situation.of(point.params), elastic_start(point)
    return InplaceRequest(
        runtime="inplace",
        worker=WorkerSpec(None, [sys.executable, "-m", WORKER_MODULE, point.to_json()], env),
        config_server=env[SERVER_ENV],
        store=env[STORE_ENV],
        schedule=point.params["schedule"],
        initial_workers=starting_workers(elastic.initial_workers, situation),
        standby=elastic.standby,
        max_size=elastic.largest_cluster,
        situation=situation,
        fork_server=needs_cold_joiners(elastic, situation),
    )


def needs_cold_joiners(elastic: ElasticStart, situation: Situation | None) -> bool:
    """Whether the schedule grows the job beyond its warm standbys (then a fork server spares each cold joiner its
    imports). A situation's late or joining worker stands for a process coming from elsewhere: started, never
    forked."""
    return situation is None and elastic.largest_cluster > elastic.initial_workers + elastic.standby


def starting_workers(initial: int, situation: Situation | None) -> int:
    """Workers started at once: the point's initial workers, less a late one."""
    return initial if situation is None else situation.workers_at_start(initial)


class WorkerPool:
    """The job's worker processes by worker id; hands out ids for new members (idle warm standbys first). The
    config server's thread adds workers while the supervisor reads them: both go through the lock."""

    def __init__(
        self, job: InplaceRequest, output: OutputCollector, token: str, forks: ForkServer | None = None
    ) -> None:
        self.template = job.worker
        self.output = output
        self.token = token
        self.warm = job.standby > 0
        self.forks = forks
        self.processes: dict[int, Started] = {}
        self.lock = threading.Lock()
        self.removed: set[int] = set()

    def spawn(self, forked: bool = False) -> int:
        """A new worker: a new process, or with `forked` one the fork server forks where it can."""
        with self.lock:
            worker = len(self.processes)
            env = {**self.template.env, WORKER_ENV: str(worker), TOKEN_ENV: self.token}
            spec = WorkerSpec(worker, self.template.command, env)
            on_line = partial(self.output.add_line, worker)
            started = self.forks.fork(spec, on_line) if forked and self.forks else None
            self.processes[worker] = started or start(spec, on_line)
        return worker

    def new_workers(self, count: int, members: list[int]) -> list[int]:
        """Idle warm standbys first; the rest cold: forked by the fork server (its imports waited for outside the
        lock, once), or started."""
        idle = self.idle(members)[:count] if self.warm else []
        forked = count > len(idle) and self.forks is not None and self.forks.usable()
        return idle + [self.spawn(forked) for _ in range(count - len(idle))]

    def idle(self, members: list[int]) -> list[int]:
        return [worker for worker, one in self.started() if worker not in members and one.process.poll() is None]

    def dead(self) -> list[int]:
        """Workers that exited with an error or were killed, each reported once."""
        newly = [w for w, one in self.started() if one.process.poll() not in (None, 0) and w not in self.removed]
        self.removed.update(newly)
        return newly

    def all_exited(self) -> bool:
        return all(one.process.poll() is not None for _, one in self.started())

    def started(self) -> list[tuple[int, Started]]:
        """Every worker started so far, with its process."""
        with self.lock:
            return list(self.processes.items())


def execute(job: InplaceRequest, timeout_s: float, output: OutputCollector) -> None:
    """Run the elastic job until the schedule stops it; raise RunFailed on a timeout or if every member died."""
    token = secrets.token_urlsafe(24)
    store = host_store(job.store, timeout_s)
    forks = ForkServer(job.worker.env, FORK_SERVER_PRELOAD).start() if job.fork_server else None
    pool = WorkerPool(job, output, token, forks)
    config = ClusterConfig(list(range(job.initial_workers)), pool.new_workers, max_size=job.max_size)
    server_host, _, server_port = job.config_server.rpartition(":")
    director = Director(job.situation, lambda: grow(config), output, config.stop) if job.situation else None
    try:
        with ConfigServer(config, token, server_host, int(server_port)):
            if director:
                director.start(timeout_s)
            for _ in range(job.initial_workers + job.standby):
                pool.spawn()
            _await_ready(store, list(pool.processes), pool, timeout_s)
            # No group exists yet: the first is formed on the latest version (a late worker may have been added
            # while the first ones started).
            publish_agreed(store, config.latest.version)
            _supervise(pool, config, time.monotonic() + timeout_s, output, director)
        verify_continuity(output)
    finally:
        if director:
            director.stop()
        workers = [one for _, one in pool.started()]
        stop(workers)
        drain(workers)
        if forks:
            forks.stop()
        if director:
            director.finish()


def grow(config: ClusterConfig) -> None:
    """One more member (a late worker or a joiner comes): the pool starts it and the survivors take it in."""
    config.resize(len(config.latest.members) + 1)


def host_store(address: str, timeout_s: float) -> dist.TCPStore:
    """The job's TCPStore, listening on `address`'s host only.

    torch binds a master store to every interface whatever `host_name` says, and the store has no authentication,
    so we bind the listening socket ourselves and hand it over. Elastic jobs run on one node, so `address` is on
    127.0.0.1; on a multi-node job it would be the rendezvous host's own address, protected only by the job's
    network."""
    from ddlrepro.rank.runtime import listening_store

    host, _, port = address.rpartition(":")
    return listening_store(host, int(port), timedelta(seconds=timeout_s))


def _await_ready(store: dist.Store, workers: list[int], pool: WorkerPool, timeout_s: float) -> None:
    """Start the job once every initial worker and warm standby has built its model."""
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        while not store.check([ready_key(worker)]):
            if pool.processes[worker].process.poll() is not None or time.monotonic() > deadline:
                raise RunFailed(worker, "did not start", pool.output.stderr_tail(worker))
            time.sleep(POLL_INTERVAL_S)


def _supervise(
    pool: WorkerPool, config: ClusterConfig, deadline: float, output: OutputCollector, director: Director | None
) -> None:
    while True:
        if director:
            director.check()
        for worker in pool.dead():
            members = config.latest.members
            if members == [worker]:
                raise RunFailed(worker, "died, and it was the last member of the cluster", output.stderr_tail(worker))
            with contextlib.suppress(RequestError):  # an idle standby, or a worker already out of the cluster
                config.remove(worker)
        if not config.latest.members and pool.all_exited():
            return
        if time.monotonic() > deadline:
            raise RunFailed(None, "timed out", output.stderr_tail(0))
        time.sleep(POLL_INTERVAL_S)


def verify_continuity(output: OutputCollector) -> None:
    """Fail the run if its ledger shows a sample skipped or trained twice."""
    if output.result is None:
        return
    try:
        verify(output.ledger_records, output.result["samples"])
    except LedgerError as error:
        raise RunFailed(None, f"broke data continuity: {error}", []) from None
