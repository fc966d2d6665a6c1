"""Data path: img/s of the throughput workload reading its shards from the object store (`s3`: SeaweedFS, not IBM
COS, through MinIO's S3 client on a prefetching thread) ÷ reading them from local disk (`local`), and the store's
start and stop times.

Same model, batch, shards and threads (1 worker × 1 thread); paired rounds, one run of each, which goes first
swapping round by round, each run a fresh process (an `s3` run starts its own store, outside its timed
iterations), so machine noise hits both alike. The ratio is judged as the workflow judges a timing claim: the mean
of the rounds' s3 ÷ local ratios with its one-sided 95 % bootstrap bounds, over `--rounds` fixed before the run.
Twenty: the rounds' ratios spread about 5 % here (sd; 1.96 standard errors of 5 rounds were ± 0.044), and with
n ≈ ((1.645 + 0.84) · σ / m)² twenty rounds settle a mean 0.028 from the line. Also recorded: the median time from
starting SeaweedFS to its bucket answering (`up`) and from asking it to stop to its exit (`down`: SIGTERM, then
SIGKILL).
Targets (targets.yaml): ratio ≥ 0.95, up ≤ 10 s, down ≤ 15 s.

    python benchmarks/data_path.py [--model resnet20] [--batch-size 32] [--rounds 20] [--store-rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from _common import BenchmarkRecord, paired_round
from harness_fidelity import measure_harness

from ddlrepro.host import objectstore
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.rank.pack_shards import pack


def measure(args: argparse.Namespace, source: str, shards: Path, run_dir: Path) -> float:
    """One 1-worker × 1-thread throughput run reading `source`: its img/s."""
    inputs = {"shards_dir": str(shards)}
    return measure_harness(args, run_dir, inputs=inputs, data_source=source, shards=args.shards)


def store_up_and_down(shards: Path) -> tuple[float, float]:
    """Seconds from starting the store to its bucket answering, and from leaving it to its exit."""
    with objectstore.serving(shards) as store:
        up = store.timings["up_s"]
        leaving = time.perf_counter()
    return up, time.perf_counter() - leaving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20, help="paired rounds, fixed before the run")
    parser.add_argument("--store-rounds", type=int, default=3)
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record, tempfile.TemporaryDirectory() as scratch:
        shards = Path(scratch) / "shards"
        pack(shards, args.model, args.batch_size, args.shards)
        with ForeignLoadMeter() as meter:
            times = [store_up_and_down(shards) for _ in range(args.store_rounds)]
        up, down = (statistics.median(values) for values in zip(*times, strict=True))
        record.add("store-up", f"{objectstore.LABEL}: start to bucket ready (median)", up, "s", meter.load)
        record.add("store-down", f"{objectstore.LABEL}: stop (SIGTERM, then SIGKILL) to exit (median)", down, "s",
                   meter.load, slowest=max(time for _, time in times))  # fmt: skip
        local: list[float] = []
        s3: list[float] = []
        with ForeignLoadMeter() as meter:
            for index in range(args.rounds):
                on_disk = partial(measure, args, "local", shards, Path(scratch) / f"local{index}")
                in_store = partial(measure, args, "s3", shards, Path(scratch) / f"s3{index}")
                rates = paired_round(index, on_disk, in_store)
                local.append(rates[0])
                s3.append(rates[1])
                print(f"round {index}: local {local[-1]:.1f} img/s, s3 {s3[-1]:.1f} img/s")
        ratios = [remote / disk for remote, disk in zip(s3, local, strict=True)]
        record.add("local", "local disk, median of the rounds", statistics.median(local), "img/s", meter.load)
        record.add("s3", "S3 (SeaweedFS), median of the rounds", statistics.median(s3), "img/s", meter.load)
        what = "s3 ÷ local img/s: mean of the rounds' ratios"
        record.add("s3-vs-local", what, statistics.fmean(ratios), "", meter.load, round_values=ratios)
        print(f"up {up:.2f} s, down {down:.2f} s, s3 / local {statistics.fmean(ratios):.3f} (mean of the rounds)")


if __name__ == "__main__":
    main()
