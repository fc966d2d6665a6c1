"""Data continuity of an elastic run: from the `ledger` records, check that every sample in [0, samples) was
trained exactly once, across every resize and fault.

A record is either a range a rank trained (`start`, `count`) in membership `version`, or rank 0's note that
training in `version` resumed at global offset `resume`: ranges at or beyond it from earlier versions belong to a
step that was lost (in flight when a worker died) and do not count. Records are ordered by version, not by their
time stamps: a survivor may write its first range of a new version before rank 0's note. A rank writes its range
before it hands its gradients to the step's all-reduce, so a step that any survivor completed has every rank's
range, even that of a rank killed before it could finish the step itself.

With `record_state`, the ledger also holds every rank's state digest after each resize's sync and at the stop;
`verify` then checks that all ranks of a version hold the same bits.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any


class LedgerError(AssertionError):
    """Samples were skipped or trained twice, or the ranks of a version recorded different states."""


def trained_ranges(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The (start, count) ranges whose training survived, by version, each version's resume note first."""
    kept: list[tuple[int, int]] = []
    ranges_and_notes = [record for record in records if "digest" not in record]
    for record in sorted(ranges_and_notes, key=lambda r: (r["version"], "resume" not in r, r["time"])):
        if "resume" in record:
            kept = [(start, count) for start, count in kept if start < record["resume"]]
        else:
            kept.append((record["start"], record["count"]))
    return kept


def state_mismatches(records: list[dict[str, Any]]) -> list[str]:
    """Each (version, state) whose ranks recorded different state digests, with the ranks of each digest."""
    digests: dict[tuple[int, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if "digest" in record:
            digests[record["version"], record["state"]][record["digest"]].append(record["rank"])
    return [
        f"version {version} {state}: ranks {' vs '.join(str(sorted(ranks)) for ranks in by_digest.values())}"
        for (version, state), by_digest in sorted(digests.items())
        if len(by_digest) > 1
    ]


def verify(records: list[dict[str, Any]], samples: int) -> None:
    """Raise LedgerError unless samples 0 … samples−1 were each trained exactly once and every version's ranks
    recorded the same state."""
    counts = Counter(index for start, count in trained_ranges(records) for index in range(start, start + count))
    repeated = sorted(index for index, times in counts.items() if times > 1)
    skipped = sorted(set(range(samples)) - set(counts))
    beyond = sorted(index for index in counts if index >= samples)
    problems = [
        f"{len(found)} samples {what} (first: {found[:5]})"
        for found, what in ((repeated, "trained twice"), (skipped, "skipped"), (beyond, "beyond the last offset"))
        if found
    ]
    problems += [f"state differs between ranks in {mismatch}" for mismatch in state_mismatches(records)]
    if problems:
        raise LedgerError("; ".join(problems))
