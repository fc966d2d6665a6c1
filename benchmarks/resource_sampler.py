"""Resource sampler: its cost as a share of training time at 1 sample/s, and how well workers' samples align.

Cost: the wall time of `ResourceSampler.sample()` (every series: process CPU and memory with PSS from smaps, node
CPU and memory) in a process that has loaded torch and the GAN, median over `--repetitions` calls; at `--rate`
samples per second a worker spends rate × cost of every second sampling (the sampler's thread shares the rank's
cores), the target's share of step time. Alignment: a real 2-rank GAN run (the `gan` workload, local launcher) with
the sampler at `--rate`; per sample tick, the spread of the ranks' record times; the largest spread is the target.

    python benchmarks/resource_sampler.py [--repetitions 200] [--rate 1.0] [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import BenchmarkRecord

from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point
from ddlrepro.rank.gan_models import Discriminator, GanShape, Generator
from ddlrepro.rank.runtime import RankContext, ResourceSampler

GAN = {
    "resolution": 32,
    "channels": 8,
    "z_dim": 40,
    "attention_resolution": 16,
    "batch_size": 8,
    "d_steps": 2,
    "lr_g": 1e-4,
    "lr_d": 4e-4,
    "betas": [0.0, 0.999],
    "seed": 0,
    "dataset": "digits",
    "backend": "gloo",
}


def sample_cost(repetitions: int, device: torch.device | None = None) -> float:
    """Median seconds of one sample() in a process holding the GAN on `device` (CPU by default; on CUDA the sample
    reads NVML too)."""
    device = device or torch.device("cpu")
    models = [Generator(GanShape()).to(device), Discriminator(GanShape()).to(device)]  # noqa: F841  # held: a rank's
    backend = "nccl" if device.type == "cuda" else "gloo"
    sampler = ResourceSampler(RankContext(0, 1, 0, 1, 1, backend, device), 1.0)
    sampler.sample()
    seconds = []
    for _ in range(repetitions):
        started = time.perf_counter()
        sampler.sample()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def aligned_run(rate: float, steps: int) -> tuple[float, float, int]:
    """(largest spread of the ranks' sample times at one tick, median step time, ticks) of a 2-rank GAN run."""
    point = Point("benchmark", "gan", 2, 1, {**GAN, "steps": steps, "sample_interval_s": 1 / rate})
    with tempfile.TemporaryDirectory() as folder:
        run_point(point, Path(folder) / "run", local_launcher(600))
        rows = metric_records(Path(folder) / "run")
    times: dict[float, list[float]] = {}
    for row in rows:
        if row["metric"] == "node_cpu_percent":
            times.setdefault(round(row["time"] * rate) / rate, []).append(row["time"])
    spreads = [max(seen) - min(seen) for seen in times.values() if len(seen) == 2]
    steps_s = [row["value"] for row in rows if row["metric"] == "step_time_s" and row.get("step", 0) > 0]
    return max(spreads), statistics.median(steps_s), len(spreads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=1.0, help="samples per second")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record:
        with ForeignLoadMeter() as meter:
            cost = sample_cost(args.repetitions)
        record.add("sample-cost", "one sample() (median)", cost * 1000, "ms", meter.load)
        record.add(
            "sampler-share", f"sampling at {args.rate:g}/s: share of time", 100 * cost * args.rate, "%", meter.load
        )
        with ForeignLoadMeter() as meter:
            spread, step_s, ticks = aligned_run(args.rate, args.steps)
        record.add("step-time", "GAN step (2 ranks, smoke model)", step_s, "s", meter.load)
        record.add("alignment", f"largest spread of 2 ranks' sample times over {ticks} ticks", spread, "s", meter.load)


if __name__ == "__main__":
    main()
