"""Adaptive provisioning (KungFu Fig 6) on the in-place elastic runtime, this machine, the smoke encoder
(kungfu-fig6's smoke.yaml), every joiner from the warm standby pool (targets: targets.yaml,
`adaptive_policies`, ids `provisioning-*`):

- the time from the policy's decision (rank 0, right after the all-reduce that every rank decides on) to the first
  step completed at the new size, for each grow and shrink;
- the survivors keep their processes: every worker process announces its process id once, at its start; the job
  starts 1 worker and max_workers − 1 standbys up front, so any further process id is a restarted survivor or a
  cold joiner (target: none).

The throughputs the ranks feed the policy are scripted (`scripted_throughput`: 1 → 2 → … → max_workers, then back
by one) so that every kind of event happens whatever this machine's speed; the latencies are measured.

    python benchmarks/adaptive_policies.py --parts provisioning [--max-workers 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import REPO, BenchmarkRecord

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import kungfu_fig6
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import run_rows
from ddlrepro.host.testing import live_records, local_launcher


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-workers", type=int, default=None, help="largest cluster (default: config.yaml's)")


def scripted_throughput(max_workers: int) -> dict[str, float]:
    """Per-worker throughputs that make the policy grow to `max_workers`, then give back the last worker: every
    size up to max_workers − 1 doubles T, the last adds nothing."""
    totals = {size: 100.0 * 2 ** (size - 1) for size in range(1, max_workers)}
    totals[max_workers] = totals[max_workers - 1]
    return {str(size): total / size for size, total in totals.items()}


def measure(record: BenchmarkRecord, args: argparse.Namespace) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    section = dict(config["figures"]["kungfu-fig6"])
    largest = args.max_workers or section["max_workers"]
    section.update(max_workers=largest, standby=largest - 1)
    section["steps"] = (largest + 2) * section["window_steps"]  # every grow, the shrink, and a window after it
    adaptive, *_ = kungfu_fig6.points(section, config["launcher"])
    adaptive.params["scripted_throughput"] = scripted_throughput(largest)
    with tempfile.TemporaryDirectory() as scratch, ForeignLoadMeter() as meter:
        run_dir = Path(scratch) / "adaptive"
        run_point(adaptive, run_dir, local_launcher(600))
        events = resize_events(run_dir)
        started = len(process_ids(run_dir))
    print(
        f"{section['model']}, batch {section['batch_size']}, windows of {section['window_steps']} steps, "
        f"{largest - 1} warm standbys"
    )
    for event in events:
        kind = "grow" if event["to"] > event["from"] else "shrink"
        record.add(
            f"provisioning-{kind}-{event['from']}-{event['to']}",
            f"policy {kind} {event['from']} → {event['to']}: decision to the first step at the new size",
            event["latency_s"],
            "s",
            meter.load,
        )
    up_front = adaptive.params["initial_workers"] + adaptive.params["standby"]
    what = "processes started after the first step (restarted survivors, cold joiners)"
    record.add("provisioning-new-processes", what, started - up_front, "", meter.load)


def resize_events(run_dir: Path) -> list[dict[str, float]]:
    rows = run_rows(run_dir)
    rows = rows[rows["metric"].isin(["resize_latency_s", "resize_from_size", "resize_to_size"])]
    wide = rows.pivot_table(index="step", columns="metric", values="value").sort_index()
    return [
        {"from": int(row.resize_from_size), "to": int(row.resize_to_size), "latency_s": row.resize_latency_s}
        for row in wide.itertuples()
    ]


def process_ids(run_dir: Path) -> set[int]:
    """The process ids the run's workers announced (each process once, at its start)."""
    return {record["pid"] for record in live_records(run_dir) if record["kind"] == "worker"}
