"""The resize schedule rank 0 follows, KungFu's `step:size,...` (e.g. `10:2,100:0`; size 0 stops the job)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resize:
    """After `step` steps have been trained, the cluster should have `size` workers."""

    step: int
    size: int


def parse_schedule(text: str) -> list[Resize]:
    """Parse and check a schedule: steps strictly increasing, sizes >= 0, ending with size 0 (the stop)."""
    entries = []
    for item in text.split(","):
        step, colon, size = item.strip().partition(":")
        if not colon or not step.strip().isdigit() or not size.strip().isdigit():
            raise ValueError(f"schedule entry {item.strip()!r} is not `step:size` with whole numbers")
        entries.append(Resize(int(step), int(size)))
    for before, after in itertools.pairwise(entries):
        if after.step <= before.step:
            raise ValueError(f"schedule steps must increase: {after.step} comes after {before.step}")
    if entries[-1].size != 0:
        raise ValueError("a schedule must end with size 0 (the stop), e.g. `10:2,20:0`")
    if any(entry.size == 0 for entry in entries[:-1]):
        raise ValueError("size 0 stops the job: only the last schedule entry may have it")
    return entries


def largest_size(entries: list[Resize], initial: int) -> int:
    return max(initial, *(entry.size for entry in entries))


def largest_cluster(params: dict[str, Any]) -> int:
    """The largest cluster an elastic point may ask for: its schedule's, or its policy's `max_workers` if larger."""
    scheduled = largest_size(parse_schedule(params["schedule"]), params["initial_workers"])
    return max(scheduled, int(params.get("max_workers", 0)))
