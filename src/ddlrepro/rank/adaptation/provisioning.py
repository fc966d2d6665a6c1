"""KungFu's adaptive provisioning (OSDI 2020, Fig 6): grow the cluster one worker at a time while each added worker
pays for itself, then give back the last one that did not.

Every window of `window_steps` steps at one size n, T(n) = the mean per-worker throughput over the window's second
half × n. If T(n) < (1 + α/n)·T(n−1), the last worker is removed and the cluster stops growing; otherwise one is
added (up to `max_workers`, where it stops growing too). Fed the same all-reduced throughputs, every rank takes
the same decision on the same step; pure Python, so the decisions can be tested on scripted sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Protocol


@dataclass(frozen=True)
class WindowEnd:
    """A finished window: its size, its T(n), and the size the policy asks for (None: stay)."""

    size: int
    total: float
    target: int | None


MIN_WINDOW_STEPS = 4  # the and the config schema's bound: a window's second half needs at least 2 steps


class ProvisioningPolicy:
    def __init__(self, window_steps: int, alpha: float, max_workers: int) -> None:
        if window_steps < MIN_WINDOW_STEPS:
            raise ValueError(f"window_steps must be at least {MIN_WINDOW_STEPS}, got {window_steps}")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if max_workers < 2:
            raise ValueError(f"max_workers must be at least 2 (a policy needs two sizes to compare), got {max_workers}")
        self.window_steps = window_steps
        self.alpha = alpha
        self.max_workers = max_workers
        self.totals: dict[int, float] = {}
        self.growing = True
        self.window_size: int | None = None
        self.window: list[float] = []

    def observe(self, size: int, per_worker: float) -> WindowEnd | None:
        """Feed one step's mean per-worker throughput at `size` workers; a `WindowEnd` when this step ends a window."""
        if size != self.window_size:
            self.restart_window(size)
        self.window.append(per_worker)
        if len(self.window) < self.window_steps:
            return None
        total = fmean(self.window[self.window_steps // 2 :]) * size
        self.totals[size] = total
        self.window = []
        return WindowEnd(size, total, self.decide(size, total))

    def decide(self, size: int, total: float) -> int | None:
        if not self.growing:
            return None
        previous = self.totals.get(size - 1)
        if previous is not None and total < (1 + self.alpha / size) * previous:
            self.growing = False
            return size - 1
        if size < self.max_workers:
            return size + 1
        self.growing = False
        return None

    def restart_window(self, size: int | None = None) -> None:
        """Start a new window (after a resize: steps at the old size do not count towards the new one)."""
        self.window_size, self.window = size, []

    def state(self) -> list[float]:
        """What a joiner must receive to decide as the survivors do: whether still growing, and T(1..max_workers)
        (NaN where not measured)."""
        return [float(self.growing), *(self.totals.get(size, math.nan) for size in range(1, self.max_workers + 1))]

    def load(self, state: list[float]) -> None:
        self.growing = bool(state[0])
        self.totals = {size: total for size, total in enumerate(state[1:], start=1) if not math.isnan(total)}
        self.restart_window()


class ThroughputSource(Protocol):
    """What a worker feeds the policy after each step: its own samples per second at cluster size `size`."""

    def __call__(self, size: int, batch_size: int, step_time: float) -> float: ...


def measured_throughput(size: int, batch_size: int, step_time: float) -> float:
    """The step just trained: its batch over its time."""
    return batch_size / step_time


@dataclass(frozen=True)
class ScriptedThroughput:
    """A fixed per-worker throughput by cluster size (tests and benchmarks), so that the policy's decisions do not
    depend on this machine's speed; the steps are still trained and timed."""

    by_size: dict[int, float]

    def __call__(self, size: int, batch_size: int, step_time: float) -> float:
        return self.by_size[size]


def throughput_source(params: dict[str, Any]) -> ThroughputSource:
    """The measured throughput, or the point's `scripted_throughput` ({size: per-worker samples/s} for every size
    1..max_workers). Only a point built in Python carries that key (tests, benchmarks): the config schema has no
    such key, so no configured run is scripted, and a scripted run's provenance.json says it was."""
    scripted = params.get("scripted_throughput")
    if scripted is None:
        return measured_throughput
    by_size = {int(size): float(value) for size, value in scripted.items()}
    wanted = set(range(1, int(params["max_workers"]) + 1))
    if set(by_size) != wanted or not all(value > 0 for value in by_size.values()):
        raise ValueError(
            f"scripted_throughput must give a positive throughput for each size {sorted(wanted)}, got {scripted}"
        )
    return ScriptedThroughput(by_size)


def provisioning_policy(params: dict[str, Any]) -> ProvisioningPolicy | None:
    """The policy an elastic point's parameters ask for (`policy: provisioning`), or None (a fixed schedule)."""
    if params.get("policy") != "provisioning":
        return None
    return ProvisioningPolicy(int(params["window_steps"]), float(params["alpha"]), int(params["max_workers"]))
