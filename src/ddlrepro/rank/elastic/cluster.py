"""The desired cluster as the config server holds it and every worker reads it (a version and its members), and how
a job's processes find it: the environment the launcher sets and the keys of the job's store. Free of torch, so the
host side that launches the job can use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

SERVER_ENV = "DDLREPRO_ELASTIC_SERVER"
STORE_ENV = "DDLREPRO_ELASTIC_STORE"
TOKEN_ENV = "DDLREPRO_ELASTIC_TOKEN"
WORKER_ENV = "DDLREPRO_WORKER_ID"
AGREED_KEY = "agreed"


class Store(Protocol):
    """What of torch.distributed's TCPStore the agreement needs."""

    def set(self, key: str, value: str) -> None: ...


@dataclass(frozen=True)
class Cluster:
    """One version of the desired cluster."""

    version: int
    members: list[int]
    time: float
    reason: str

    def rank_of(self, worker: int) -> int | None:
        return self.members.index(worker) if worker in self.members else None

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Cluster:
        return cls(int(value["version"]), [int(member) for member in value["members"]], value["time"], value["reason"])


def ready_key(worker: int) -> str:
    """Set by a worker once it has built its model: the launcher waits for the warm standbys' keys."""
    return f"ready/{worker}"


def publish_agreed(store: Store, version: int) -> None:
    store.set(AGREED_KEY, str(version))
