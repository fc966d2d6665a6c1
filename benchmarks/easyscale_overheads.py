"""EasyScale overheads on this machine, smoke model (the figures' smoke sections, longer runs):

- D1 step time ÷ plain DDP on the same processes at the same global batch (target ≤ 1.10); D0 for comparison.
  The three runs alternate for `--rounds` rounds; each round's ratio uses that round's runs.
- Memory of N = 4 ESTs in one process ÷ that of 4 packed processes, peak PSS summed over the job (target ≤ 1/4 +
  0.10); the same with RSS beside it (RSS counts the libtorch pages packed processes share once per process).

    python benchmarks/easyscale_overheads.py [--rounds 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _common import REPO, BenchmarkRecord

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import easyscale_fig10, easyscale_fig12
from ddlrepro.host.figures.step_timing import peak_memory
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher


def measure(points: list, workdir: Path):
    for point in points:
        run_point(point, workdir / point.id, local_launcher(1800))
    return tidy_table([workdir / point.id for point in points])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    config = load_config(REPO / "config" / "config.yaml")
    launcher = config["launcher"]
    timing = {**config["figures"]["easyscale-fig12"], "steps": args.steps, "warmup_steps": 3}
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        with ForeignLoadMeter() as step_meter:
            ratios = step_time_ratios(timing, launcher, args.rounds, Path(scratch))
        memory_section = {**config["figures"]["easyscale-fig10"], "logical_worker_counts": [4], "steps": 6}
        points = sorted(easyscale_fig10.points(memory_section, launcher), key=lambda point: -point.workers)
        with ForeignLoadMeter() as memory_meter:
            memory = peak_memory(measure(points, Path(scratch) / "memory")).set_index("point_id")
        logical, processes = timing["logical_workers"], timing["workers"]
        print(
            f"{timing['model']}, {logical} ESTs of batch {timing['batch_size']} on {processes} processes vs plain DDP"
        )
        for mode in ("D1", "D0"):
            what = f"EasyScale {mode} step time ÷ plain DDP's, median over rounds"
            record.add(f"{mode.lower()}-step-ratio", what, statistics.median(ratios[mode]), "", step_meter.load)
        packed, ests = (memory.loc[point.id] for point in points)
        for measure_name in ("pss", "rss"):
            column = f"total_{measure_name}_mib"
            what = f"summed peak {measure_name.upper()}, 4 ESTs in 1 process"
            record.add(f"ests-{measure_name}", what, ests[column], "MiB", memory_meter.load)
            what = f"summed peak {measure_name.upper()}, 4 packed processes"
            record.add(f"packed-{measure_name}", what, packed[column], "MiB", memory_meter.load)
            what = f"memory, 4 ESTs in 1 process ÷ 4 packed processes, summed peak {measure_name.upper()}"
            record.add(f"memory-{measure_name}-ratio", what, ests[column] / packed[column], "", memory_meter.load)


def step_time_ratios(timing: dict, launcher: dict, rounds: int, scratch: Path) -> dict[str, list[float]]:
    """Per round, D0's and D1's step time ÷ plain DDP's in that round."""
    ratios: dict[str, list[float]] = {"D0": [], "D1": []}
    for round_index in range(rounds):
        table = measure(easyscale_fig12.points(timing, launcher), scratch / f"round{round_index}")
        summary = easyscale_fig12.step_times(table, timing["warmup_steps"]).set_index("mode")
        for mode in ratios:
            ratios[mode].append(float(summary.loc[mode, "normalised_to_ddp"]))
        print(f"round {round_index}: " + ", ".join(f"{mode} {values[-1]:.3f}x" for mode, values in ratios.items()))
    return ratios


if __name__ == "__main__":
    main()
