"""KungFu's adaptive batch size (OSDI 2020 Fig 4, as the artifact fork implements it).

Fed the gradient noise scale B_simple = S/|G|² every monitored step (the noise-scale monitor's value; S there is
the trace of the per-sample gradient covariance): ratio = |B_simple| / B (B the per-worker batch), smoothed by an
EMA (weight 0.9) whose samples are first clipped to [ema/2, 2·ema]. At the end of every cycle of `cycle_epochs`
epochs B ← min(cap, ⌊B · clamp(last/first, 1, 2)⌋), first being the EMA after the cycle's first step (measured at
the cycle's batch) and last the EMA at its end: the batch grows as fast as the noise scale per sample grows, at most
doubling per cycle, and never shrinks. With `multiple` = k (the monitor's micro-batches) the new batch is rounded
down to a multiple of k, so every batch splits into k micro-batches (it never shrinks: the old batch is one). Pure
Python: every rank that is fed the same values (the monitor's value comes out of an all-reduce) decides the same B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddlrepro.rank.ema import Ema

LEARNING_RATE_RULES = ("fixed", "linear")


@dataclass
class AdaptiveBatchPolicy:
    """Decides the per-worker batch at each cycle's end from the noise scales it was fed during the cycle."""

    batch_size: int
    cap: int
    cycle_epochs: int = 10
    ema_weight: float = 0.9
    multiple: int = 1
    ema: Ema = field(init=False)
    cycle_start: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= self.cap:
            raise ValueError(f"the starting batch {self.batch_size} must be between 1 and the cap {self.cap}")
        if self.cycle_epochs < 1:
            raise ValueError(f"a cycle must last at least 1 epoch, got {self.cycle_epochs}")
        if not 0 < self.ema_weight < 1:
            raise ValueError(f"the EMA weight must lie strictly between 0 and 1, got {self.ema_weight}")
        if self.multiple < 1 or self.batch_size % self.multiple:
            raise ValueError(f"the starting batch {self.batch_size} is not a multiple of {self.multiple}")
        self.ema = Ema(self.ema_weight, clip=2.0)

    def observe(self, noise_scale: float) -> None:
        """One monitored step's noise scale B_simple, measured at the current batch."""
        self.ema.update(abs(noise_scale) / self.batch_size)
        if self.cycle_start is None:
            self.cycle_start = self.ema.value

    def end_epoch(self, epoch: int) -> int:
        """Called after epoch `epoch` (1-based) ends: the batch for the next epoch."""
        if epoch % self.cycle_epochs or self.ema.value is None or self.cycle_start is None:
            return self.batch_size
        growth = min(max(self.ema.value / self.cycle_start, 1.0), 2.0) if self.cycle_start > 0 else 1.0
        grown = min(self.cap, math.floor(self.batch_size * growth))
        self.batch_size = grown - grown % self.multiple
        self.cycle_start = None  # the next cycle starts from its own first step, at the new batch
        return self.batch_size


def learning_rate(rule: str, base_rate: float, base_batch: int, batch_size: int) -> float:
    """`fixed`: the base rate whatever the batch (as the fork); `linear`: scaled with the batch (Goyal et al.)."""
    if rule == "fixed":
        return base_rate
    if rule == "linear":
        return base_rate * batch_size / base_batch
    raise ValueError(f"unknown learning-rate rule {rule!r}; valid rules: {', '.join(LEARNING_RATE_RULES)}")
