"""Strategy bus bandwidth ÷ gloo's own all_reduce on the same tensors, at 16–64 MiB (2 local gloo processes).

One process group; every round times raw `torch.distributed.all_reduce` and then each strategy (strategies.py)
on the same tensor, one after another, so machine noise hits all alike; the median over rounds is reported.
busbw = algbw × 2(n−1)/n (nccl-tests). Target: the best strategy ≥ 0.9 × raw all_reduce; reported both for all
strategies (RING is that same all_reduce) and for the point-to-point ones alone (STAR, trees, CLIQUE).

    python benchmarks/allreduce_strategies.py [--rounds 7] [--ops 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddlrepro.launchers.local import free_loopback_port
from ddlrepro.strategies import STRATEGIES, Reducer, reducer

TARGET = 0.9
SIZES_MIB = [16, 32, 64]
WORLD = 2


def raw_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor)
    return tensor


def seconds_per_op(reduce: Reducer, tensor: torch.Tensor, ops: int) -> float:
    dist.barrier()
    started = time.perf_counter()
    for _ in range(ops):
        reduce(tensor)
    return (time.perf_counter() - started) / ops


def measure(rank: int, port: int, rounds: int, ops: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    candidates = {"raw all_reduce": raw_all_reduce} | {s: reducer(s, WORLD) for s in STRATEGIES}
    times: dict[tuple[str, int], list[float]] = {}
    for size in SIZES_MIB:
        tensor = torch.zeros(size * 2**20 // 4)
        for reduce in candidates.values():
            reduce(tensor)
        for _ in range(rounds):
            for name, reduce in candidates.items():
                times.setdefault((name, size), []).append(seconds_per_op(reduce, tensor, ops))
    if rank == 0:
        out.update({key: statistics.median(values) for key, values in times.items()})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=3)
    args = parser.parse_args()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(measure, args=(free_loopback_port(), args.rounds, args.ops, out), nprocs=WORLD, join=True)
        medians = dict(out)
    factor = 2 * (WORLD - 1) / WORLD
    ratios: dict[str, list[float]] = {}
    print(f"{WORLD} gloo processes, median of {args.rounds} interleaved rounds of {args.ops} all-reduces")
    for size in SIZES_MIB:
        raw = medians[("raw all_reduce", size)]
        for name in ["raw all_reduce", *STRATEGIES]:
            seconds = medians[(name, size)]
            busbw = size * 2**20 / seconds / 1e9 * factor
            ratios.setdefault(name, []).append(raw / seconds)
            print(
                f"{size:3d} MiB  {name:17s} {seconds * 1e3:8.1f} ms  busbw {busbw:5.2f} GB/s  ÷ raw {raw / seconds:.3f}"
            )
    mean_ratio = {name: statistics.fmean(values) for name, values in ratios.items() if name != "raw all_reduce"}
    best = max(mean_ratio, key=mean_ratio.get)
    p2p = {name: value for name, value in mean_ratio.items() if name != "RING"}
    best_p2p = max(p2p, key=p2p.get)
    print(f"best strategy (16–64 MiB mean busbw ÷ raw all_reduce): {best} {mean_ratio[best]:.3f}  (target >= {TARGET})")
    print(f"best point-to-point strategy: {best_p2p} {p2p[best_p2p]:.3f}  (target >= {TARGET})")


if __name__ == "__main__":
    main()
