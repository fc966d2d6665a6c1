"""Resize events as rank 0 lives them: wall-clock marks from seeing the new config to the first step after it,
and the phases between consecutive marks (they add up to the total latency)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ddlrepro.records import emit

# (phase, the mark that ends it), in order; the first mark, `seen`, starts the event.
IN_PLACE_PHASES = [
    ("detect", "config"),
    ("agree", "agreed"),
    ("spawn_join", "joiners_ready"),
    ("group_init", "group"),
    ("state_sync", "synced"),
    ("first_step", "first_step"),
]
RESTART_PHASES = [
    ("detect", "config"),
    ("checkpoint", "checkpointed"),
    ("restart", "restarted"),
    ("group_init", "group"),
    ("state_sync", "synced"),
    ("first_step", "first_step"),
]


@dataclass
class ResizeEvent:
    step: int
    from_size: int
    phases: list[tuple[str, str]]
    fault: bool = False
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks[name] = time.time() if at is None else at

    def durations(self) -> dict[str, float]:
        """Each phase's duration; a mark that is missing or earlier than the one before counts as that one."""
        durations, previous = {}, self.marks["seen"]
        for phase, mark in self.phases:
            ended = max(self.marks.get(mark, previous), previous)
            durations[phase] = ended - previous
            previous = ended
        return durations

    def emit(self, to_size: int) -> None:
        values = {
            "resize_latency_s": self.marks["first_step"] - self.marks["seen"],
            "resize_to_sync_s": self.marks["synced"] - self.marks["seen"],
            "resize_from_size": self.from_size,
            "resize_to_size": to_size,
            "resize_fault": float(self.fault),
            **{f"resize_{phase}_s": duration for phase, duration in self.durations().items()},
        }
        for metric, value in values.items():
            emit("metric", rank=0, step=self.step, metric=metric, value=float(value))
