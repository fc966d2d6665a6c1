"""The scheduler simulator (issue 17, `ddlrepro.host.simulator`): the artifact-sized trace (its 68 rows'
statistics, seeded) under all four policies on its cluster (32 V100 + 16 P100 + 16 T4) within 10 s; the same bytes
of jobs.csv, allocations.csv and trace.csv from `ddlrepro simulate` run in two processes with other hash seeds
(PYTHONHASHSEED 1 and 2); the order of the policies' mean JCT (the issue's check: heter < homo < YARN-CS, a target)
and of their makespans (recorded: 1 when heter < homo < YARN-CS holds, 0 when not).

Profiles: SYNTHETIC until measured ones exist (the artifact's eight applications on V100 / P100 / T4 at its batches,
1–32 ESTs per device, step times proportional to the batch; figures say `synthetic`). The fidelity targets (the
throughput model against real consistent-training runs, the real replay against the simulation) need measured
profiles and the replay: they are added here, as further figures and targets, with those.

    python benchmarks/simulator_fidelity.py [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from _common import BenchmarkRecord

from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.simulator.cluster import ARTIFACT_CLUSTER, Cluster
from ddlrepro.host.simulator.engine import Simulation, simulate
from ddlrepro.host.simulator.policies import POLICIES
from ddlrepro.host.simulator.profiles import Profiles, from_table
from ddlrepro.host.simulator.traces import ARTIFACT_APPLICATION_COUNTS, generate_trace

SYNTHETIC_HOST = "synthetic (no measured profiles yet)"
# Relative step time per device type (V100 fastest), and per application at batch 1 (s).
TYPE_SLOWDOWN = {"v100": 1.0, "p100": 1.6, "t4": 2.5}
BATCHES = [2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]
ESTS_PER_DEVICE = [1, 2, 4, 8, 16, 32]


def synthetic_profiles() -> Profiles:
    return from_table(synthetic_table(), "synthetic profiles")


def synthetic_table() -> pd.DataFrame:
    """Step time = a per-application constant × batch × the type's slowdown, 5 % cheaper per EST from 2 ESTs on
    a device on (overlap), so the policies have something to weigh."""
    rows = [
        {
            "application": application,
            "device_type": device_type,
            "batch_per_est": batch,
            "ests_per_device": ests,
            "step_time_s": 0.002 * (1 + index / 4) * batch * slowdown * (0.95 if ests > 1 else 1.0),
            "host": SYNTHETIC_HOST,
        }
        for index, application in enumerate(sorted(ARTIFACT_APPLICATION_COUNTS))
        for device_type, slowdown in TYPE_SLOWDOWN.items()
        for batch in BATCHES
        for ests in ESTS_PER_DEVICE
    ]
    return pd.DataFrame(rows)


ORDER = ("easyscale-heter", "easyscale-homo", "yarn-cs")  # the check: each below the next
TABLES = ("jobs.csv", "allocations.csv", "trace.csv")


def run_all(seed: int) -> list[Simulation]:
    cluster = Cluster.of(ARTIFACT_CLUSTER)
    profiles = synthetic_profiles()
    jobs = generate_trace(seed, profiles, cluster)
    return [simulate(jobs, cluster, profiles, policy) for policy in POLICIES]


def command_line_tables(seed: int, folder: Path, hash_seed: str) -> list[bytes]:
    """`ddlrepro simulate` in a process of its own, all policies, on the synthetic profiles (as a CSV)."""
    profile = folder / "profile.csv"
    if not profile.exists():
        synthetic_table().to_csv(profile, index=False)
    out = folder / f"hash-seed-{hash_seed}"
    command = [sys.executable, "-m", "ddlrepro.host.cli", "simulate", "--generate-seed", str(seed)]
    command += ["--profiles", str(profile), "--out", str(out), "--policy", *POLICIES]
    subprocess.run(command, check=True, capture_output=True, env=os.environ | {"PYTHONHASHSEED": hash_seed})
    return [(out / name).read_bytes() for name in TABLES]


def strictly_increasing(values: dict[str, float]) -> bool:
    ordered = [values[policy] for policy in ORDER]
    return all(low < high for low, high in itertools.pairwise(ordered))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record, tempfile.TemporaryDirectory() as scratch:
        with ForeignLoadMeter() as meter:
            started = time.perf_counter()
            simulations = run_all(args.seed)
            wall = time.perf_counter() - started
        jobs = len(simulations[0].jobs)
        record.add("wall-4-policies", f"{jobs} jobs × {len(POLICIES)} policies, wall time", wall, "s", meter.load)
        with ForeignLoadMeter() as meter:
            first, second = (command_line_tables(args.seed, Path(scratch), hash_seed) for hash_seed in ("1", "2"))
        differing = sum(a != b for a, b in zip(first, second, strict=True))
        what = f"tables differing between two processes, PYTHONHASHSEED 1 and 2 (of {len(TABLES)})"
        record.add("differing-tables", what, differing, "", meter.load)
        summaries = {simulation.policy: simulation.summary() for simulation in simulations}
        for policy, summary in summaries.items():
            for key, what in (("mean_jct_s", "mean JCT"), ("makespan_s", "makespan")):
                record.add(
                    f"{policy}-{key.removesuffix('_s').replace('_', '-')}",
                    f"{policy} {what} (simulated, synthetic profiles)",
                    summary[key],
                    "s",
                    meter.load,
                )
        makespans = {policy: summary["makespan_s"] for policy, summary in summaries.items()}
        what = "makespan heter < homo < YARN-CS (1 holds, 0 not; simulated, synthetic profiles)"
        record.add("makespan-order", what, int(strictly_increasing(makespans)), "", meter.load)


if __name__ == "__main__":
    main()
