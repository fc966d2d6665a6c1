"""Harness fidelity: img/s measured by the throughput workload ÷ img/s of a bare training loop.

Same model, batch, image size and threads; the two alternate in fresh processes within one run of this script,
so machine noise hits both alike. Target: ≥ 0.98.

    python benchmarks/harness_fidelity.py [--model resnet20] [--batch-size 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddlrepro.points import Point
from ddlrepro.run import run_point

TARGET = 0.98


def bare_loop(model_name: str, batch_size: int, image_size: int | None, warmup: int, iterations: int, batches: int):
    """The least code that trains the model on synthetic data: no DDP, no sampling, no records."""
    import torch

    from ddlrepro.models import build_model
    from ddlrepro.workloads.throughput import make_train_step, synthetic_batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(model_name)
    step = make_train_step(model, *synthetic_batch(model_name, batch_size, image_size, torch.device("cpu"), 0))
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(iterations):
        started = time.perf_counter()
        for _ in range(batches):
            step()
        rates.append(batch_size * batches / (time.perf_counter() - started))
    print(json.dumps(statistics.fmean(rates)))


def measure_bare(args: argparse.Namespace) -> float:
    command = [sys.executable, __file__, "--bare", "--model", args.model, "--batch-size", str(args.batch_size)]
    command += ["--image-size", str(args.image_size or 0), "--iterations", str(args.iterations)]
    command += ["--batches", str(args.batches), "--warmup", str(args.warmup)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return float(subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout)


def measure_harness(args: argparse.Namespace, run_dir: Path, **extra: Any) -> float:
    """img/s per worker of the throughput workload, 1 worker × 1 thread, through the launcher (`extra`: more
    point parameters, e.g. the framework)."""
    params = {
        "model": args.model,
        "batch_size": args.batch_size,
        "warmup_batches": args.warmup,
        "iterations": args.iterations,
        "batches_per_iteration": args.batches,
        "backend": "gloo",
        "sample_interval_s": 1.0,
        **extra,
    }
    if args.image_size:
        params["image_size"] = args.image_size
    record = run_point(Point("benchmark", "throughput", 1, 1, params), run_dir, timeout_s=1800)
    return record["summary"]["img_per_sec_per_worker"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.bare:
        bare_loop(args.model, args.batch_size, args.image_size or None, args.warmup, args.iterations, args.batches)
        return

    bare, harness = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for round_index in range(args.rounds):
            bare.append(measure_bare(args))
            harness.append(measure_harness(args, Path(workdir) / f"round{round_index}"))
            print(f"round {round_index}: bare {bare[-1]:.1f} img/s, workload {harness[-1]:.1f} img/s")
    ratio = statistics.median(harness) / statistics.median(bare)
    print(f"model {args.model}, batch {args.batch_size}, 1 worker x 1 thread, {args.rounds} alternating rounds")
    print(f"harness fidelity (median workload img/s / median bare-loop img/s): {ratio:.3f}  (target >= {TARGET})")


if __name__ == "__main__":
    main()
