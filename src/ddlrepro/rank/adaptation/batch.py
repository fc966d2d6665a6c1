"""KungFu's adaptive batch size (OSDI 2020 Fig 4), as the artifact fork implements it (luomai/models@osdi20,
kungfu_experiment/kungfu_policy.py, KungfuChangeBatchSizeHook).

Fed the gradient noise scale B_simple = S/|G|² every monitored step (the noise-scale monitor's value; S there is
the trace of the per-sample gradient covariance): ratio = |B_simple| / B (B the per-worker batch), smoothed by an
EMA (weight 0.9, :76) whose samples are first clipped to [ema/2, 2·ema] (:42-49) and which runs on through batch
changes. At the end of every cycle of `cycle_epochs` epochs the EMA is appended to a history (:116); from the
second entry on B ← min(cap, ⌊B · clamp(history[-1] / history[0], 1, 2)⌋) (:122-130): the reference is the EMA at
the end of the run's first cycle, fixed for the run, so the batch first changes after the second cycle. Rule
`per-cycle` (this project's earlier variant, kept labelled) divides instead by the EMA after the cycle's own first
step. With `multiple` = k (the monitor's micro-batches) the new batch is rounded down to a multiple of k, so every
batch splits into k micro-batches (the fork has k = 1). Pure Python: every rank that is fed the same values (the
monitor's value comes out of an all-reduce) decides the same B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddlrepro.rank.ema import Ema

LEARNING_RATE_RULES = ("fixed", "linear")
BATCH_RULES = ("fork", "per-cycle")


@dataclass
class AdaptiveBatchPolicy:
    """Decides the per-worker batch at each cycle's end from the noise scales it was fed during the cycle."""

    batch_size: int
    cap: int
    cycle_epochs: int = 10
    ema_weight: float = 0.9
    multiple: int = 1
    rule: str = "fork"
    ema: Ema = field(init=False)
    cycle_start: float | None = field(init=False, default=None)
    history: list[float] = field(init=False, default_factory=list)
    """The EMA at the end of every cycle so far (the fork's `_history_ratio_ema`)."""

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= self.cap:
            raise ValueError(f"the starting batch {self.batch_size} must be between 1 and the cap {self.cap}")
        if self.cycle_epochs < 1:
            raise ValueError(f"a cycle must last at least 1 epoch, got {self.cycle_epochs}")
        if not 0 < self.ema_weight < 1:
            raise ValueError(f"the EMA weight must lie strictly between 0 and 1, got {self.ema_weight}")
        if self.multiple < 1 or self.batch_size % self.multiple:
            raise ValueError(f"the starting batch {self.batch_size} is not a multiple of {self.multiple}")
        if self.rule not in BATCH_RULES:
            raise ValueError(f"unknown batch rule {self.rule!r}; valid rules: {', '.join(BATCH_RULES)}")
        self.ema = Ema(self.ema_weight, clip=2.0)

    def observe(self, noise_scale: float) -> None:
        """One monitored step's noise scale B_simple, measured at the current batch."""
        self.ema.update(abs(noise_scale) / self.batch_size)
        if self.cycle_start is None:
            self.cycle_start = self.ema.value

    def end_epoch(self, epoch: int) -> int:
        """Called after epoch `epoch` (1-based) ends: the batch for the next epoch."""
        if epoch % self.cycle_epochs or self.ema.value is None:
            return self.batch_size
        self.history.append(self.ema.value)
        reference = self.history[0] if self.rule == "fork" else self.cycle_start
        self.cycle_start = None  # per-cycle: the next cycle starts from its own first step, at the new batch
        if (self.rule == "fork" and len(self.history) < 2) or not reference or reference <= 0:
            return self.batch_size
        growth = min(max(self.ema.value / reference, 1.0), 2.0)
        grown = min(self.cap, math.floor(self.batch_size * growth))
        self.batch_size = grown - grown % self.multiple
        return self.batch_size


def starting_rate(learning_rate: float, reference_batch: int | None, start_batch: int) -> float:
    """A run's first learning rate: `learning_rate`, or with a reference batch the fork's base_lr × B ÷ batch_denom
    from the run's starting batch (luomai/models@osdi20 official/resnet/resnet_run_loop.py:256)."""
    return learning_rate if reference_batch is None else learning_rate * start_batch / reference_batch


def learning_rate(rule: str, base_rate: float, base_batch: int, batch_size: int) -> float:
    """`fixed`: the base rate whatever the batch (as the fork); `linear`: scaled with the batch (Goyal et al.)."""
    if rule == "fixed":
        return base_rate
    if rule == "linear":
        return base_rate * batch_size / base_batch
    raise ValueError(f"unknown learning-rate rule {rule!r}; valid rules: {', '.join(LEARNING_RATE_RULES)}")
