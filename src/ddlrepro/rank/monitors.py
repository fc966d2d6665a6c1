"""Online training monitors (KungFu Fig 8), computed inside DDP's gradient all-reduce so they cost little.

- Gradient noise scale (McCandlish et al. 2018): |G_small|² of this worker's gradient before the all-reduce that
  DDP does anyway, |G_big|² of the averaged gradient after it. The workers' |G_small|² are averaged by riding as
  one extra element on the step's last gradient all-reduce: no exchange of its own. Unbiased estimates of |G|²
  and of S = tr(Σ) from the two batch sizes, each smoothed by an EMA; reported value S_ema / G_ema.
- Gradient variance: one extra all-reduce, of the squared local gradients, on monitored steps only, started
  beside the gradient's own all-reduce. Per tensor var = E[g²] − E[g]²; reported value: the sum over tensors of
  the Frobenius norms of var.

Both run on every `interval`-th step and leave the gradients (hence training) exactly as plain DDP would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MONITORS = ("none", "noise-scale", "variance")


@dataclass
class Ema:
    """v ← α·v + (1−α)·x, the first sample initialising v."""

    alpha: float
    value: float | None = None

    def update(self, sample: float) -> float:
        self.value = sample if self.value is None else self.alpha * self.value + (1 - self.alpha) * sample
        return self.value


@dataclass
class NoiseScaleEstimator:
    """McCandlish's estimator from |G|² at two batch sizes, with EMAs of both estimates."""

    batch_small: int
    batch_big: int
    alpha: float = 0.6
    gradient_ema: Ema = field(init=False)
    trace_ema: Ema = field(init=False)

    def __post_init__(self) -> None:
        if self.batch_big <= self.batch_small:
            raise ValueError("the noise scale needs at least 2 workers (B_big > B_small)")
        self.gradient_ema = Ema(self.alpha)
        self.trace_ema = Ema(self.alpha)

    def estimates(self, small_sq: float, big_sq: float) -> tuple[float, float]:
        """Unbiased (|G|², S) for one step."""
        b_small, b_big = self.batch_small, self.batch_big
        gradient_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
        return gradient_sq, trace

    def update(self, small_sq: float, big_sq: float) -> float:
        gradient_sq, trace = self.estimates(small_sq, big_sq)
        return self.trace_ema.update(trace) / self.gradient_ema.update(gradient_sq)


class GradientMonitor:
    """A DDP communication hook that all-reduces the gradient (as DDP's default hook) and, on monitored steps,
    measures the noise scale or the gradient variance on the way. Call `end_step()` after each backward."""

    def __init__(self, kind: str, interval: int, batch_size: int, world_size: int, alpha: float = 0.6) -> None:
        if kind not in MONITORS:
            raise ValueError(f"unknown monitor {kind!r}; valid monitors: {', '.join(MONITORS)}")
        if interval < 1:
            raise ValueError(f"monitor interval must be >= 1, got {interval}")
        self.kind = kind
        self.interval = interval
        self.world_size = world_size
        self.step = 0
        self.noise_scale = (
            NoiseScaleEstimator(batch_size, batch_size * world_size, alpha) if kind == "noise-scale" else None
        )
        self._small_sq: list[torch.Tensor] = []
        self._small_sq_mean = torch.zeros(())
        # Keyed by bucket index: reduction callbacks may finish in a different order on each rank, and the sums
        # must be taken in one order for every rank to report the same float.
        self._big_sq: dict[int, torch.Tensor] = {}
        self._variance_norms: dict[int, torch.Tensor] = {}

    def set_batch_size(self, batch_size: int) -> None:
        """The per-worker batch changed in place (adaptive batch size): the noise scale's batch sizes follow; its
        EMAs of |G|² and S carry on (both estimate quantities that do not depend on the batch)."""
        if self.noise_scale is not None:
            self.noise_scale.batch_small = batch_size
            self.noise_scale.batch_big = batch_size * self.world_size

    @property
    def active(self) -> bool:
        """Whether the current step is a monitored one."""
        return self.kind != "none" and self.step % self.interval == 0

    def attach(self, model: DistributedDataParallel) -> None:
        model.register_comm_hook(self, GradientMonitor._hook)

    def _hook(self, bucket):  # unannotated: DDP rejects string annotations on hooks
        """Runs once per gradient bucket; returns the future of the averaged bucket, as DDP expects."""
        gradient = bucket.buffer()
        active = self.active
        carries_small_sq = active and self.kind == "noise-scale" and bucket.is_last()
        if active and self.kind == "noise-scale":
            self._small_sq.append(torch.dot(gradient, gradient))
        if carries_small_sq:
            gradient = torch.cat([gradient, torch.stack(self._small_sq).sum().reshape(1).to(gradient.dtype)])
        squares = gradient.square() if active and self.kind == "variance" else None
        # DDP's own path multiplies by the reciprocal (Reducer: grad * (1 / world_size)); x / 3 and x * (1 / 3)
        # differ in the last bit, so dividing here would change training at 3 workers.
        gradient.mul_(1.0 / self.world_size)
        reduced = dist.all_reduce(gradient, async_op=True).get_future()
        if squares is None:
            return (
                reduced.then(lambda done: self._after_reduce(done, bucket.index(), carries_small_sq))
                if active
                else reduced.then(_first_tensor)
            )
        squares_reduced = dist.all_reduce(squares, async_op=True).get_future()
        sizes = [parameter.numel() for parameter in bucket.parameters()]
        both = torch.futures.collect_all([reduced, squares_reduced])
        return both.then(lambda done: self._variance(done, bucket.index(), sizes))

    def _after_reduce(self, reduced: torch.futures.Future, index: int, carries_small_sq: bool) -> torch.Tensor:
        mean = reduced.value()[0]
        if carries_small_sq:
            self._small_sq_mean, mean = mean[-1], mean[:-1]
        self._big_sq[index] = torch.dot(mean, mean)
        return mean

    def _variance(self, done: torch.futures.Future, index: int, sizes: list[int]) -> torch.Tensor:
        mean_future, squares_future = done.value()
        mean = mean_future.value()[0]
        variance = squares_future.value()[0].div_(self.world_size).sub_(mean.square())
        self._variance_norms[index] = torch.stack([part.norm() for part in variance.split(sizes)]).sum()
        return mean

    def end_step(self) -> tuple[str, float] | None:
        """Finish the step's measurement: (metric name, value) on monitored steps, else None."""
        measured = None
        if self.active and self.kind == "noise-scale":
            big_sq = _sum_by_index(self._big_sq)
            measured = ("noise_scale", self.noise_scale.update(float(self._small_sq_mean), float(big_sq)))
        elif self.active and self.kind == "variance":
            measured = ("gradient_variance", float(_sum_by_index(self._variance_norms)))
        self._small_sq.clear()
        self._big_sq.clear()
        self._variance_norms.clear()
        self.step += 1
        return measured


def _first_tensor(reduced: torch.futures.Future) -> torch.Tensor:
    return reduced.value()[0]


def _sum_by_index(parts: dict[int, torch.Tensor]) -> torch.Tensor:
    """Sum per-bucket values in bucket order, the same on every rank."""
    return torch.stack([parts[index] for index in sorted(parts)]).sum()
