"""A point is one distributed run: a workload, its parameters and a number of workers."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Point:
    """One distributed run of a figure; its id is a stable hash of everything that defines the run."""

    figure: str
    workload: str
    workers: int
    threads_per_worker: int
    params: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    """Where the run's inputs lie on this machine (a user's data folder): handed to the workload beside `params`,
    but outside the id and the tables (the run's jobspec.json and provenance.json keep them, as config-used.yaml
    keeps the config); what they hold belongs in `params` (e.g. a digest of the files)."""
    replicate: int = 0
    """Which fresh-process repetition of the same run this is (timing claims are judged over replicates, checks.py).
    The workload never sees it; it is part of the id from replicate 1 on, so replicate 0 keeps the id the point had
    before replicates existed and raising `checks.replicates` adds runs without redoing any."""

    def __post_init__(self) -> None:
        clash = sorted(set(self.params) & set(self.inputs))
        if clash:
            raise ValueError(f"point of {self.figure}: {clash} are both params and inputs (a workload gets both)")

    @property
    def id(self) -> str:
        """Readable prefix + hash of the canonical JSON of the point, e.g. `resnet20-np2-3f9c1a02b4`."""
        digest = hashlib.sha256(canonical_json(self.identity()).encode()).hexdigest()[:10]
        model = self.params.get("model")
        prefix = f"{model}-np{self.workers}" if model else f"np{self.workers}"
        return f"{prefix}-{digest}"

    def identity(self) -> dict[str, Any]:
        """What defines the run (the figure it belongs to is only where it is filed)."""
        identity = {
            "workload": self.workload,
            "workers": self.workers,
            "threads_per_worker": self.threads_per_worker,
            "params": self.params,
        }
        return identity | ({"replicate": self.replicate} if self.replicate else {})

    def to_json(self) -> str:
        """The point as JSON; replicate 0 left out, so a run's command reads as before replicates existed."""
        fields = asdict(self)
        if not self.replicate:
            del fields["replicate"]
        return canonical_json(fields)

    @classmethod
    def from_json(cls, text: str) -> Point:
        return cls(**json.loads(text))


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
