"""What elasticity each runtime survives, on this machine at smoke scale (biggan-elasticity's smoke.yaml
section): every cell (ddp, torchrun, in place × late-start, killed, joins) run once, in one run
(targets: targets.yaml):

- each cell's wall time, from the job's start to its last record, and the worst of them (target ≤ 60 s);
- each cell's outcome and time from the event to the next training step;
- the nine runs' wall time, one after another (what the figure adds to `make reproduce`, with its table, plot and
  check jobs; the issue's budget for both BigGAN figures: 90 s).

    python benchmarks/biggan_elasticity.py [--late-s 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import REPO, BenchmarkRecord

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import biggan_elasticity
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher


def measure(section: dict, launcher: dict, scratch: Path, record: BenchmarkRecord) -> None:
    points = biggan_elasticity.points(section, launcher)
    with ForeignLoadMeter() as meter:
        started = time.perf_counter()
        for point in points:
            run_point(point, scratch / point.id, local_launcher(300))
        runs_s = time.perf_counter() - started
    cells = biggan_elasticity.cells(tidy_table([scratch / point.id for point in points]))
    print(
        f"{section['model']}, steps of ≥ {section['min_step_s']} s, event at step {section['event_step']}, late by "
        f"{section['late_s']} s, {section['steps_after_event']} steps after the event has played out"
    )
    for cell in cells.itertuples():
        name = f"{cell.runtime}-{cell.situation}"
        record.add(f"{name}-cell", f"{name} ({cell.outcome}): cell wall time", cell.cell_s, "s", meter.load)
        if cell.next_step_s == cell.next_step_s:  # no step after the event (a failed run): nothing to time
            record.add(f"{name}-next-step", f"{name}: event to the next step", cell.next_step_s, "s", meter.load)
    record.add("worst-cell", "worst cell wall time", float(cells["cell_s"].max()), "s", meter.load)
    record.add("all-runs", "the runs of every cell, one after another", runs_s, "s", meter.load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--late-s", type=float, default=None, help="how late the late worker is (default: config's)")
    args = parser.parse_args()
    config = load_config(REPO / "config" / "config.yaml")
    section = dict(config["figures"][biggan_elasticity.ID])
    if args.late_s is not None:
        section["late_s"] = args.late_s
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        measure(section, config["launcher"], Path(scratch), record)


if __name__ == "__main__":
    main()
