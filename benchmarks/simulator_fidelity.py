"""The scheduler simulator (issue 17, `ddlrepro.host.simulator`): the artifact-sized trace (its 68 rows'
statistics, seeded) under all four policies on its cluster (32 V100 + 16 P100 + 16 T4) within 10 s; the same bytes
of jobs.csv, allocations.csv and trace.csv from `ddlrepro simulate` run in two processes with other hash seeds
(PYTHONHASHSEED 1 and 2); the order of the policies' mean JCT (the issue's check: heter < homo < YARN-CS, a target)
and of their makespans (recorded: 1 when heter < homo < YARN-CS holds, 0 when not). Those run on SYNTHETIC profiles
(the artifact's eight applications on V100 / P100 / T4 at its batches, 1–32 ESTs per device, step times
proportional to the batch; labelled `synthetic`).

Then, for real on this machine (device types emulated on CPU; leave out with --no-real; quiet machine only):

1. Profiles: easyscale-fig14's profile runs, resnet20 at batch 8 per EST, two processes of each type (fast, slow)
   each holding 1 and 2 ESTs (the config's devices_per_profile: a profiled step includes the all-reduce and a busy
   neighbour device); and the start-up of a one-device run of each type (as every replayed stage is): its wall time
   less its steps at its own median step time.
2. The throughput model: real consistent-training runs (D1, one process per device, the profiles' thread count) on
   six placements of two processes, none a profile run (so each error is the model's, plus run-to-run noise), mixed
   types and 2 ESTs per device among them; samples/s predicted by `Profiles.throughput` from the profiles against
   measured (batch × ESTs ÷ the median over steps of the slowest process's step time).
3. The real replay (`ddlrepro.host.replay`): 4 small jobs (their work set in seconds, turned into steps on those
   profiles) on one fast and one slow device, easyscale-heter's decisions from a simulation on those profiles (10 s
   rounds; every start and reallocation costs the measured start-up), each job run as checkpoint-to-checkpoint
   stages in simulated-time order. Per job: JCT (mostly the simulated waiting, which the replay keeps) and busy
   time (its stages' run times: what the model predicts), real against simulated; the jobs reallocated (≥ 1, or
   the checkpoint path went untested); and the pairs of jobs whose last stages overlap and wait for neither other,
   whose finishing order is the runs' to decide (≥ 1), and how many of them finish in the other order than
   simulated. A benchmark, not a figure: it takes a few minutes of real
   time, more than `make reproduce` has to spare.

    python benchmarks/simulator_fidelity.py [--seed 0] [--steps 24] [--no-real]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from _common import REPO, BenchmarkRecord

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import device_types, easyscale_fig14
from ddlrepro.host.figures.step_timing import median_step_time, timed_steps
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.replay import (
    completion_times,
    concurrent_pairs,
    execute,
    order_differences,
    stage_points,
    typed_point,
)
from ddlrepro.host.run import run_point
from ddlrepro.host.simulator.cluster import ARTIFACT_CLUSTER, Cluster, Placement, Share
from ddlrepro.host.simulator.engine import Simulation, Timing, simulate
from ddlrepro.host.simulator.schedulers import POLICIES
from ddlrepro.host.simulator.stages import plan, steps_job
from ddlrepro.host.simulator.step_profiles import Profiles, from_table
from ddlrepro.host.simulator.traces import ARTIFACT_APPLICATION_COUNTS, generate_trace
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point

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


MODEL, BATCH, THREADS = "resnet20", 8, 1
PROFILE_ESTS = [1, 2]
# None a profile run (devices_per_profile processes of one type, equal ESTs), so no error below is a profile read
# back: each is the model's plus run-to-run noise. [2, fast] + [1, fast] is predicted by the fast type's 2-EST profile
# alone: its error is what a neighbour that idles part of each step changes.
FIDELITY_PLACEMENTS = [
    [(2, "fast"), (1, "fast")],
    [(1, "fast"), (1, "slow")],
    [(1, "fast"), (2, "slow")],
    [(2, "fast"), (1, "slow")],
    [(2, "fast"), (2, "slow")],
    [(2, "slow"), (1, "slow")],
]
SLOTS = {"fast": 1, "slow": 1}
REPLAY_POLICY, REPLAY_ROUND_S = "easyscale-heter", 10.0
# (id, submit s, ESTs, seconds of steps on one device of a type, that type, preferred type): j1 holds the fast
# device; j2 starts on the slow one at the first round after its submission and stays there; j3 takes the fast device
# when j1 finishes; j4 starts on the slow one when j2 finishes and is reallocated to fast when j3 finishes. j2's last
# stage overlaps j1's and j3's, waiting for neither: which of each pair finishes first is up to the runs (simulated:
# j1, then j3). The work is set in seconds on the device each job mostly runs on, turned into steps on the session's
# profiles, so that the plan keeps this shape against the 10 s rounds on a faster or slower machine (as fixed steps,
# the jobs lasted 35-68 s on 2026-11-24 and 7-20 s on the machine of 2026-11-27, and the plan lost its free pairs).
REPLAY_JOBS = [
    ("j1", 0, 2, 53.0, "fast", "fast"),
    ("j2", 5, 1, 57.0, "slow", "fast"),
    ("j3", 35, 1, 16.0, "fast", "slow"),
    ("j4", 38, 1, 13.5, "fast", "fast"),
]


def run_timed(points: list[Point], folder: Path) -> tuple[pd.DataFrame, dict[str, float]]:
    """Run the points one after another: their tidy table and each run's wall time."""
    walls = {}
    for point in points:
        started = time.perf_counter()
        run_point(point, folder / point.id, local_launcher(900))
        walls[point.id] = time.perf_counter() - started
    return tidy_table([folder / point.id for point in points]), walls


def run_step_times(points: list[Point], folder: Path, warmup_steps: int) -> tuple[pd.Series, dict[str, float]]:
    """Run the points one after another: each one's median step time after the warm-up (its slowest process's) by
    point id, and each run's wall time."""
    table, walls = run_timed(points, folder)
    steps = median_step_time(timed_steps(table, warmup_steps), by="point_id").set_index("point_id")["step_time_s"]
    return steps, walls


def measure_profiles(launcher: dict, section: dict, folder: Path) -> tuple[Profiles, str]:
    """easyscale-fig14's profile runs of MODEL: the profiles and the CPU quota's status."""
    section = {
        **section,
        "models": [MODEL],
        "batches_per_est": [BATCH],
        "ests_per_device": PROFILE_ESTS,
        "device_types": list(SLOTS),
        "threads_per_worker": THREADS,
    }
    table, _ = run_timed(easyscale_fig14.points(section, launcher), folder)
    quota = device_types.quota_status(table)
    rows = easyscale_fig14.profile_table(table, f"this machine; {easyscale_fig14.EMULATED}, CPU quota {quota}")
    return from_table(rows, "profile runs"), quota


def one_device_startup(launcher: dict, settings: dict, folder: Path) -> float:
    """The start-up of a one-device run, as every replayed stage is: one median over a run of each type, of its wall
    time less its steps at its own median step time."""
    points = [
        typed_point(MODEL, BATCH, [(1, name)], launcher, settings, steps=settings["steps"], run="startup")
        for name in SLOTS
    ]
    step_s, walls = run_step_times(points, folder, settings["warmup_steps"])
    return statistics.median(walls[p.id] - p.params["steps"] * step_s[p.id] for p in points)


def model_placement(processes: list[tuple[int, str]]) -> Placement:
    """The simulator's placement of one process per device: per type, its devices and its most ESTs per device."""
    types = list(dict.fromkeys(name for _, name in processes))
    return Placement(
        tuple(
            Share(t, sum(name == t for _, name in processes), max(k for k, name in processes if name == t))
            for t in types
        )
    )


def throughput_fidelity(profiles: Profiles, devices: int, launcher: dict, settings: dict, folder: Path) -> pd.DataFrame:
    """Per placement: predicted and measured samples/s, and the relative error of the prediction (the profiles'
    runs: `devices` processes each)."""
    profiled = [[(ests, name)] * devices for ests in PROFILE_ESTS for name in SLOTS]
    assert not any(placement in profiled for placement in FIDELITY_PLACEMENTS), "a placement is a profile run"
    points = [
        typed_point(MODEL, BATCH, placement, launcher, settings, steps=settings["steps"], run="throughput-fidelity")
        for placement in FIDELITY_PLACEMENTS
    ]
    steps, _ = run_step_times(points, folder, settings["warmup_steps"])
    rows = []
    for placement, point in zip(FIDELITY_PLACEMENTS, points, strict=True):
        ests = sum(k for k, _ in placement)
        predicted = profiles.throughput(MODEL, BATCH, ests, model_placement(placement))
        measured = BATCH * ests / float(steps[point.id])
        label = " + ".join(f"[{k}, {name}]" for k, name in placement)
        slug = "-".join(f"{k}{name}" for k, name in placement)
        rows.append((label, slug, ests, predicted, measured, predicted / measured - 1))
    return pd.DataFrame(rows, columns=["placement", "slug", "ests", "predicted_per_s", "measured_per_s", "error"])


def replay_steps(profiles: Profiles, ests: int, seconds: float, device_type: str) -> int:
    """The global steps that take `seconds` with all `ests` ESTs on one device of `device_type`, on `profiles`."""
    step_s = profiles.global_step_s(MODEL, BATCH, ests, model_placement([(ests, device_type)]))
    return max(1, round(seconds / step_s))


def replay(
    profiles: Profiles, startup_s: float, launcher: dict, settings: dict, folder: Path
) -> tuple[pd.DataFrame, list[tuple[str, str]], int]:
    """REPLAY_JOBS under REPLAY_POLICY, simulated on the profiles and replayed for real: completion_times' table,
    the pairs of jobs whose finishing order the runs decide, and the number of jobs reallocated (≥ 2 stages)."""
    jobs = [
        steps_job(name, submit, MODEL, ests, BATCH, replay_steps(profiles, ests, seconds, on), preferred, row)
        for row, (name, submit, ests, seconds, on, preferred) in enumerate(REPLAY_JOBS, start=1)
    ]
    cluster = Cluster.of(SLOTS)
    simulation = simulate(jobs, cluster, profiles, REPLAY_POLICY, Timing(REPLAY_ROUND_S, "measured", startup_s))
    stages = plan(simulation.changes, simulation.jobs.set_index("id")["finish_s"], jobs, cluster)
    runs = execute(stages, stage_points(stages, jobs, launcher, settings), folder, local_launcher(900))
    print(runs.to_string(index=False, float_format="%.2f"))
    reallocated = sum(count >= 2 for count in collections.Counter(stage.job for stage in stages).values())
    return completion_times(runs, simulation.jobs), concurrent_pairs(stages), reallocated


def measure_real(args: argparse.Namespace, record: BenchmarkRecord, folder: Path) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    launcher, section = config["launcher"], config["figures"]["easyscale-fig14"]
    settings = {"learning_rate": section["learning_rate"], "threads_per_worker": THREADS}
    timing = {**settings, "steps": args.steps, "warmup_steps": args.warmup_steps}
    with ForeignLoadMeter() as meter:
        section = {**section, "steps": args.steps, "warmup_steps": args.warmup_steps}
        profiles, quota = measure_profiles(launcher, section, folder / "profiles")
        startup_s = one_device_startup(launcher, timing, folder / "startup")
    print(f"profiles ({MODEL}, batch {BATCH}; CPU quota {quota}): start-up of a one-device run {startup_s:.2f} s")
    what = "start-up of a one-device consistent-training run (wall − steps × its median step)"
    record.add("run-startup", what, startup_s, "s", meter.load)
    with ForeignLoadMeter() as meter:
        fidelity = throughput_fidelity(profiles, section["devices_per_profile"], launcher, timing, folder / "fidelity")
    print(fidelity.drop(columns="slug").to_string(index=False, float_format="%.3f"))
    for row in fidelity.itertuples():
        what = f"throughput model error on {row.placement} (predicted ÷ measured − 1)"
        record.add(f"throughput-error-{row.slug}", what, 100 * row.error, "%", meter.load)
    what = f"median |error| of the throughput model over {len(fidelity)} placements"
    record.add("throughput-median-error", what, 100 * fidelity["error"].abs().median(), "%", meter.load)
    with ForeignLoadMeter() as meter:
        times, pairs, reallocated = replay(profiles, startup_s, launcher, settings, folder / "replay")
    print(times.to_string(index=False, float_format="%.2f"))
    print(f"jobs reallocated: {reallocated}; pairs finishing in an order the runs decide: {pairs}")
    for row in times.itertuples():
        record.add(f"replay-jct-{row.id}", f"real replay: {row.id}'s JCT", row.real_jct_s, "s", meter.load)
        record.add(f"simulated-jct-{row.id}", f"simulation: {row.id}'s JCT", row.simulated_jct_s, "s", meter.load)
        what = f"real replay: {row.id}'s busy time (its stages' durations) ÷ simulated − 1"
        record.add(f"replay-busy-error-{row.id}", what, 100 * row.busy_error, "%", meter.load)
    what = "real replay: the largest |real ÷ simulated JCT − 1| over its jobs"
    record.add("replay-max-jct-error", what, 100 * times["jct_error"].abs().max(), "%", meter.load)
    what = "real replay: the largest |real ÷ simulated busy time − 1| over its jobs"
    record.add("replay-max-busy-error", what, 100 * times["busy_error"].abs().max(), "%", meter.load)
    what = "real replay: jobs reallocated (run in ≥ 2 stages, checkpoint to restore)"
    record.add("replay-reallocations", what, reallocated, "", meter.load)
    what = "real replay: pairs of jobs whose last stages overlap and wait for neither other (their order is free)"
    record.add("replay-free-pairs", what, len(pairs), "", meter.load)
    what = "real replay: of those pairs, the ones finishing in the other order than simulated"
    record.add("replay-order-differences", what, order_differences(times, pairs), "", meter.load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=24, help="steps of each profile and throughput run")
    parser.add_argument("--warmup-steps", type=int, default=4, help="of which not timed")
    parser.add_argument("--no-real", action="store_true", help="leave out the real runs (their targets: skipped)")
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
        if not args.no_real:
            measure_real(args, record, Path(scratch))


if __name__ == "__main__":
    main()
