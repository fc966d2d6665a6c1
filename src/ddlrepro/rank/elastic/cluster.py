"""The desired cluster as the config server holds it and every worker reads it: a version and its members."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
