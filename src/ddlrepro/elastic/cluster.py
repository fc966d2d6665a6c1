"""How a worker joins, agrees on and re-forms its cluster, and how an event's latency is split into phases.

The launcher hosts a TCPStore beside the config server. Group version V is formed on the store prefix
`group/V/`; the key `agreed` holds the latest version the survivors agreed to act on, so joiners (cold or warm)
join exactly the group the survivors form.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ddlrepro.elastic.client import ConfigClient
from ddlrepro.elastic.server import Cluster
from ddlrepro.workloads.records import emit

SERVER_ENV = "DDLREPRO_ELASTIC_SERVER"
STORE_ENV = "DDLREPRO_ELASTIC_STORE"
TOKEN_ENV = "DDLREPRO_ELASTIC_TOKEN"
WORKER_ENV = "DDLREPRO_WORKER_ID"
AGREED_KEY = "agreed"
POLL_S = 0.002
PHASES = ["detect", "agree", "spawn_join", "group_init", "state_sync", "first_step"]


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
        prefix = dist.PrefixStore(f"group/{cluster.version}/", store)
        self.backend = dist.ProcessGroupGloo(prefix, rank, self.size, timedelta(seconds=timeout_s))

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = op
        self.backend.allreduce([tensor], options).wait()

    def broadcast(self, tensor: torch.Tensor, source: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = source
        self.backend.broadcast([tensor], options).wait()


def retire(groups: list[Group]) -> None:
    """Tear down old groups in the background."""
    threading.Thread(target=groups.clear, name="retire-groups", daemon=True).start()


def ready_key(worker: int) -> str:
    """Set by a worker once it has built its model: the launcher waits for the warm standbys' keys."""
    return f"ready/{worker}"


def agreed_version(store: dist.Store) -> int:
    return int(store.get(AGREED_KEY))


def publish_agreed(store: dist.Store, version: int) -> None:
    store.set(AGREED_KEY, str(version))


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


@dataclass
class ResizeEvent:
    """One resize as rank 0 lived it: wall-clock marks from seeing the new config to the first step after."""

    step: int
    from_size: int
    fault: bool = False
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks[name] = time.time() if at is None else at

    def phases(self) -> dict[str, float]:
        """Durations that add up to the total: detect, agree, spawn/join, group init, state sync, first step."""
        m = self.marks
        joined = max(m["agreed"], m.get("joiners_ready", 0.0))
        return {
            "detect": m["config"] - m["seen"],
            "agree": m["agreed"] - m["config"],
            "spawn_join": joined - m["agreed"],
            "group_init": max(m["group"] - joined, 0.0),
            "state_sync": m["synced"] - max(m["group"], joined),
            "first_step": m["first_step"] - m["synced"],
        }

    def emit(self, to_size: int) -> None:
        phases = self.phases()
        values = {
            "resize_latency_s": self.marks["first_step"] - self.marks["seen"],
            "resize_to_sync_s": self.marks["synced"] - self.marks["seen"],
            "resize_from_size": self.from_size,
            "resize_to_size": to_size,
            "resize_fault": float(self.fault),
            **{f"resize_{name}_s": phases[name] for name in PHASES},
        }
        for metric, value in values.items():
            emit("metric", rank=0, step=self.step, metric=metric, value=float(value))


def worker_environment() -> tuple[str, str, str | None, int]:
    """Config server and store addresses, token and worker id, as the launcher set them."""
    return (
        os.environ[SERVER_ENV],
        os.environ[STORE_ENV],
        os.environ.get(TOKEN_ENV),
        int(os.environ[WORKER_ENV]),
    )
