"""Parameter servers: how long a TensorFlow PS cluster (chief, 2 workers, 1 PS, each on its own testbed host) takes
to be ready: from its first rank's process start to the chief's first training step done, every role up
(Python, torch and TensorFlow imported, servers listening, variables placed). Target ≤ 10 s. Also recorded: the
part after the last rank had loaded its libraries (on a 2-core machine four ranks importing TensorFlow at once
dominate). As root (network namespaces); otherwise it says why and records nothing.

    python benchmarks/parameter_server.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from _common import BenchmarkRecord, testbed_unavailable

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import figure_points
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.testing import local_launcher

REPO = Path(__file__).resolve().parent.parent
ROLES = {"ps_workers": 2, "ps": 1, "evaluators": 0}


def ready_seconds(run_dir: Path) -> tuple[float, float]:
    """One cluster run of the smoke config's first placement with ROLES: its chief's `cluster_ready_s`, and the
    part after every rank had loaded Python, torch and TensorFlow (`cluster_ready_after_imports_s`)."""
    config = load_config(REPO / "config" / "config.yaml")
    point = next(iter(figure_points(config)["wikimedia-ps"].values()))
    params = {**point.params, **ROLES, "epochs": 1, "probe_steps": 1, "testbed_hosts": 4}
    run_point(replace(point, workers=4, params=params), run_dir, local_launcher(300))
    records = metric_records(run_dir)
    values = {record["metric"]: record["value"] for record in records if record.get("metric", "").startswith("cluster")}
    return values["cluster_ready_s"], values["cluster_ready_after_imports_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="cluster runs (the median is reported)")
    args = parser.parse_args()
    if testbed_unavailable(Path(__file__).stem):
        return
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        with ForeignLoadMeter() as meter:
            rounds = [ready_seconds(Path(scratch) / f"run-{index}") for index in range(args.rounds)]
        cluster = "a PS cluster (chief, 2 workers, 1 PS on testbed hosts)"
        ready, formed = ([run[index] for run in rounds] for index in (0, 1))
        what = f"{cluster} ready, from its first process's start to the first step done (median of {args.rounds})"
        record.add("cluster-ready", what, statistics.median(ready), "s", meter.load, slowest=max(ready))
        what = f"{cluster}: of that, after every rank had loaded Python, torch and TensorFlow (median)"
        record.add("cluster-ready-after-imports", what, statistics.median(formed), "s", meter.load)


if __name__ == "__main__":
    main()
