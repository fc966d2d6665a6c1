"""Plain DDP's gradient arithmetic on gloo, reproduced from every worker's local gradient (EasyScale's D1: the loss
"exactly the same as that of DDP-homo", SC'23 artifact README).

What E-worker DDP computes for each parameter's averaged gradient (torch 2.13, gloo, CPU, find_unused_parameters
off, the default bucket caps):
1. Buckets (torch/nn/parallel/distributed.py, BucketCapacityConfig.compute_bucket_size_limits and the Reducer): the
   first iteration one bucket of every parameter in model order; from the second on, buckets rebuilt in the order
   the gradients became ready in the first backward pass, the first capped at 1 MiB and the others at 25 MiB
   (reducer.cpp rebuild_buckets, `dist._compute_bucket_assignment_by_size`).
2. Each worker's gradient multiplied by 1/E into its bucket (reducer.cpp mark_variable_ready_dense).
3. Each bucket all-reduced by gloo's ring (facebookincubator/gloo gloo/allreduce.cc, ring()): the bucket cut into
   numSegments = roundUp(max(ceil(bytes / 1 MiB), 2E), E) segments of roundUp(ceil(bytes / numSegments), 4)
   bytes; rank b ends with the sum of block b (segments b·S … (b+1)·S − 1, S = numSegments / E), which travelled
   the ring from rank b−1 down to rank b, each rank adding its own onto what its neighbour sent:
   x_b + (x_{b+1} + (… + (x_{b−2} + x_{b−1}))), indices mod E; the allgather then copies it unchanged.
Float addition is commutative, so that is the fold x_{b−1}, x_{b−2}, …, x_b; `ring_sum` computes it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

MAX_SEGMENT_BYTES = 1 << 20  # gloo AllreduceOptions::kMaxSegmentSize
FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_BYTES = 25 * (1 << 20)  # DDP's default bucket_cap_mb


def ring_blocks(numel: int, world: int, element_size: int) -> list[tuple[int, int]]:
    """The element range [start, end) whose sum each rank b ends with in gloo's ring all-reduce."""
    total = numel * element_size
    segments = math.ceil(max(math.ceil(total / MAX_SEGMENT_BYTES), 2 * world) / world) * world
    segment = math.ceil(math.ceil(total / segments) / element_size) * element_size
    per_rank = segments // world * segment // element_size
    return [(min(b * per_rank, numel), min((b + 1) * per_rank, numel)) for b in range(world)]


def ring_sum(contributions: torch.Tensor) -> torch.Tensor:
    """The sum over rows (one per worker) of `contributions` [E, n], as gloo's ring adds it on every rank."""
    world, numel = contributions.shape
    total = torch.empty(numel, dtype=contributions.dtype)
    for block, (start, end) in enumerate(ring_blocks(numel, world, contributions.element_size())):
        partial = contributions[(block - 1) % world, start:end].clone()
        for hop in range(2, world + 1):
            partial = contributions[(block - hop) % world, start:end] + partial
        total[start:end] = partial
    return total


def gradient_of(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient after a backward pass (every parameter of these models takes part in the loss)."""
    if parameter.grad is None:
        raise RuntimeError(f"a parameter of shape {tuple(parameter.shape)} has no gradient after the backward pass")
    return parameter.grad


def bucket_layout(parameters: Sequence[torch.Tensor], ready_order: list[int] | None) -> list[list[int]]:
    """DDP's buckets as lists of parameter indices, each in its bucket's order: all parameters in one bucket
    before the first rebuild (`ready_order` None), else the rebuilt buckets in ready order."""
    if ready_order is None:
        return [list(range(len(parameters)))]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [parameters[index] for index in ready_order],
        [FIRST_BUCKET_BYTES, BUCKET_BYTES],
        [False] * len(parameters),
        ready_order,
    )
    return [list(bucket) for bucket in buckets]


def ddp_average(gradients: torch.Tensor, sizes: list[int], layout: list[list[int]]) -> torch.Tensor:
    """What E-worker DDP leaves as every parameter's gradient, from `gradients` [E, n]: each worker's gradient
    flattened in parameter order (`sizes`: each parameter's elements), scaled by 1/E, ring-summed per bucket."""
    world = gradients.shape[0]
    scaled = gradients * (1.0 / world)  # DDP's grad * (1 / div_factor): a float32 multiply by the rounded 1/E
    averaged = torch.empty(gradients.shape[1], dtype=gradients.dtype)
    for columns in bucket_columns(tuple(sizes), tuple(map(tuple, layout))):
        averaged[columns] = ring_sum(scaled[:, columns])
    return averaged


@functools.cache
def bucket_columns(sizes: tuple[int, ...], layout: tuple[tuple[int, ...], ...]) -> list[torch.Tensor]:
    """Each bucket's elements as positions in the parameter-order flat gradient, in the bucket's order."""
    offsets = [0, *itertools.accumulate(sizes)]
    return [torch.cat([torch.arange(offsets[index], offsets[index + 1]) for index in bucket]) for bucket in layout]
