"""Adaptive strategy (part `strategy` of adaptive_policies): how soon KungFu's policy moves STAR's root once the
traffic is on, and that it never moves it without traffic. kungfu-fig5's smoke setting (its folder's smoke.yaml): its
adaptive point `--adaptive-runs` times and its quiet point `--quiet-runs` times, each on its own testbed through
the local launcher. Figures: the slowest switch after the first step run fully under interference, in steps and
seconds (targets: ≤ 3 steps and ≤ 2 s), and the switches of all quiet runs together (target 0). As root (network
namespaces); otherwise it says why and records nothing.

    python benchmarks/adaptive_policies.py --parts strategy [--adaptive-runs 2] [--quiet-runs 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import REPO, BenchmarkRecord

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import kungfu_fig5
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testbed import limits
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point

RUN_TIMEOUT_S = 300


def fig5_point(run: str) -> Point:
    config = load_config(REPO / "config" / "config.yaml")
    points = kungfu_fig5.points(config["figures"][kungfu_fig5.ID], config["launcher"])
    return next(point for point in points if point.params["run"] == run)


def run_summaries(run: str, times: int, scratch: Path) -> list[dict]:
    """kungfu-fig5's summary row of each of `times` runs of one of its points."""
    point = fig5_point(run)
    summaries = []
    for attempt in range(times):
        run_dir = scratch / f"{run.replace(' ', '-')}-{attempt}"
        run_point(point, run_dir, local_launcher(RUN_TIMEOUT_S))
        summaries.append(kungfu_fig5.run_summary(tidy_table([run_dir]), run))
    return summaries


def measure(record: BenchmarkRecord, args: argparse.Namespace) -> None:
    reason = limits.unavailable_reason()
    if reason:
        print(f"adaptive strategy: skipped: {reason}")
        return
    with tempfile.TemporaryDirectory() as scratch:
        with ForeignLoadMeter() as meter:
            adaptive = run_summaries("adaptive", args.adaptive_runs, Path(scratch))
        steps = [row["switch_delay_steps"] for row in adaptive]
        seconds = [row["switch_delay_s"] for row in adaptive]
        runs = f"{args.adaptive_runs} adaptive runs"
        record.add(
            "strategy-switch-delay-steps",
            f"switch after the first fully interfered step, slowest of {runs} (steps)",
            max(steps),
            "steps",
            meter.load,
            each=", ".join(f"{value:g}" for value in steps),
        )
        record.add(
            "strategy-switch-delay-s",
            f"switch after the first fully interfered step began, slowest of {runs}",
            max(seconds),
            "s",
            meter.load,
            each=", ".join(f"{value:.2f}" for value in seconds),
        )
        with ForeignLoadMeter() as meter:
            quiet = run_summaries("quiet", args.quiet_runs, Path(scratch))
        record.add(
            "strategy-quiet-switches",
            f"switches in {args.quiet_runs} quiet runs",
            sum(row["switches"] for row in quiet),
            "",
            meter.load,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adaptive-runs", type=int, default=2, help="runs of kungfu-fig5's adaptive point")
    parser.add_argument("--quiet-runs", type=int, default=5, help="runs of kungfu-fig5's quiet point")
