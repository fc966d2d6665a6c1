"""A policy's decisions as stages to run for real (the real replay, `ddlrepro.host.replay`, runs them).

From a simulation's placement changes (engine.CHANGE_COLUMNS) and its jobs' finish times: each job becomes a
sequence of stages, one per placement it was given, each running the global steps the simulation trained in it
(the samples trained by the next change or the finish ÷ the global batch, rounded on the running total so the
stages sum to the job's steps) and continuing from the previous stage's checkpoint. A stage in which the
simulation trained nothing (a placement taken back within its restart) runs nothing.

Devices get names (`fast-0`, `slow-0`, ...): at each decision, finished jobs and jobs that shrink or move give
theirs back before any job takes one; a job keeps the devices of a type it still uses and takes the rest in name
order. A stage waits for its job's previous stage and for the last stage that used each of its devices: stages of
jobs sharing no device may run at once. Each device runs one process, with the ESTs `Placement.processes` gives it
(the throughput model charges the same).
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ddlrepro.host.errors import UserError
from ddlrepro.host.simulator.cluster import Cluster, OverFilled, Placement
from ddlrepro.host.simulator.traces import Job


class ReplayError(UserError):
    """Decisions that cannot be replayed as stages."""


@dataclass(frozen=True)
class Stage:
    """Stage `index` (0 first) of `job`: one process per device, `processes[i]` (ESTs, device type) on `devices[i]`,
    for `steps` global steps from simulated `start_s` to `end_s` (its `placement` label's); `after`: the (job,
    stage) pairs that must end before it starts."""

    job: str
    index: int
    start_s: float
    end_s: float
    placement: str
    processes: tuple[tuple[int, str], ...]
    devices: tuple[str, ...]
    steps: int
    after: tuple[tuple[str, int], ...]


def steps_job(
    name: str, submit_s: float, application: str, ests: int, batch: int, steps: int, preferred: str, row: int = 1
) -> Job:
    """A heterogeneous job of `steps` global steps (a whole number of them, as `plan` needs)."""
    return Job(
        id=name,
        row=row,
        submit_s=submit_s,
        application=application,
        trace_application=application,
        max_parallelism=ests,
        batch=batch,
        epochs=1,
        heterogeneous=True,
        preferred_type=preferred,
        work_samples=steps * batch * ests,
    )


def plan(changes: pd.DataFrame, finish_s: Mapping[str, float], jobs: Sequence[Job], cluster: Cluster) -> list[Stage]:
    """The stages of every job, in simulated start order (changes: one policy's rows, CHANGE_COLUMNS)."""
    by_id = {job.id: job for job in jobs}
    _check(changes, finish_s, by_id)
    holding: dict[str, list[str]] = {}  # job → the devices it holds now
    last_user: dict[str, tuple[str, int]] = {}  # device → the last stage that ran on it
    last_stage: dict[str, int] = {}  # job → its last stage's index
    stages: list[Stage] = []
    rows = changes.sort_values("time_s", kind="stable").to_dict("records")
    for now, group in itertools.groupby(rows, key=lambda row: float(row["time_s"])):
        decided = {row["id"]: row for row in group}
        for finished in [job for job in holding if finish_s[job] <= now]:
            del holding[finished]
        new = {
            job: Placement.from_label(row["placement"]) if row["placement"] else None for job, row in decided.items()
        }
        for job, placement in new.items():
            kept = _keep(holding.pop(job, []), placement)
            if kept:
                holding[job] = kept
        for job, placement in new.items():
            devices = _take(job, placement, holding, cluster, now)
            if placement is None:
                continue
            row, spec = decided[job], by_id[job]
            end, done = _stage_end(row, rows, spec, finish_s)
            steps = _steps(done, spec) - _steps(float(row["progress_samples"]), spec)
            if steps == 0:
                continue
            index = last_stage.get(job, -1) + 1
            after = {last_user[device] for device in devices if device in last_user}
            after |= {(job, index - 1)} if index else set()
            stage = Stage(
                job,
                index,
                now,
                end,
                row["placement"],
                _processes(placement, spec),
                devices,
                steps,
                tuple(sorted(after)),
            )
            stages.append(stage)
            last_stage[job] = index
            last_user |= dict.fromkeys(devices, (job, index))
    return stages


def _check(changes: pd.DataFrame, finish_s: Mapping[str, float], jobs: Mapping[str, Job]) -> None:
    """Every row's fields (errors name the row, 1 = the first, and the field), before anything is planned."""
    if changes.empty:
        raise ReplayError("placement changes: no rows, nothing to replay")
    if changes["policy"].nunique() > 1:
        raise ReplayError(f"placement changes of several policies ({sorted(changes['policy'].unique())}): give one's")
    seen: set[tuple[float, str]] = set()
    for row, record in enumerate(changes.to_dict("records"), start=1):
        where = f"placement changes row {row}, field"
        job = jobs.get(record["id"])
        if job is None or record["id"] not in finish_s:
            raise ReplayError(f"{where} id: no job {record['id']!r} with a finish time")
        time_s = record["time_s"]
        if not isinstance(time_s, numbers.Real) or not 0 <= float(time_s) < float("inf"):
            raise ReplayError(f"{where} time_s: {time_s!r} is not a time ≥ 0 s")
        if (float(time_s), job.id) in seen:
            raise ReplayError(f"{where} time_s: a second change of job {job.id} at {time_s:g} s")
        seen.add((float(time_s), job.id))
        if record["placement"]:
            try:
                Placement.from_label(record["placement"])
            except UserError as error:
                raise ReplayError(f"{where} placement: {error}") from None
        progress = record["progress_samples"]
        if not isinstance(progress, numbers.Real) or not 0 <= float(progress) <= job.work_samples:
            raise ReplayError(f"{where} progress_samples: {progress!r} is not within [0, {job.work_samples:g}]")
    for job in jobs.values():
        global_batch = job.batch * job.max_parallelism
        if job.work_samples % global_batch:
            raise ReplayError(
                f"job {job.id}: its work, {job.work_samples:g} samples, is not a whole number of global steps of "
                f"{global_batch} samples"
            )


def _stage_end(
    row: dict[str, Any], rows: list[dict[str, Any]], job: Job, finish_s: Mapping[str, float]
) -> tuple[float, float]:
    """Simulated time and samples trained when the stage that `row` starts ends: the job's next change, or its
    finish."""
    later = [r for r in rows if r["id"] == job.id and r["time_s"] > row["time_s"]]
    if later:
        return float(later[0]["time_s"]), float(later[0]["progress_samples"])
    return float(finish_s[job.id]), job.work_samples


def _steps(samples: float, job: Job) -> int:
    return round(samples / (job.batch * job.max_parallelism))


def _keep(held: list[str], placement: Placement | None) -> list[str]:
    """The devices a job keeps under its new placement: as many of each type it held as it still uses."""
    kept: list[str] = []
    for share in placement.shares if placement else ():
        kept += [device for device in held if _type(device) == share.device_type][: share.devices]
    return kept


def _take(
    job: str, placement: Placement | None, holding: dict[str, list[str]], cluster: Cluster, now: float
) -> tuple[str, ...]:
    """The devices `job` runs on under `placement` (once every job deciding now gave back what it no longer uses):
    those it kept, the missing ones taken free in name order."""
    kept = holding.pop(job, [])
    taken = {device for devices in holding.values() for device in devices} | set(kept)
    chosen: list[str] = []
    for share in placement.shares if placement else ():
        mine = [device for device in kept if _type(device) == share.device_type]
        names = (f"{share.device_type}-{index}" for index in range(cluster.size(share.device_type)))
        free = [name for name in names if name not in taken]
        missing = share.devices - len(mine)
        if missing > len(free):
            raise ReplayError(
                f"t={now:g} s: job {job} needs {share.devices} {share.device_type}, only {len(mine) + len(free)} free"
            )
        chosen += mine + free[:missing]
        taken |= set(free[:missing])
    if chosen:
        holding[job] = chosen
    return tuple(chosen)


def _type(device: str) -> str:
    return device.rsplit("-", 1)[0]


def _processes(placement: Placement, job: Job) -> tuple[tuple[int, str], ...]:
    try:
        return placement.processes(job.max_parallelism)
    except OverFilled as error:
        raise ReplayError(f"job {job.id}: {error}") from None
