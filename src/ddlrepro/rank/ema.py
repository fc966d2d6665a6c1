"""The exponential moving average the monitors and the policies smooth with. Torch-free (policies are pure Python)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Ema:
    """v ← w·v + (1−w)·x, the first sample initialising v. With `clip`, each later sample is first clipped to
    [v/clip, clip·v] (KungFu's adaptive-batch fork: clip 2)."""

    weight: float
    clip: float | None = None
    value: float | None = None

    def current(self) -> float:
        """The average so far (ValueError before the first sample)."""
        if self.value is None:
            raise ValueError("the moving average has no sample yet")
        return self.value

    def update(self, sample: float) -> float:
        if self.value is None:
            self.value = sample
            return self.value
        if self.clip is not None:
            sample = min(max(sample, self.value / self.clip), self.clip * self.value)
        self.value = self.weight * self.value + (1 - self.weight) * sample
        return self.value
