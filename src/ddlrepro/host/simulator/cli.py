"""`ddlrepro simulate`: a trace (the artifact's CSV, or generated from a seed) through policies on a simulated
cluster; writes jobs.csv, allocations.csv and the trace it ran (trace.csv) into --out."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddlrepro.host.errors import UserError
from ddlrepro.host.simulator.cluster import ARTIFACT_CLUSTER, Cluster
from ddlrepro.host.simulator.rules import ARTIFACT_START_S, MAX_SIM_TIME_S, ROUND_S
from ddlrepro.host.simulator.schedulers import POLICIES
from ddlrepro.host.simulator.step_profiles import read_profiles
from ddlrepro.host.simulator.traces import (
    ARTIFACT_APPLICATION_COUNTS,
    generate_trace,
    map_applications,
    read_trace,
    write_trace,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="a trace in the EasyScale artifact's CSV format")
    source.add_argument("--generate-seed", type=int, help="generate a trace with the artifact's statistics")
    parser.add_argument(
        "--profiles", type=Path, required=True, help="a tidy profile CSV, or the artifact's profiles_dir (a folder)"
    )
    parser.add_argument("--policy", nargs="+", required=True, choices=sorted(POLICIES))
    parser.add_argument("--out", type=Path, required=True, help="folder for jobs.csv, allocations.csv, trace.csv")
    parser.add_argument(
        "--cluster",
        default=",".join(f"{t}={n}" for t, n in ARTIFACT_CLUSTER.items()),
        help="device types and counts, e.g. v100=32,p100=16,t4=16 (the artifact's, by default)",
    )
    parser.add_argument("--round-s", type=float, default=ROUND_S)
    parser.add_argument("--restart", choices=["artifact", "measured"], default="artifact")
    parser.add_argument(
        "--restart-s", type=float, default=ARTIFACT_START_S, help="seconds a (re)start costs (artifact: once)"
    )
    parser.add_argument("--max-sim-time-s", type=float, default=MAX_SIM_TIME_S)
    parser.add_argument("--allow-unsorted", action="store_true", help="accept submit times out of order")
    parser.add_argument(
        "--artifact-duplicates",
        action="store_true",
        help="a job name used again replaces the earlier job in its place, as the artifact's simulator does",
    )
    parser.add_argument(
        "--map-applications",
        action="store_true",
        help="map trace applications without a profile onto profiled ones (smoke scale; always for a generated one)",
    )


def parse_cluster(text: str) -> Cluster:
    counts = {}
    for item in text.split(","):
        name, separator, count = item.partition("=")
        if not separator or not name or not count.isdigit():
            raise UserError(f"--cluster: {item!r} is not TYPE=COUNT (e.g. v100=32)")
        if name in counts:
            raise UserError(f"--cluster: device type {name!r} given twice ({text!r})")
        counts[name] = int(count)
    return Cluster.of(counts)


def run(args: argparse.Namespace) -> None:
    from ddlrepro.host.simulator.engine import Timing, simulate, write_tables  # pandas: only when simulating

    cluster = parse_cluster(args.cluster)
    profiles = read_profiles(args.profiles)
    profiled = sorted(profiles.applications())
    mapped = args.map_applications or args.trace is None
    mapping = map_applications(list(ARTIFACT_APPLICATION_COUNTS), profiled) if mapped else None
    if args.trace is not None:
        jobs = read_trace(
            args.trace,
            profiles,
            cluster,
            mapping,
            allow_unsorted=args.allow_unsorted,
            artifact_duplicates=args.artifact_duplicates,
        )
    else:
        jobs = generate_trace(args.generate_seed, profiles, cluster, mapping)
    if mapping:
        print("applications mapped:", ", ".join(f"{a} → {b}" for a, b in mapping.items()))
    timing = Timing(args.round_s, args.restart, args.restart_s, args.max_sim_time_s)
    simulations = [simulate(jobs, cluster, profiles, policy, timing) for policy in args.policy]
    args.out.mkdir(parents=True, exist_ok=True)
    write_trace(jobs, args.out / "trace.csv")
    written = write_tables(simulations, args.out)
    for simulation in simulations:
        summary = simulation.summary()
        print(
            f"{simulation.policy}: mean JCT {summary['mean_jct_s']:.1f} s, makespan {summary['makespan_s']:.1f} s "
            f"(artifact's rounding {summary['makespan_artifact_s']:.0f} s)"
        )
    hosts = ", ".join(profiles.hosts)
    print(f"{len(jobs)} jobs on {cluster.label()}, profiles from {hosts}: {', '.join(map(str, written))}")
