"""Monitor overhead: per-worker throughput with each monitor ÷ without, smoke model, 2 gloo workers.

All settings live in the same two processes (one DDP model each, same weights) and take turns step by step,
`--steps` steps each per round for `--rounds` rounds, the order rotated round by round, so that machine noise hits
them alike. Each round's rate of a setting is divided by plain DDP's in the same round; a target is judged on the
mean of the rounds' overheads and its one-sided 95 % bootstrap bounds, as the workflow judges a timing claim, over
the `--rounds` fixed before the run. Turns of a step instead of blocks of `--steps` steps halved the spread of the
round overheads here (standard deviation about 4 % → 1.8 %, resnet20): this machine's speed drifts over seconds.
The CPU-time overheads (rank 0's process) are the median's.
Targets (targets.yaml): noise-scale@1 ≤ 2 %, variance@1 ≤ 10 %, variance@8 ≤ 2 %.

A setting may name the noise scale's micro-batches per worker: `noise-scale@1/k4` (default k = 1).

    python benchmarks/monitor_overhead.py [--model resnet20] [--batch-size 32] [--image-size N] [--rounds 20]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import REPO, BenchmarkRecord
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.host.config import load_config
from ddlrepro.host.figures.kungfu_fig8 import parse_setting
from ddlrepro.host.hostload import ForeignLoadMeter, HostLoad
from ddlrepro.host.launchers.local import free_loopback_port
from ddlrepro.rank.models import build_model
from ddlrepro.rank.monitors import GradientMonitor
from ddlrepro.rank.workloads.throughput import make_train_step, synthetic_batch

SETTINGS = ["none", "noise-scale@1", "noise-scale@8", "variance@1", "variance@8"]
WORLD = 2
ALPHA = load_config(REPO / "config" / "config.yaml")["figures"]["kungfu-fig8"]["noise_scale_alpha"]  # the figure's


def trainer(model: torch.nn.Module, setting: str, batch: tuple[torch.Tensor, torch.Tensor], size: int):
    ddp = DistributedDataParallel(copy.deepcopy(model))
    monitor = None
    figure_setting, _, micro_batches = setting.partition("/k")
    parsed = parse_setting(figure_setting)
    if parsed["monitor"] != "none":
        options = {"micro_batches": int(micro_batches)} if micro_batches else {}
        monitor = GradientMonitor(parsed["monitor"], parsed["monitor_interval"], size, WORLD, ALPHA, **options)
        monitor.attach(ddp)
    step = make_train_step(ddp, *batch)

    def monitored_step() -> None:
        step()
        if monitor:
            monitor.end_step()

    return monitored_step


def worker(rank: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = build_model(args.model)
    batch = synthetic_batch(args.model, args.batch_size, args.image_size, torch.device("cpu"), seed=rank)
    steps = {setting: trainer(model, setting, batch, args.batch_size) for setting in args.settings}
    rates: dict[str, list[float]] = {setting: [] for setting in args.settings}
    cpu_rates: dict[str, list[float]] = {setting: [] for setting in args.settings}
    for step in steps.values():
        step()
    for round_index in range(args.rounds):
        dist.barrier()
        wall, cpu = interleaved_round(steps, args.steps, round_index)
        for setting in steps:
            rates[setting].append(args.batch_size * args.steps / wall[setting])
            cpu_rates[setting].append(args.batch_size * args.steps / cpu[setting])
    if rank == 0:
        out.update(wall=rates, cpu=cpu_rates)
    dist.destroy_process_group()


def interleaved_round(
    steps: dict[str, Callable[[], None]], count: int, round_index: int
) -> tuple[dict[str, float], dict[str, float]]:
    """One round: `count` steps of every setting, the settings taking turns step by step (the order rotated round by
    round), so that drift slower than one turn (~5 steps, under a second) hits them alike; each setting's summed
    wall and CPU seconds (this process: all its threads)."""
    order = list(steps)
    shift = round_index % len(order)
    order = order[shift:] + order[:shift]
    wall = dict.fromkeys(order, 0.0)
    cpu = dict.fromkeys(order, 0.0)
    for _ in range(count):
        for setting in order:
            started, cpu_started = time.perf_counter(), time.process_time()
            steps[setting]()
            wall[setting] += time.perf_counter() - started
            cpu[setting] += time.process_time() - cpu_started
    return wall, cpu


def report(
    rates: dict[str, dict[str, list[float]]], args: argparse.Namespace, load: HostLoad, record: BenchmarkRecord
) -> None:
    """Wall-clock figures (the targets'), and the same per CPU second of rank 0's process: images per CPU
    second hardly move with other processes' load, so on a busy machine they still show the monitor's own work."""
    print(f"model {args.model}, batch {args.batch_size}, {WORLD} workers x 1 thread, gloo, {args.rounds} rounds")
    wall, cpu = rates["wall"], rates["cpu"]
    for setting in args.settings:
        record.add(
            f"{setting}-img-per-s", f"{setting}: img/s per worker", statistics.median(wall[setting]), "img/s", load
        )
        if setting != "none":
            rounds = round_overheads(wall, setting)
            what = f"{setting}: overhead vs no monitor, mean of the rounds"
            record.add(f"{setting}-overhead", what, statistics.fmean(rounds), "%", load, round_values=rounds)
            record.add(
                f"{setting}-cpu-overhead",
                f"{setting}: CPU time per image vs no monitor",
                overhead(cpu, setting),
                "%",
                load,
            )


def overhead(rates: dict[str, list[float]], setting: str) -> float:
    """1 − the median over rounds of the setting's rate ÷ plain DDP's in the same round, in %."""
    return 100 * (1 - statistics.median(round_ratios(rates, setting)))


def round_overheads(rates: dict[str, list[float]], setting: str) -> list[float]:
    """Each round's 1 − the setting's rate ÷ plain DDP's in that round, in %: the paired rounds a target is judged
    over (their mean and its 95 % bounds, as the workflow judges a timing claim)."""
    return [100 * (1 - ratio) for ratio in round_ratios(rates, setting)]


def round_ratios(rates: dict[str, list[float]], setting: str) -> list[float]:
    """Each round's rate of the setting ÷ plain DDP's in the same round."""
    return [mine / plain for mine, plain in zip(rates[setting], rates["none"], strict=True)]


def add_arguments(parser: argparse.ArgumentParser, settings: list[str] = SETTINGS) -> None:
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=None, help="default: the model's own")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--settings", nargs="+", default=settings, help="none first: the baseline")


def measure(record: BenchmarkRecord, args: argparse.Namespace) -> None:
    with ForeignLoadMeter() as meter, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(free_loopback_port(), args, out), nprocs=WORLD, join=True)
        rates = dict(out)
    report(rates, args, meter.load, record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record:
        measure(record, args)


if __name__ == "__main__":
    main()
