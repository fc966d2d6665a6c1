"""Resize latency of the in-place elastic runtime vs torchrun's restart, on this machine, smoke model
(config/config.yaml's kungfu-fig7 section), every mode on the same schedule in one run:

- grow 1→2 from a warm standby (target ≤ 1 s); grow with a cold spawn (target ≤ 5 s); shrink 2→1 (target ≤ 30 ms);
- in place ÷ torchrun on the same events (target: torchrun ≥ 10× slower), against the faster of torchrun with
  torch's default keep-alive (a departed agent noticed after 5 s × 3) and with the tuned one (1 s × 3);
- a worker killed with SIGKILL: how long the survivor takes to notice, and to train again at the new size.

Latency: from rank 0 seeing the new config to the first step completed at the new size (and, as KungFu defined
it, to the new cluster having synchronised).

    python benchmarks/elastic_resize.py [--schedule 10:2,20:1,30:2,40:1,50:0]
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from _common import judged, noted

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import kungfu_fig7
from ddlrepro.host.hostload import ForeignLoadMeter, HostLoad
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import run_rows, tidy_table
from ddlrepro.rank.elastic.faults import worker_pid

REPO = Path(__file__).resolve().parents[1]

TARGETS = {("inplace-warm", "grow"): 1.0, ("inplace-cold", "grow"): 5.0, ("inplace-cold", "shrink"): 0.030}
SPEEDUP_TARGET = 10.0
FAULT_TARGET_S = 5.0


def measure_schedule(section: dict, launcher: dict, scratch: Path) -> None:
    points = kungfu_fig7.points(section, launcher)
    with ForeignLoadMeter() as meter:
        for point in points:
            run_point(point, scratch / point.id, timeout_s=900)
    table = tidy_table([scratch / point.id for point in points])
    summary = kungfu_fig7.summarize(kungfu_fig7.events(table))
    print(
        f"{section['model']} @{section.get('image_size')}px, batch {section['batch_size']}, "
        f"schedule {section['schedule']}; medians over the events of each kind"
    )
    print(noted(f"  cluster img/s (median per mode @ size): {steady_throughput(table)}", meter.load))
    for row in summary.itertuples():
        latency, to_sync = row.latency_s * 1000, row.to_sync_s * 1000
        figure = f"  {row.mode:14s} {row.kind:6s} latency {latency:9.1f} ms, to sync {to_sync:9.1f} ms"
        print(latency_line(figure, row.latency_s, TARGETS.get((row.mode, row.kind)), meter.load))
        if row.mode.startswith("inplace"):
            speedup = f"  {row.mode:14s} {row.kind:6s} {row.torchrun_baseline} / this = {row.speedup_vs_torchrun:7.1f}x"
            print(judged(speedup, row.speedup_vs_torchrun >= SPEEDUP_TARGET, f">= {SPEEDUP_TARGET:g}x", meter.load))


def latency_line(figure: str, latency_s: float, target_s: float | None, load: HostLoad) -> str:
    if target_s is None:
        return noted(figure, load)
    target = f"<= {target_s * 1000:g} ms" if target_s < 1 else f"<= {target_s:g} s"
    return judged(figure, latency_s <= target_s, target, load)


def steady_throughput(table) -> str:
    """Median cluster img/s per mode and cluster size, away from the resizes."""
    steps = table.pivot_table(index=["mode", "step"], columns="metric", values="value").reset_index()
    medians = steps.groupby(["mode", "cluster_size"])["img_per_sec"].median()
    return ", ".join(f"{mode} @{int(size)}: {rate:.0f}" for (mode, size), rate in medians.items())


def measure_fault(section: dict, launcher: dict, scratch: Path) -> None:
    """Two workers; kill one mid-run; the survivor goes on alone."""
    (point,) = kungfu_fig7.points(
        {**section, "initial_workers": 2, "schedule": "200:0", "modes": ["inplace-cold"]}, launcher
    )
    run_dir = scratch / "fault"
    runner = threading.Thread(target=run_point, args=(point, run_dir), kwargs={"timeout_s": 600})
    with ForeignLoadMeter() as meter:
        runner.start()
        pid = worker_pid(run_dir, worker=1, after_steps=30)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        runner.join()
    rows = run_rows(run_dir)
    noticed = rows.loc[rows["metric"] == "fault_detected", "value"].min() - killed
    latency = rows.loc[rows["metric"] == "resize_latency_s", "value"].iloc[0]
    print(
        judged(
            f"  kill -9 of 1 of 2 workers: noticed after {noticed * 1000:.1f} ms", noticed <= 5, "<= 5 s", meter.load
        )
    )
    print(noted(f"  training again at 1 worker {latency * 1000:.1f} ms after noticing", meter.load))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedule", default=None, help="resize schedule (default: config.yaml's)")
    args = parser.parse_args()
    config = load_config(REPO / "config" / "config.yaml")
    section = dict(config["figures"]["kungfu-fig7"])
    if args.schedule:
        section["schedule"] = args.schedule
    with tempfile.TemporaryDirectory() as scratch:
        measure_schedule(section, config["launcher"], Path(scratch))
        measure_fault(section, config["launcher"], Path(scratch))


if __name__ == "__main__":
    main()
