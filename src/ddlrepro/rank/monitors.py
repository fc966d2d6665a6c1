"""Online training monitors (KungFu Fig 8), measured beside DDP's own gradient all-reduce so they cost little.

- Gradient noise scale (McCandlish et al. 2018, appendix A): |G_small|² at B_small and |G_big|² at B_big give
  unbiased estimates of |G|² and S = tr(Σ); each is smoothed by its own EMA and the value reported is
  B_simple = S_ema / |G|²_ema. |G_big|² is the norm of the all-reduced gradient (B_big = B·workers). |G_small|² is
  the workers' mean of either their local gradient's norm (B_small = B) or, with k micro-batches, of the mean over
  each worker's k micro-batch gradients (B_small = B/k; micro_batch_norms.py; models without BatchNorm in training
  mode): k·workers small-batch samples a step instead of `workers`. Both norms are summed bucket by bucket in a
  communication hook, the local one before the bucket's all-reduce and the all-reduced one as it completes, while
  the bucket is in cache: read from the gradients after the backward pass instead, out of cache, they cost 2.2 % of
  a MobileNetV2 step here, in the hook 1.5 % (benchmarks/adaptive_noise.py). One scalar all-reduce a monitored
  step, started at the end of the backward pass behind the last bucket. How the workers' |G_small|² combine
  (`aggregation`):
  - pooled (this project's default): their mean, then one estimator; every rank reports the same value. Pooling
    the norms before the ratio averages the noise of single-worker estimates (large at 2 workers) instead of
    averaging ratios of noisy numbers, which is biased.
  - per-worker (the KungFu library: lsds/KungFu@osdi20-artifact srcs/python/kungfu/tensorflow/ops/monitor.py:4-16,
    each worker its own estimator from its own gradient): every rank reports its own value.
  - mean-of-workers (KungFu's Fig 4 fork: luomai/models@osdi20 kungfu_experiment/gns.py:32-39, the per-worker
    values averaged by an all-reduce): every rank reports the same value.
  The last two gather every worker's |G_small|² (a scalar all-gather) and run one estimator per worker on every
  rank, so each rank can compute every worker's value, in rank order.
- Gradient variance: one extra all-reduce, of the squared local gradients, on monitored steps only, started
  beside the gradient's own all-reduce in the same communication hook. Per tensor var = E[g²] − E[g]²; reported value:
  the sum over tensors of the Frobenius norms of var.

Both run on every `interval`-th step and leave the gradients (hence training) exactly as plain DDP would. The hook
averages the gradients as DDP's own all-reduce does, so a monitored model takes no other hook (e.g. a KungFu
strategy's: strategies.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_leaves

from ddlrepro.rank.ema import Ema
from ddlrepro.rank.micro_batch_norms import MicroBatchNorms

MONITORS = ("none", "noise-scale", "variance")
AGGREGATIONS = ("pooled", "per-worker", "mean-of-workers")


@dataclass
class NoiseScaleEstimator:
    """McCandlish's estimator from |G|² at two batch sizes, with EMAs of both estimates."""

    batch_small: int
    batch_big: int
    alpha: float  # the EMAs' weight: the point's noise_scale_alpha (the schema's default is KungFu's)
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
    """Measures the noise scale or the gradient variance of a DDP model on every `interval`-th step. Call
    `end_step()` after each backward, before the gradients are cleared; with `micro_batches` = k > 1 the loss
    must be the batch's mean and the batch split into k equal micro-batches."""

    def __init__(
        self,
        kind: str,
        interval: int,
        batch_size: int,
        world_size: int,
        alpha: float,
        micro_batches: int = 1,
        aggregation: str = "pooled",
    ) -> None:
        if kind not in MONITORS:
            raise ValueError(f"unknown monitor {kind!r}; valid monitors: {', '.join(MONITORS)}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; valid: {', '.join(AGGREGATIONS)}")
        if interval < 1:
            raise ValueError(f"monitor interval must be >= 1, got {interval}")
        if micro_batches < 1 or batch_size % micro_batches:
            raise ValueError(f"micro_batches must be >= 1 and divide the batch of {batch_size}, got {micro_batches}")
        self.kind = kind
        self.interval = interval
        self.world_size = world_size
        self.micro_batches = micro_batches
        self.step = 0
        self.aggregation = aggregation
        estimators = 1 if aggregation == "pooled" else world_size
        self.estimators = [
            NoiseScaleEstimator(batch_size // micro_batches, batch_size * world_size, alpha)
            for _ in range(estimators if kind == "noise-scale" else 0)
        ]
        self.measurements: dict[str, float] = {}
        """Every value of the last monitored step: the reported one and what it was computed from."""
        self._micro_batches: MicroBatchNorms | None = None
        self._small_sq = torch.zeros(1, dtype=torch.float64)
        self._small_sq_reduced: dist.Work | None = None
        self._small_sq_gathered: list[torch.Tensor] = []
        # Keyed by bucket index: reduction callbacks may finish in a different order on each rank, and the sums
        # must be taken in one order for every rank to report the same float.
        self._variance_norms: dict[int, torch.Tensor] = {}
        self._local_squares: dict[int, torch.Tensor] = {}
        self._reduced_squares: dict[int, torch.Tensor] = {}

    def set_batch_size(self, batch_size: int) -> None:
        """The per-worker batch changed in place (adaptive batch size): the noise scale's batch sizes follow; its
        EMAs of |G|² and S carry on (both estimate quantities that do not depend on the batch)."""
        if batch_size % self.micro_batches:
            raise ValueError(f"a batch of {batch_size} does not split into {self.micro_batches} micro-batches")
        for estimator in self.estimators:
            estimator.batch_small = batch_size // self.micro_batches
            estimator.batch_big = batch_size * self.world_size

    @property
    def noise_scale(self) -> NoiseScaleEstimator | None:
        """The pooled estimator, or this rank's own (per-worker, mean-of-workers); None without the noise scale."""
        return self.estimators[self._own_index()] if self.estimators else None

    def _own_index(self) -> int:
        return 0 if self.aggregation == "pooled" else dist.get_rank()

    @property
    def active(self) -> bool:
        """Whether the current step is a monitored one."""
        return self.kind != "none" and self.step % self.interval == 0

    def attach(self, model: DistributedDataParallel) -> None:
        if self.kind == "none":
            return
        try:
            model.register_comm_hook(self, GradientMonitor._hook)
        except RuntimeError as error:
            raise ValueError(f"the {self.kind} monitor averages the gradients in its own hook: {error}") from error
        if self.kind == "noise-scale":
            if self.micro_batches > 1:
                self._micro_batches = MicroBatchNorms(model.module, self.micro_batches, lambda: self.active)
                self._micro_batches.attach()
            model.register_forward_hook(self._forward)

    def _forward(self, model: nn.Module, inputs: tuple, output: Any) -> None:
        """On monitored steps, have the coming backward pass measure the local |G_small|² at its end."""
        if self.active and torch.is_grad_enabled():
            leaf = next(leaf for leaf in tree_leaves(output) if isinstance(leaf, torch.Tensor) and leaf.requires_grad)
            leaf.register_hook(self._queue_local_norm)

    def _queue_local_norm(self, gradient: torch.Tensor) -> None:
        # Queued as the backward starts, so it runs before DDP's own end-of-backward callback, which DDP queues
        # once the last bucket is ready and which copies the all-reduced buckets into the gradients.
        Variable._execution_engine.queue_callback(self._read_local_norm)

    def _read_local_norm(self) -> None:
        """Start averaging this worker's |G_small|² over the workers; it queues behind the last gradient bucket
        and is done by the time `end_step` waits for it, so no rank blocks on a round trip of its own."""
        if self._micro_batches is not None:
            local_sq = self._micro_batches.take_small_squared()
        else:
            local_sq = _sum_by_index(self._local_squares)
        self._small_sq = local_sq.detach().double().reshape(1)
        if self.aggregation == "pooled":
            self._small_sq_reduced = dist.all_reduce(self._small_sq, async_op=True)
        else:
            self._small_sq_gathered = [torch.empty_like(self._small_sq) for _ in range(self.world_size)]
            self._small_sq_reduced = dist.all_gather(self._small_sq_gathered, self._small_sq, async_op=True)

    def _hook(self, bucket):  # unannotated: DDP rejects string annotations on hooks
        """Runs once per gradient bucket; returns the future of the averaged bucket, as DDP expects."""
        gradient = bucket.buffer()
        index = bucket.index()
        measures = self.active
        if measures and self.kind == "noise-scale" and self._micro_batches is None:
            self._local_squares[index] = _squared_sum(gradient)
        squares = gradient.square() if measures and self.kind == "variance" else None
        # DDP's own path multiplies by the reciprocal (Reducer: grad * (1 / world_size)); x / 3 and x * (1 / 3)
        # differ in the last bit, so dividing here would change training at 3 workers.
        gradient.mul_(1.0 / self.world_size)
        reduced = dist.all_reduce(gradient, async_op=True).get_future()
        if measures and self.kind == "noise-scale":
            return reduced.then(lambda done: self._reduced_square(done, index))
        if squares is None:
            return reduced.then(_first_tensor)
        squares_reduced = dist.all_reduce(squares, async_op=True).get_future()
        sizes = [parameter.numel() for parameter in bucket.parameters()]
        both = torch.futures.collect_all([reduced, squares_reduced])
        return both.then(lambda done: self._variance(done, index, sizes))

    def _reduced_square(self, done: torch.futures.Future, index: int) -> torch.Tensor:
        """|G_big|²'s part in one all-reduced bucket, taken as the bucket completes."""
        mean = done.value()[0]
        self._reduced_squares[index] = _squared_sum(mean)
        return mean

    def _variance(self, done: torch.futures.Future, index: int, sizes: list[int]) -> torch.Tensor:
        mean_future, squares_future = done.value()
        mean = mean_future.value()[0]
        variance = squares_future.value()[0].div_(self.world_size).sub_(mean.square())
        self._variance_norms[index] = torch.stack([part.norm() for part in variance.split(sizes)]).sum()
        return mean

    def _noise_scale(self) -> dict[str, float]:
        if self._small_sq_reduced is None:
            raise RuntimeError("no backward pass ran through the monitored model on this step")
        self._small_sq_reduced.wait()  # every rank gets the same sum (or list), hence the same values
        big_sq = float(_sum_by_index(self._reduced_squares))
        if self.aggregation == "pooled":
            smalls = [float(self._small_sq) / self.world_size]
        else:
            smalls = [float(small) for small in self._small_sq_gathered]
        values = [estimator.update(small, big_sq) for estimator, small in zip(self.estimators, smalls, strict=True)]
        own = self.estimators[self._own_index()]
        mean = sum(values) / len(values)
        return {
            "noise_scale": mean if self.aggregation == "mean-of-workers" else values[self._own_index()],
            "noise_scale_gradient_sq": own.gradient_ema.current(),
            "noise_scale_trace": own.trace_ema.current(),
        }

    def end_step(self) -> tuple[str, float] | None:
        """Finish the step's measurement: (metric name, value) on monitored steps, else None."""
        measured = None
        if self.active and self.kind == "noise-scale":
            self.measurements = self._noise_scale()
            measured = ("noise_scale", self.measurements["noise_scale"])
        elif self.active and self.kind == "variance":
            self.measurements = {"gradient_variance": float(_sum_by_index(self._variance_norms))}
            measured = ("gradient_variance", self.measurements["gradient_variance"])
        self._small_sq_reduced = None
        self._variance_norms.clear()
        self._local_squares.clear()
        self._reduced_squares.clear()
        self.step += 1
        return measured


def _squared_sum(bucket: torch.Tensor, width: int = 1024) -> torch.Tensor:
    """Σ x² over a flat gradient bucket, as float64: float32 norms of blocks of `width`, their squares summed in
    float64, and the rest's float32 dot product. One pass in C++; one float32 norm over a bucket of millions loses
    1e-4 of the value, blocks 1e-9. (get_total_norm over the bucket's tensors, grouping hundreds of views in
    Python, measured 1.8 % of a MobileNetV2 step in this hook here; a flat pass 0.1 %.)"""
    whole = bucket.numel() - bucket.numel() % width
    blocks = torch.linalg.vector_norm(bucket[:whole].view(-1, width), dim=1).double().square().sum()
    rest = bucket[whole:]
    return blocks + torch.dot(rest, rest).double()


def _first_tensor(reduced: torch.futures.Future) -> torch.Tensor:
    return reduced.value()[0]


def _sum_by_index(parts: dict[int, torch.Tensor]) -> torch.Tensor:
    """Sum per-bucket values in bucket order, the same on every rank."""
    return torch.stack([parts[index] for index in sorted(parts)]).sum()
