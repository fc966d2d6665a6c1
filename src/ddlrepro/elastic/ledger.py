"""Data continuity of an elastic run: from the `ledger` records, check that every sample in [0, samples) was
trained exactly once, across every resize and fault.

A record is either a range a rank trained (`start`, `count`) in membership `version`, or rank 0's note that
training in `version` resumed at global offset `resume`: ranges at or beyond it from earlier versions belong to a
step that was lost (in flight when a worker died) and do not count. Records are ordered by version, not by their
time stamps: a survivor may write its first range of a new version before rank 0's note. A rank writes its range
before it hands its gradients to the step's all-reduce, so a step that any survivor completed has every rank's
range, even that of a rank killed before it could finish the step itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class LedgerError(AssertionError):
    """Samples were skipped or trained twice."""


def trained_ranges(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The (start, count) ranges whose training survived, by version, each version's resume note first."""
    kept: list[tuple[int, int]] = []
    for record in sorted(records, key=lambda r: (r["version"], "resume" not in r, r["time"])):
        if "resume" in record:
            kept = [(start, count) for start, count in kept if start < record["resume"]]
        else:
            kept.append((record["start"], record["count"]))
    return kept


def verify(records: list[dict[str, Any]], samples: int) -> None:
    """Raise LedgerError unless samples 0 … samples−1 were each trained exactly once."""
    counts = Counter(index for start, count in trained_ranges(records) for index in range(start, start + count))
    repeated = sorted(index for index, times in counts.items() if times > 1)
    skipped = sorted(set(range(samples)) - set(counts))
    beyond = sorted(index for index in counts if index >= samples)
    problems = [
        f"{len(found)} samples {what} (first: {found[:5]})"
        for found, what in ((repeated, "trained twice"), (skipped, "skipped"), (beyond, "beyond the last offset"))
        if found
    ]
    if problems:
        raise LedgerError("; ".join(problems))
