"""Resize latency of the in-place elastic runtime vs torchrun's restart, on this machine, smoke model
(kungfu-fig7's smoke.yaml), every mode on the same schedule in one run (targets: targets.yaml):

- grow 1→2 from a warm standby (target ≤ 1 s); grow with a cold joiner, no standby (targets ≤ 5 s and ≤ 0.5 s: it
  is forked from the job's fork server); shrink 2→1 (target ≤ 30 ms);
- in place ÷ torchrun on the same events (target: torchrun ≥ 10× slower), against the faster of torchrun with
  torch's default keep-alive (a departed agent noticed after 5 s × 3) and with the tuned one (1 s × 3);
- a worker killed with SIGKILL: how long the survivor takes to notice, and to train again at the new size;
- the fork server's cost while idle: its start, resident and unique memory (one process per job).

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

import psutil
from _common import REPO, BenchmarkRecord

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import kungfu_fig7
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.launchers.forkserver import ForkServer
from ddlrepro.host.launchers.inplace import FORK_SERVER_PRELOAD
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import run_rows, tidy_table
from ddlrepro.host.testing import local_launcher, worker_pid


def measure_schedule(section: dict, launcher: dict, scratch: Path, record: BenchmarkRecord) -> None:
    points = kungfu_fig7.points(section, launcher)
    with ForeignLoadMeter() as meter:
        for point in points:
            run_point(point, scratch / point.id, local_launcher(900))
    table = tidy_table([scratch / point.id for point in points])
    summary = kungfu_fig7.latency_summary(kungfu_fig7.events(table))
    print(
        f"{section['model']} @{section.get('image_size')}px, batch {section['batch_size']}, "
        f"schedule {section['schedule']}; medians over the events of each kind"
    )
    for (mode, size), rate in steady_throughput(table).items():
        what = f"{mode} @{int(size)} workers: cluster img/s, median away from the resizes"
        record.add(f"{mode}@{int(size)}-img-per-s", what, rate, "img/s", meter.load)
    for row in summary.itertuples():
        name, event = f"{row.mode}-{row.kind}", f"{row.mode} {row.kind}"
        record.add(f"{name}-latency", f"{event}: latency, median", row.latency_s, "s", meter.load)
        record.add(
            f"{name}-to-sync", f"{event}: to the new cluster synchronised, median", row.to_sync_s, "s", meter.load
        )
        if row.mode.startswith("inplace"):
            what = f"{event}: {row.torchrun_baseline}'s latency ÷ this"
            record.add(f"{name}-speedup", what, row.speedup_vs_torchrun, "×", meter.load)


def steady_throughput(table):
    """Median cluster img/s per mode and cluster size, away from the resizes."""
    steps = table.pivot_table(index=["mode", "step"], columns="metric", values="value").reset_index()
    return steps.groupby(["mode", "cluster_size"])["img_per_sec"].median()


def measure_fault(section: dict, launcher: dict, scratch: Path, record: BenchmarkRecord) -> None:
    """Two workers; kill one mid-run; the survivor goes on alone."""
    (point,) = kungfu_fig7.points(
        {**section, "initial_workers": 2, "schedule": "200:0", "modes": ["inplace-cold"]}, launcher
    )
    run_dir = scratch / "fault"
    runner = threading.Thread(target=run_point, args=(point, run_dir), kwargs={"launcher": local_launcher(600)})
    with ForeignLoadMeter() as meter:
        runner.start()
        pid = worker_pid(run_dir, worker=1, after_steps=30)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        runner.join()
    rows = run_rows(run_dir)
    noticed = rows.loc[rows["metric"] == "fault_detected", "value"].min() - killed
    latency = rows.loc[rows["metric"] == "resize_latency_s", "value"].iloc[0]
    record.add("kill-noticed", "kill -9 of 1 of 2 workers: noticed after", noticed, "s", meter.load)
    record.add("kill-retrain", "then training again at 1 worker after", latency, "s", meter.load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schedule", default=None, help="resize schedule (default: config.yaml's)")
    args = parser.parse_args()
    config = load_config(REPO / "config" / "config.yaml")
    section = dict(config["figures"]["kungfu-fig7"])
    if args.schedule:
        section["schedule"] = args.schedule
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        measure_schedule(section, config["launcher"], Path(scratch), record)
        measure_fault(section, config["launcher"], Path(scratch), record)
        measure_fork_server(record)


def measure_fork_server(record: BenchmarkRecord) -> None:
    """What the fork server costs while it waits: one process, its start (the imports a cold joiner would pay),
    and its memory (resident; unique: what no forked child shares)."""
    with ForeignLoadMeter() as meter:
        started = time.perf_counter()
        forks = ForkServer({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}, FORK_SERVER_PRELOAD).start()
        try:
            if not forks.usable():
                raise RuntimeError(f"the fork server did not start: {list(forks.stderr_tail)}")
            ready = time.perf_counter() - started
            memory = psutil.Process(forks.process.pid).memory_full_info()
        finally:
            forks.stop()
    record.add("fork-server-ready", "fork server: started until its imports are done", ready, "s", meter.load)
    record.add("fork-server-rss", "fork server idle: resident memory", memory.rss / 2**20, "MiB", meter.load)
    record.add("fork-server-uss", "fork server idle: unique memory", memory.uss / 2**20, "MiB", meter.load)


if __name__ == "__main__":
    main()
