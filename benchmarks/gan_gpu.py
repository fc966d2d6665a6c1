"""The BigGAN study on a GPU, where this machine has CUDA: the GAN at the paper's shape (config/paper.yaml's
biggan-profiles: 128 px, 64 channels, z 120, attention at 64 px, batch 64 per rank) trained by one rank per GPU
(NCCL, local launcher, no Slurm) with the resource sampler reading NVML at `--rate`:

- GPU utilisation (NVML) over the steps after the first `--warmup-steps`: mean, p5, p95 (biggan-profiles'
  hpc-gpu-busy check asks ≥ 90 % at paper scale); here the images are random stand-ins, not the seed's data;
- the median step time, and the device memory NVML shows against torch's own allocation;
- one sample() with NVML (resource_sampler.py's measure on the GPU), and its share of time at `--rate`.

Without CUDA it records nothing and says so.

    python benchmarks/gan_gpu.py [--ranks 1] [--steps 120] [--warmup-steps 20] [--rate 1.0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import REPO, BenchmarkRecord
from resource_sampler import sample_cost

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import biggan_profiles
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point

STAND_IN_IMAGES = 1024


def stand_in_images(folder: Path, resolution: int) -> Path:
    """Random uint8 images and labels in the `folder` dataset's format: the GPU's work does not depend on them."""
    generator = np.random.default_rng(0)
    folder.mkdir(parents=True)
    images = generator.integers(0, 256, (STAND_IN_IMAGES, 3, resolution, resolution), dtype=np.uint8)
    np.save(folder / "images.npy", images)
    np.save(folder / "labels.npy", generator.integers(0, 10, STAND_IN_IMAGES))
    return folder


def paper_point(ranks: int, steps: int, rate: float, data_dir: Path) -> Point:
    """biggan-profiles' paper-scale point, run here (environment kind `local`: no Slurm), on `ranks` GPUs."""
    config = load_config(REPO / "config" / "config.yaml", REPO / "config" / "paper.yaml")
    section = config["figures"][biggan_profiles.ID]
    section = {**section, "workers": ranks, "steps": steps, "data_dir": str(data_dir)}
    section["environments"] = [{"name": "gpu", "kind": "local"}]
    launcher = {**config["launcher"], "backend": "nccl", "sample_interval_s": 1 / rate}
    (point,) = biggan_profiles.points(section, launcher)
    return point


def series(rows: list[dict], metric: str, since: float) -> list[float]:
    return [row["value"] for row in rows if row["metric"] == metric and row["time"] >= since]


def trained(point: Point, folder: Path, warmup_steps: int) -> dict[str, list[float]]:
    """Run the point; the NVML series and step times after rank 0's first `warmup_steps` steps."""
    run_point(point, folder / "run", local_launcher(1800))
    result = json.loads((folder / "run" / "result.json").read_text())
    if result["status"] != "ok":
        raise RuntimeError(f"the GAN run did not finish: {result}")
    rows = metric_records(folder / "run")
    steps = sorted((row["time"], row["value"]) for row in rows if row["metric"] == "step_time_s" and row["rank"] == 0)
    since = steps[warmup_steps][0]
    measured = ("gpu_utilization_percent", "gpu_memory_percent", "gpu_memory_bytes", "torch_allocated_bytes")
    return {metric: series(rows, metric, since) for metric in measured} | {
        "step_time_s": [value for _, value in steps[warmup_steps:]]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1, help="GPUs to train on, one rank each")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--rate", type=float, default=1.0, help="samples per second")
    parser.add_argument("--repetitions", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gan_gpu: skipped: needs CUDA")
        return
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        point = paper_point(args.ranks, args.steps, args.rate, stand_in_images(Path(scratch) / "images", 128))
        gpu = torch.cuda.get_device_name(0)
        with ForeignLoadMeter() as meter:
            measured = trained(point, Path(scratch), args.warmup_steps)
        utilisation = np.array(measured["gpu_utilization_percent"])
        where = f"{gpu}, {args.ranks} rank(s), paper shape, random stand-in images"
        record.add("gpu-utilisation-mean", f"GPU utilisation, mean ({where})", utilisation.mean(), "%", meter.load)
        record.add("gpu-utilisation-p5", "GPU utilisation, p5", np.percentile(utilisation, 5), "%", meter.load)
        record.add("gpu-utilisation-p95", "GPU utilisation, p95", np.percentile(utilisation, 95), "%", meter.load)
        step_s = statistics.median(measured["step_time_s"])
        record.add("step-time", "GAN step (2 D steps + 1 G step), median", step_s, "s", meter.load)
        device, allocated = max(measured["gpu_memory_bytes"]), max(measured["torch_allocated_bytes"])
        record.add("device-memory", "device memory used (NVML), largest", device / 2**30, "GiB", meter.load)
        record.add("torch-allocated", "torch's own allocation, largest", allocated / 2**30, "GiB", meter.load)
        with ForeignLoadMeter() as meter:
            cost = sample_cost(args.repetitions, torch.device("cuda", 0))
        record.add("sample-cost", "one sample() with NVML (median)", cost * 1000, "ms", meter.load)
        share = 100 * cost * args.rate
        record.add("sampler-share", f"sampling at {args.rate:g}/s: share of time", share, "%", meter.load)


if __name__ == "__main__":
    main()
