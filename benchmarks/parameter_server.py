"""Parameter servers: how long a TensorFlow PS cluster (chief, 2 workers, 1 PS, each on its own testbed host) takes
to be ready: from its first rank's process start to the chief's first training step done, every role up
(Python, torch and TensorFlow imported, servers listening, variables placed). Target ≤ 10 s. As root (network
namespaces); otherwise it says why and records nothing.

    python benchmarks/parameter_server.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from _common import BenchmarkRecord

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import figure_points
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.launchers import local_launcher
from ddlrepro.host.run import run_point
from ddlrepro.host.testbed import limits

REPO = Path(__file__).resolve().parent.parent
ROLES = {"ps_workers": 2, "ps": 1, "evaluators": 0}


def ready_seconds(run_dir: Path) -> float:
    """One cluster run of the smoke config's first placement with ROLES; its chief's `cluster_ready_s`."""
    config = load_config(REPO / "config" / "config.yaml")
    point = next(iter(figure_points(config)["wikimedia-ps"].values()))
    params = {**point.params, **ROLES, "epochs": 1, "probe_steps": 1, "testbed_hosts": 5}
    run_point(replace(point, workers=4, params=params), run_dir, local_launcher(300))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(record["value"] for record in records if record.get("metric") == "cluster_ready_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="cluster runs (the median is reported)")
    args = parser.parse_args()
    reason = limits.unavailable_reason()
    if reason:  # no record: the targets read "not run", as for a benchmark `make benchmarks` did not reach
        print(f"parameter_server: skipped: {reason}")
        return
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        with ForeignLoadMeter() as meter:
            rounds = [ready_seconds(Path(scratch) / f"run-{index}") for index in range(args.rounds)]
        what = (
            f"a PS cluster (chief, 2 workers, 1 PS on testbed hosts) ready: first step done (median of {args.rounds})"
        )
        record.add("cluster-ready", what, statistics.median(rounds), "s", meter.load, slowest=max(rounds))


if __name__ == "__main__":
    main()
