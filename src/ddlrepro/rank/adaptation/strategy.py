"""KungFu's adaptive strategy policy (OSDI 2020, Fig 5): move the star's root away from a congested host, once.

Each step every worker is fed its own all-reduce throughput (bytes ÷ seconds spent reducing, MiB/s). The value
measured at step `reference_step` is the reference; from then on a worker votes when its throughput falls below
`threshold` × reference. The votes are summed over the workers (an all-reduce: the rank code does it, so every
rank sees the same sum at the same step); a strict majority on `patience` steps in a row switches the root from
rank 0 to rank 1, once (KungFu: 1 step; 2 keeps a shared machine's one-step stall from moving the root).
Pure Python: no torch, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_ROOT = 0
SECOND_ROOT = 1


@dataclass
class StrategyPolicy:
    """One worker's side of the vote; `decide` takes the summed votes of every worker."""

    workers: int
    reference_step: int = 5
    threshold: float = 0.8
    patience: int = 1
    reference: float | None = None
    majority_streak: int = 0
    root: int = FIRST_ROOT
    switched_at: int | None = None

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ValueError(f"the strategy policy needs at least 2 workers, got {self.workers}")
        if self.reference_step < 0:
            raise ValueError(f"reference_step must be ≥ 0, got {self.reference_step}")
        if not 0 < self.threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        if self.patience < 1:
            raise ValueError(f"patience must be ≥ 1, got {self.patience}")

    def vote(self, step: int, throughput: float) -> int:
        """1 when this worker's throughput at `step` is below threshold × reference, else 0."""
        if step == self.reference_step:
            self.reference = throughput
        if self.reference is None or step <= self.reference_step or self.switched_at is not None:
            return 0
        return int(throughput < self.threshold * self.reference)

    def decide(self, step: int, votes: int) -> bool:
        """Switch the root when a strict majority of the workers voted on `patience` steps in a row, ending at `step`
        (only the first time)."""
        if self.switched_at is not None:
            return False
        self.majority_streak = self.majority_streak + 1 if 2 * votes > self.workers else 0
        if self.majority_streak < self.patience:
            return False
        self.root, self.switched_at = SECOND_ROOT, step
        return True
