"""All-reduce microbenchmark in the style of nccl-tests' all_reduce_perf: float32 sums of growing sizes.

Params: backend (gloo or nccl: torch.distributed with each of `strategies`, see strategies.py; mpi: MPI_Allreduce
through mpi4py, or torch's own MPI backend where torch was built with it), strategies (or one `strategy`), min_bytes,
max_bytes (doubling sizes), warmup (untimed operations per size), repetitions (timed repetitions per size), and the
number of operations per repetition: as many as fit in `target_bytes` (at least 1, at most `max_ops`), so small
sizes are timed over many operations and large ones stay quick. Every rank records `allreduce_time_s` (seconds per
operation) per size, repetition and strategy (the record's `setting`), after a barrier; algorithm and bus bandwidth
are computed from it by the figure (algbw = bytes / time, busbw = algbw × 2(n−1)/n, as nccl-tests define them).

Several strategies run in one process, taking turns repetition by repetition at each size (the order rotated by one
every repetition), as the throughput workload's `settings` do: the machine's drift and noise hit them alike, so a
strategy's ratio to RING is paired, and the run pays one process start instead of one per strategy. Every result is
checked against the expected sum, so a strategy that computed the wrong thing fails the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddlrepro.rank.runtime import RankContext
from ddlrepro.rank.strategies import reducer
from ddlrepro.records import emit

FLOAT_BYTES = 4


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """min, 2·min, 4·min, … up to max (bytes, multiples of a float32)."""
    result, size = [], max(FLOAT_BYTES, min_bytes)
    while size <= max_bytes:
        result.append(size - size % FLOAT_BYTES)
        size *= 2
    return result


def torch_allreduce(strategy: str, ctx: RankContext) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable]:
    """One sum over the ranks with `strategy` on torch.distributed's backend, and a barrier."""
    reduce = reducer(strategy, ctx.local_world_size)

    def run(tensor: torch.Tensor) -> torch.Tensor:
        result = reduce(tensor)
        ctx.synchronize()
        return result

    return run, dist.barrier


def mpi4py_allreduce() -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable]:
    """MPI_Allreduce (in place) on the tensor's memory through mpi4py, and MPI_Barrier."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def run(tensor: torch.Tensor) -> torch.Tensor:
        comm.Allreduce(MPI.IN_PLACE, tensor.numpy(), op=MPI.SUM)
        return tensor

    return run, comm.Barrier


def operations(
    params: dict[str, Any], ctx: RankContext
) -> dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable]]:
    """Each strategy's sum over the ranks and a barrier, by strategy name, in the order to run them."""
    if params["backend"] == "mpi" and ctx.backend != "mpi":
        return {params["strategy"]: mpi4py_allreduce()}
    return {strategy: torch_allreduce(strategy, ctx) for strategy in strategies(params)}


def strategies(params: dict[str, Any]) -> list[str]:
    """The point's `strategies` (gloo, nccl) or its one `strategy` (MPI: kungfu_allreduce.MPI_STRATEGY)."""
    return params.get("strategies") or [params["strategy"]]


def check_sum(result: torch.Tensor, ctx: RankContext, strategy: str, size: int) -> None:
    """Every element must be 1 + 2 + … + n (exact in float32 for any order at these magnitudes)."""
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    if not torch.all(result == expected):
        raise RuntimeError(f"{strategy} all-reduce of {size} bytes gave {result.unique()[:4].tolist()}, not {expected}")


def libraries(params: dict[str, Any]) -> tuple[str, ...]:
    """What the rank loads besides torch, imported before `run` while the collector waits (ddlrepro.startup)."""
    return ()


def run(params: dict[str, Any], ctx: RankContext) -> None:
    by_strategy = operations(params, ctx)
    names = list(by_strategy)
    for size in sizes(params["min_bytes"], params["max_bytes"]):
        elements = size // FLOAT_BYTES
        ops = max(1, min(params["max_ops"], params["target_bytes"] // size))
        tensor = torch.zeros(elements, device=ctx.device)
        for strategy, (allreduce, _) in by_strategy.items():
            check_sum(allreduce(torch.full((elements,), float(ctx.rank + 1), device=ctx.device)), ctx, strategy, size)
            for _ in range(params["warmup"]):
                allreduce(tensor)
        for repetition in range(params["repetitions"]):
            shift = repetition % len(names)
            for strategy in names[shift:] + names[:shift]:
                allreduce, barrier = by_strategy[strategy]
                barrier()
                started = time.perf_counter()
                for _ in range(ops):
                    allreduce(tensor)
                seconds = (time.perf_counter() - started) / ops
                emit(
                    "metric",
                    rank=ctx.rank,
                    iteration=repetition,
                    metric="allreduce_time_s",
                    value=seconds,
                    size_bytes=size,
                    setting=strategy,
                )
    if ctx.rank == 0:
        emit("result", rank=0, backend=params["backend"], strategies=names, world_size=ctx.world_size)
