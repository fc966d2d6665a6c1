"""The round loop: a policy decides every `round_s` seconds, jobs progress by the throughput model in between.

As the artifact (simulator/simulator.py `Cluster.step`, `Job.step`): active jobs are those submitted and not
finished, in trace order; a job finishes at the exact second its work is done, and its devices come free at the
next round; with `restart="artifact"` a job pays 20 s once, at its first start, holding its devices without
progress, and reallocations are free. Its JCT is finish − submit; its makespan was the start of the round in which
the last job finished (`makespan_artifact_s`). Ours: a decision at t = 0 as well (the artifact's first is at
`round_s`), `restart="measured"` (a given checkpoint + restore time paid at every start and reallocation), the
makespan as the last finish (`makespan_s`), and `max_sim_time_s`, past which unfinished jobs are an error.
Round k starts at k × round_s (never a running sum, which drifts). Besides the per-job and allocation tables, a
simulation lists every job's placement changes (`changes`): what the real replay runs (simulator/stages.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from ddlrepro.host.errors import UserError
from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.parsing import parse_number
from ddlrepro.host.simulator.placements import smallest, throughput
from ddlrepro.host.simulator.rules import ARTIFACT_START_S, MAX_ROUNDS, MAX_SIM_TIME_S, ROUND_S
from ddlrepro.host.simulator.schedulers import POLICIES, Policy
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job, TraceError

JOB_COLUMNS = [
    "policy",
    "id",
    "application",
    "trace_application",
    "max_parallelism",
    "preferred_type",
    "submit_s",
    "start_s",
    "finish_s",
    "jct_s",
    "reallocations",
]
ALLOCATION_COLUMNS = ["time_s", "policy", "device_type", "allocated"]
# A job's placement changes: its new placement (Placement.label(); "" = it gives its devices back) and the samples
# it had trained by then. A job that finishes gives its devices back at its finish_s (jobs table), not listed here.
CHANGE_COLUMNS = ["time_s", "policy", "id", "placement", "progress_samples"]
FLOAT_FORMAT = "%.3f"
ROUNDS_DIGITS = 9  # a time ÷ round_s is rounded to this many decimals before ceil/floor: 120.000000001 s is round 2


class SimulationError(UserError):
    """A simulation that cannot finish as asked."""


@dataclass
class JobState:
    job: Job
    placement: Placement | None = None
    start_s: float | None = None
    finish_s: float | None = None
    progress: float = 0.0
    restart_left_s: float = 0.0
    reallocations: int = 0


@dataclass
class Simulation:
    """The per-job table and the allocation-over-time table of one policy's run."""

    policy: str
    round_s: float
    jobs: pd.DataFrame
    allocations: pd.DataFrame
    changes: pd.DataFrame = dataclasses.field(default_factory=lambda: pd.DataFrame(columns=CHANGE_COLUMNS))

    def summary(self) -> dict[str, float]:
        """Mean JCT; makespan as the last finish and as the artifact printed it (its round's start)."""
        last = float(self.jobs["finish_s"].max())
        return {
            "mean_jct_s": float(self.jobs["jct_s"].mean()),
            "makespan_s": last,
            "makespan_artifact_s": (math.ceil(_in_rounds(last, self.round_s)) - 1) * self.round_s,
        }


def write_tables(simulations: Sequence[Simulation], folder: Path) -> tuple[Path, Path]:
    """jobs.csv and allocations.csv of one or more policies' runs, byte-identical for the same input."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in (
        ("jobs.csv", pd.concat([s.jobs for s in simulations])),
        ("allocations.csv", pd.concat([s.allocations for s in simulations])),
    ):
        table.to_csv(folder / name, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")
        written.append(folder / name)
    return written[0], written[1]


@dataclass(frozen=True)
class Timing:
    """How simulated time runs: a round every `round_s`; what a start or reallocation costs (`restart`: the
    artifact's whole rounds, or `restart_s` measured seconds); the simulation given up past `max_sim_time_s`."""

    round_s: float = ROUND_S
    restart: Literal["artifact", "measured"] = "artifact"
    restart_s: float = ARTIFACT_START_S
    max_sim_time_s: float = MAX_SIM_TIME_S


def simulate(
    jobs: Sequence[Job], cluster: Cluster, profiles: Profiles, policy: str, timing: Timing = Timing()
) -> Simulation:
    """Run `policy` over the jobs until all have finished (or raise past `timing.max_sim_time_s`)."""
    round_s, restart, restart_s = timing.round_s, timing.restart, timing.restart_s
    scheduler = _policy(policy)
    last_round = _last_round(round_s, restart, restart_s, timing.max_sim_time_s)
    validate(jobs, cluster, profiles, scheduler)
    states = [JobState(job) for job in jobs]
    rows: list[tuple[float, str, str, int]] = []
    changes: list[tuple[float, str, str, str, float]] = []
    for index in range(last_round + 1):
        if all(state.finish_s is not None for state in states):
            break
        now = index * round_s
        active = [s for s in states if s.finish_s is None and s.job.submit_s <= now]
        current = {s.job.id: s.placement for s in active if s.placement is not None}
        decided = scheduler.decide(now, cluster, [s.job for s in active], current, profiles)
        cluster.check(decided, now)
        for state in active:
            new = decided.get(state.job.id)
            if new != state.placement:
                changes.append((now, policy, state.job.id, new.label() if new else "", state.progress))
            _reallocate(state, new, now, restart, restart_s)
        rows += [(now, policy, t, n) for t, n in cluster.used(decided.values()).items()]
        for state in active:
            _advance(state, now, round_s, profiles)
    if any(state.finish_s is None for state in states):
        raise SimulationError(_unfinished(states, (last_round + 1) * round_s, timing.max_sim_time_s))
    return Simulation(
        policy,
        round_s,
        _job_table(policy, states),
        pd.DataFrame(rows, columns=ALLOCATION_COLUMNS),
        pd.DataFrame(changes, columns=CHANGE_COLUMNS),
    )


def _in_rounds(seconds: float, round_s: float) -> float:
    return round(seconds / round_s, ROUNDS_DIGITS)


def _last_round(round_s: float, restart: str, restart_s: float, max_sim_time_s: float) -> int:
    """The index of the last round that starts by `max_sim_time_s`, once the settings are checked."""
    if restart not in ("artifact", "measured"):
        raise SimulationError(f"restart: {restart!r} is neither 'artifact' nor 'measured'")
    parse_number(round_s, "round_s", SimulationError, minimum=0, above=True)
    parse_number(restart_s, "restart_s", SimulationError, minimum=0)
    parse_number(max_sim_time_s, "max_sim_time_s", SimulationError, minimum=0, above=True)
    rounds = _in_rounds(max_sim_time_s, round_s)
    if rounds > MAX_ROUNDS:
        raise SimulationError(
            f"max_sim_time_s {max_sim_time_s:g} ÷ round_s {round_s:g} is {rounds:.3g} rounds, more than {MAX_ROUNDS:g}"
        )
    return math.floor(rounds)


def _policy(name: str) -> Policy:
    if name not in POLICIES:
        raise SimulationError(f"unknown policy {name!r}; known: {sorted(POLICIES)}")
    return POLICIES[name]


def validate(jobs: Sequence[Job], cluster: Cluster, profiles: Profiles, policy: Policy) -> None:
    """What would make a job wait forever or a lookup fail, named by its row and field, before anything runs."""
    if not jobs:
        raise SimulationError(f"no jobs to simulate ({policy.name} was given an empty trace)")
    for job in jobs:
        where = f"trace row {job.row} (job {job.id})"
        if job.preferred_type not in cluster.types:
            raise TraceError(
                f"{where}, field preferred_gpu: {job.preferred_type!r} is not a device type of {list(cluster.types)}"
            )
        if job.preferred_type not in profiles.device_types(job.application):
            raise TraceError(
                f"{where}, field preferred_gpu: {job.application!r} is not profiled on {job.preferred_type!r}"
            )
        types = _types_profiled_at_batch(job, cluster, profiles, policy, where)
        if policy.gang:
            _check_gang(job, cluster, profiles, policy, where)
        else:
            _check_fits(job, types, cluster, profiles, policy, where)


def _types_profiled_at_batch(job: Job, cluster: Cluster, profiles: Profiles, policy: Policy, where: str) -> list[str]:
    """The allowed types whose profile covers the job's batch; none is an error naming each type's range."""
    allowed = policy.allowed_types(job, cluster)
    types = [t for t in allowed if profiles.ests_range(job.application, t, job.batch) is not None]
    if not types:
        ranges = [(t, profiles.batch_range(job.application, t)) for t in allowed]
        measured = "; ".join(f"{t} {span[0]}–{span[1]}" if span else f"{t} not profiled" for t, span in ranges)
        raise TraceError(
            f"{where}, field batch_size: {job.batch} is outside {job.application!r}'s profiled batches on every "
            f"type {policy.name} allows it ({measured})"
        )
    return types


def _check_gang(job: Job, cluster: Cluster, profiles: Profiles, policy: Policy, where: str) -> None:
    """A gang runs one EST on each of max_parallelism devices of the preferred type."""
    span = profiles.ests_range(job.application, job.preferred_type, job.batch)
    if span is not None and span[0] > 1:
        raise TraceError(
            f"{where}, field batch_size: {job.application!r} on {job.preferred_type!r} at batch_per_est {job.batch} "
            f"is profiled for {span[0]}–{span[1]} ESTs per device; a gang ({policy.name}) runs 1 per device"
        )
    if job.max_parallelism > cluster.size(job.preferred_type):
        raise TraceError(
            f"{where}, field max_parallelism: a gang of {job.max_parallelism} is larger than the cluster's "
            f"{cluster.size(job.preferred_type)} {job.preferred_type} ({policy.name} cannot start it)"
        )


def _check_fits(
    job: Job, types: Sequence[str], cluster: Cluster, profiles: Profiles, policy: Policy, where: str
) -> None:
    """An elastic job starts on the fewest devices of one type that hold its ESTs: some allowed type must have them."""
    needs = {t: smallest(job, t, cluster, profiles) for t in types}
    if not any(start is not None and start.devices <= cluster.size(t) for t, start in needs.items()):
        shown = "; ".join(
            f"{t} needs {start.devices} (has {cluster.size(t)})" for t, start in needs.items() if start is not None
        )
        raise TraceError(
            f"{where}, field max_parallelism: {job.max_parallelism} ESTs fit on no device type {policy.name} allows "
            f"it, at the ESTs per device profiled: {shown}"
        )


def _reallocate(state: JobState, placement: Placement | None, now: float, restart: str, restart_s: float) -> None:
    if placement == state.placement:
        return
    if placement is not None:
        first = state.start_s is None
        if first:
            state.start_s = now
        else:
            state.reallocations += 1
        if restart == "measured" or first:
            state.restart_left_s = restart_s
    state.placement = placement


def _advance(state: JobState, now: float, round_s: float, profiles: Profiles) -> None:
    """Progress over one round: the restart still owed first, then training at the placement's throughput."""
    if state.placement is None:
        return
    paid = min(state.restart_left_s, round_s)
    state.restart_left_s -= paid
    training_s = round_s - paid
    if training_s <= 0:
        return
    rate = throughput(state.job, state.placement, profiles)
    remaining = state.job.work_samples - state.progress
    if remaining <= rate * training_s:
        state.finish_s = now + paid + remaining / rate
        state.progress = state.job.work_samples
        state.placement = None
    else:
        state.progress += rate * training_s


def _unfinished(states: Sequence[JobState], now: float, limit: float) -> str:
    lines = [
        f"  {s.job.id} (row {s.job.row}, submitted at {s.job.submit_s:g} s, "
        + (f"running on {s.placement.label()}, " if s.placement else "waiting, ")
        + f"{s.progress / s.job.work_samples:.0%} done)"
        for s in states
        if s.finish_s is None
    ]
    return f"jobs not finished at max_sim_time_s={limit:g} (t={now:.0f} s):\n" + "\n".join(lines)


def _job_table(policy: str, states: Sequence[JobState]) -> pd.DataFrame:
    rows = [
        {
            "policy": policy,
            "id": s.job.id,
            "application": s.job.application,
            "trace_application": s.job.trace_application,
            "max_parallelism": s.job.max_parallelism,
            "preferred_type": s.job.preferred_type,
            "submit_s": s.job.submit_s,
            "start_s": s.start_s,
            "finish_s": s.finish_s,
            "jct_s": s.finish_s - s.job.submit_s if s.finish_s is not None else None,
            "reallocations": s.reallocations,
        }
        for s in states
    ]
    return pd.DataFrame(rows, columns=JOB_COLUMNS)
