"""How a worker joins, agrees on and re-forms its cluster, and how an event's latency is split into phases.

The launcher hosts a TCPStore beside the config server. Group version V is formed on the store prefix
`group/V/`; the key `agreed` holds the latest version the survivors agreed to act on, so joiners (cold or warm)
join exactly the group the survivors form.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ddlrepro.rank.elastic.client import ConfigClient
from ddlrepro.rank.elastic.cluster import (
    AGREED_KEY,
    SERVER_ENV,
    STORE_ENV,
    TOKEN_ENV,
    WORKER_ENV,
    Cluster,
    publish_agreed,
)

POLL_S = 0.002


def connect_store(address: str, timeout_s: float) -> dist.TCPStore:
    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


class Group:
    """One version's process group (gloo, CPU), held by the elastic runtime itself rather than as torch's default
    group: forming the next one does not wait for this one's teardown (5–10 ms), which happens after the first
    step at the new size, off the resize's critical path."""

    def __init__(self, store: dist.Store, cluster: Cluster, rank: int, timeout_s: float) -> None:
        self.rank = rank
        self.size = len(cluster.members)
        self.version = cluster.version
        prefix = dist.PrefixStore(f"group/{cluster.version}/", store)
        self.backend: dist.ProcessGroupGloo | None = dist.ProcessGroupGloo(
            prefix, rank, self.size, timedelta(seconds=timeout_s)
        )

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = op
        self.open_backend().allreduce([tensor], options).wait()

    def open_backend(self) -> Any:
        """The group's gloo backend (Any: torch's stubs leave out its collectives, which its binding has)."""
        if self.backend is None:
            raise RuntimeError(f"the group of cluster version {self.version} is closed")
        return self.backend

    def close(self) -> None:
        """Tear the group down now: gloo closes its connections only when the backend is destroyed (abort and
        shutdown do not), and peers blocked on it must fail at once rather than at their timeout."""
        self.backend = None

    def broadcast(self, tensor: torch.Tensor, source: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = source
        self.open_backend().broadcast([tensor], options).wait()


def retire(groups: list[Group]) -> None:
    """Tear down old groups in the background, on a non-daemon thread: the interpreter waits for it at exit (a
    teardown still running when it finalises aborts the process: "terminate called without an active exception")."""
    threading.Thread(target=groups.clear, name="retire-groups").start()


def agreed_version(store: dist.Store) -> int:
    return int(store.get(AGREED_KEY))


def await_assignment(client: ConfigClient, store: dist.Store, worker: int) -> Cluster | None:
    """As a joiner or standby: wait until the survivors agree on a version that lists this worker (None: stop)."""
    cluster = client.latest()
    while True:
        while worker not in cluster.members:
            if not cluster.members:
                return None
            cluster = client.wait_newer(cluster.version)
        while agreed_version(store) < cluster.version:
            time.sleep(POLL_S)
        agreed = client.version(agreed_version(store))
        if worker in agreed.members:
            return agreed
        cluster = client.latest()


def elect_after_fault(client: ConfigClient, store: dist.Store, failed: Cluster, timeout_s: float) -> Cluster:
    """After a collective failed in version `failed`: the first survivor to ask picks the newest version (the
    launcher publishes one without the dead worker); every survivor acts on that same pick."""
    newer = client.wait_newer(failed.version, timeout_s)
    if newer.version == failed.version:
        raise RuntimeError(f"no new cluster version within {timeout_s:g} s after a failure in version {failed.version}")
    chosen = int(store.compare_set(f"recover/{failed.version}", "", str(newer.version)))
    if chosen > agreed_version(store):
        publish_agreed(store, chosen)
    return client.version(chosen)


def worker_environment() -> tuple[str, str, str | None, int]:
    """Config server and store addresses, token and worker id, as the launcher set them."""
    return (
        os.environ[SERVER_ENV],
        os.environ[STORE_ENV],
        os.environ.get(TOKEN_ENV),
        int(os.environ[WORKER_ENV]),
    )
