"""Strategy bus bandwidth ÷ gloo's own all_reduce on the same tensors, at 16–64 MiB (4 local gloo processes).

One process group; every round times raw `torch.distributed.all_reduce` and then each strategy (strategies.py)
on the same tensor, one after another, so machine noise hits all alike; the median over rounds is reported.
busbw = algbw × 2(n−1)/n (nccl-tests). Every strategy is reported against raw all_reduce. The target (targets.yaml)
holds the best *point-to-point* strategy (STAR, BINARY_TREE, BINARY_TREE_STAR, CLIQUE) to ≥ 0.9 × raw all_reduce:
RING is gloo's all_reduce itself, so it is listed as a check of the method, not as a candidate. 4 ranks, because at 2
STAR, BINARY_TREE and BINARY_TREE_STAR send the same messages.

    python benchmarks/allreduce_strategies.py [--rounds 7] [--ops 3] [--world 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import BenchmarkRecord

from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.launchers.local import free_loopback_port
from ddlrepro.rank.strategies import STRATEGIES, Reducer, reducer

SIZES_MIB = [16, 32, 64]
SAME_AS_RAW = "RING"


def raw_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor)
    return tensor


def seconds_per_op(reduce: Reducer, tensor: torch.Tensor, ops: int) -> float:
    dist.barrier()
    started = time.perf_counter()
    for _ in range(ops):
        reduce(tensor)
    return (time.perf_counter() - started) / ops


def measure(rank: int, world: int, port: int, rounds: int, ops: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    candidates = {"raw all_reduce": raw_all_reduce} | {s: reducer(s, world) for s in STRATEGIES}
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
    parser.add_argument("--world", type=int, default=4, help="gloo processes (at 2, STAR and the trees coincide)")
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record:
        with ForeignLoadMeter() as meter, mp.Manager() as manager:
            out = manager.dict()
            port = free_loopback_port()
            mp.spawn(measure, args=(args.world, port, args.rounds, args.ops, out), nprocs=args.world, join=True)
            medians = dict(out)
        print(f"{args.world} gloo processes, median of {args.rounds} interleaved rounds of {args.ops} all-reduces")
        mean_ratio = report_sizes(medians, args.world)
        for name, ratio in mean_ratio.items():
            record.add(
                f"{name.lower()}-busbw-ratio", f"{name}: 16–64 MiB mean busbw ÷ raw all_reduce's", ratio, "", meter.load
            )
        best_p2p = max((name for name in mean_ratio if name != SAME_AS_RAW), key=mean_ratio.get)
        what = f"best point-to-point strategy ({best_p2p}): busbw ÷ raw all_reduce's"
        record.add("best-p2p-busbw-ratio", what, mean_ratio[best_p2p], "", meter.load, strategy=best_p2p)


def report_sizes(medians: dict[tuple[str, int], float], world: int) -> dict[str, float]:
    """Print every strategy's time and busbw per size; return each one's mean over sizes of raw ÷ its time."""
    factor = 2 * (world - 1) / world
    ratios: dict[str, list[float]] = {}
    for size in SIZES_MIB:
        raw = medians[("raw all_reduce", size)]
        for name in ["raw all_reduce", *STRATEGIES]:
            seconds = medians[(name, size)]
            busbw = size * 2**20 / seconds / 1e9 * factor
            ratios.setdefault(name, []).append(raw / seconds)
            print(
                f"{size:3d} MiB  {name:17s} {seconds * 1e3:8.1f} ms  busbw {busbw:5.2f} GB/s  ÷ raw {raw / seconds:.3f}"
            )
    return {name: statistics.fmean(values) for name, values in ratios.items() if name != "raw all_reduce"}


if __name__ == "__main__":
    main()
