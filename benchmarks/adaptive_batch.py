"""Adaptive batch (KungFu Fig 4): what an in-place batch change costs, 2 gloo workers on the digits.

Two processes train the Fig 4 workload's trainer (DDP, noise-scale monitor, the policy's in-place change) at a
growing per-worker batch: `--warmup` steps at the first batch, then for each further batch of `--batches` the change
and `--steady` steps. A change's cost is the first step at the new batch less the median of the steady steps after
it, in steady steps (a new batch shape may cost the kernels a first-time set-up); the figure is the median over the
changes (one step each: a single step is at the mercy of foreign load), the largest recorded beside it. Restarts:
each rank hands the parent its process id and start time before the first change and after the last, and the
parent compares them (and the ids with the processes it started). Target (targets.yaml, `adaptive_policies`): a batch
change costs ≤ 1 step and no restart.

    python benchmarks/adaptive_policies.py --parts batch [--batches 8 12 16 ... 64] [--steady 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.multiprocessing as mp
from _common import BenchmarkRecord

from ddlrepro.host.config import schema_default
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.launchers.local import free_loopback_port

WORLD = 2
PARAMS = {"dataset": "digits", "model": "digitsnet", "adaptive": True, "seed": 0, "test_fraction": 0.25}
PARAMS |= {"learning_rate": 0.05, "momentum": 0.9, "lr_rule": "fixed", "cycle_epochs": 1}
PARAMS |= {"ema_weight": 0.9, "noise_scale_alpha": 0.9, "micro_batches": 4, "monitor_interval": 1}  # the artifact
# kungfu-fig4's schema defaults (the rank side has none of its own)
PARAMS |= {
    key: schema_default("figures", "kungfu-fig4", key)
    for key in ("lr_reference_batch", "batch_rule", "weight_decay", "noise_scale_aggregation")
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, nargs="+", default=list(range(8, 68, 4)), help="per worker")
    parser.add_argument("--warmup", type=int, default=10, help="steps at the first batch before any change")
    parser.add_argument("--steady", type=int, default=8, help="steps at each batch after its change")


def timed_steps(trainer, epoch: int, count: int) -> list[float]:
    """Seconds of each of `count` steps at the trainer's batch (epochs restart when one runs out)."""
    times: list[float] = []
    while len(times) < count:
        for images, labels in trainer.epoch_batches(epoch):
            started = time.perf_counter()
            trainer.step(images, labels)
            times.append(time.perf_counter() - started)
            if len(times) == count:
                break
        epoch += 1
    return times


def process_identity() -> tuple[int, float]:
    """This process's id and start time: a restarted rank differs in one or both."""
    import psutil

    return os.getpid(), psutil.Process().create_time()


def worker(rank: int, port: int, args: argparse.Namespace, out: dict) -> None:
    import torch.distributed as dist

    from ddlrepro.rank.runtime import RankContext
    from ddlrepro.rank.workloads.adaptive_batch import AdaptiveBatchTrainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    ctx = RankContext(rank, WORLD, rank, WORLD, 1, "gloo", torch.device("cpu"))
    trainer = AdaptiveBatchTrainer({**PARAMS, "batch_size": args.batches[0], "cap": max(args.batches)}, ctx)
    timed_steps(trainer, 0, args.warmup)
    out[f"before{rank}"] = process_identity()  # in the parent's hands before any change
    changes = []
    for index, batch in enumerate(args.batches[1:], start=1):
        trainer.set_batch_size(batch)
        first, *steady = timed_steps(trainer, index * 100, 1 + args.steady)
        changes.append({"batch": batch, "first": first, "steady": statistics.median(steady)})
    out[f"after{rank}"] = process_identity()
    if rank == 0:
        out["changes"] = changes
    dist.destroy_process_group()


def measure(record: BenchmarkRecord, args: argparse.Namespace) -> None:
    with ForeignLoadMeter() as meter, mp.Manager() as manager:
        out = manager.dict()
        parent_children = mp.spawn(worker, args=(free_loopback_port(), args, out), nprocs=WORLD, join=False)
        pids = sorted(process.pid for process in parent_children.processes)
        parent_children.join()
        changes = out["changes"]
        identities = [(out[f"before{rank}"], out[f"after{rank}"]) for rank in range(WORLD)]
    costs = [(change["first"] - change["steady"]) / change["steady"] for change in changes]
    for change in changes:
        first, steady = change["first"] * 1e3, change["steady"] * 1e3
        print(f"batch → {change['batch']}: first step {first:.1f} ms, steady {steady:.1f} ms")
    restarts = sum(before != after for before, after in identities)
    restarts += len(
        {after[0] for _, after in identities} - set(pids)
    )  # a rank answering from a process not started here
    load = meter.load
    record.add(
        "batch-change-cost-steps", "median extra time of a batch change", statistics.median(costs), "steps", load
    )
    record.add("batch-change-cost-steps-max", "largest extra time of a batch change", max(costs), "steps", load)
    record.add("batch-change-restarts", "processes restarted by the batch changes", restarts, "", load)
