"""EasyScale overheads on this machine, smoke model (config/config.yaml's sections, longer runs):

- D1 step time ÷ plain DDP on the same processes at the same global batch (target ≤ 1.10); D0 for comparison.
  The three runs alternate for `--rounds` rounds; each round's ratio uses that round's runs.
- Memory of N = 4 ESTs in one process ÷ that of 4 packed processes, peak RSS summed over the job (target ≤ 1/4 + 0.10).

    python benchmarks/easyscale_overheads.py [--rounds 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from ddlrepro.config import REPO_ROOT, load_config
from ddlrepro.figures import easyscale_fig10, easyscale_fig12
from ddlrepro.figures.easyscale_overheads import peak_memory
from ddlrepro.run import run_point
from ddlrepro.tables import tidy_table


def measure(points: list, workdir: Path):
    for point in points:
        run_point(point, workdir / point.id, timeout_s=1800)
    return tidy_table([workdir / point.id for point in points])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    config = load_config(REPO_ROOT / "config" / "config.yaml")
    launcher = config["launcher"]
    timing = {**config["figures"]["easyscale-fig12"], "steps": args.steps, "warmup_steps": 3}
    ratios: dict[str, list[float]] = {"D0": [], "D1": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            table = measure(easyscale_fig12.points(timing, launcher), Path(scratch) / f"round{round_index}")
            summary = easyscale_fig12.step_times(table, timing["warmup_steps"]).set_index("mode")
            for mode in ratios:
                ratios[mode].append(float(summary.loc[mode, "normalised_to_ddp"]))
            print(f"round {round_index}: " + ", ".join(f"{mode} {values[-1]:.3f}x" for mode, values in ratios.items()))
        memory_section = {**config["figures"]["easyscale-fig10"], "logical_worker_counts": [4], "steps": 6}
        points = easyscale_fig10.points(memory_section, launcher)
        memory = peak_memory(measure(points, Path(scratch) / "memory")).set_index("point_id")["total_rss_mib"]
        packed, ests = (memory[point.id] for point in sorted(points, key=lambda point: -point.workers))
    logical, processes = timing["logical_workers"], timing["workers"]
    print(f"{timing['model']}, {logical} ESTs of batch {timing['batch_size']} on {processes} processes vs plain DDP")
    for mode, target in (("D1", "  (target <= 1.10)"), ("D0", "")):
        median = statistics.median(ratios[mode])
        print(f"{mode} step time / plain DDP (median of {args.rounds} rounds): {median:.3f}{target}")
    ratio = ests / packed
    print(f"memory, 4 ESTs in 1 process / 4 packed: {ests:.0f} / {packed:.0f} MiB = {ratio:.3f}  (target <= 0.35)")


if __name__ == "__main__":
    main()
