"""The job model every launcher renders a point into, kept apart from the backends (as TorchX does)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerSpec:
    """One rank (or, with rank None, one command that starts every rank, as srun does): the command and the
    environment the launcher sets for it (never the caller's secrets)."""

    rank: int | None
    command: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class JobSpec:
    """A rendered job: saved as `jobspec.json` beside the run before anything starts (`manifests`: the Kubernetes
    objects a cluster launcher applies)."""

    launcher: str
    workers: list[WorkerSpec]
    timeout_s: float
    rendezvous: dict[str, Any] = field(default_factory=dict)
    manifests: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RunFailed(RuntimeError):
    """A run did not complete: which rank failed (None if the whole job), how, and the tail of its stderr."""

    def __init__(self, rank: int | None, reason: str, stderr_tail: list[str]) -> None:
        self.rank = rank
        who = "the job" if rank is None else f"rank {rank}"
        tail = "\n".join(f"    {line}" for line in stderr_tail) or "    (no stderr)"
        super().__init__(f"{who} {reason}; last lines of its stderr:\n{tail}")
