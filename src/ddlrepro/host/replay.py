"""The real replay: a simulated policy's decisions, as stages (simulator.stages), run for real with the consistent
trainer, to hold the simulator against reality (issue 17, benchmarks/simulator_fidelity.py).

Each stage is one consistent-training run (D1, emulated device types, one process per device of `threads` threads)
of its job's model, continuing from the checkpoint of the job's previous stage. Stages start in simulated-time
order, each once the wall clock since the replay began reaches its simulated start and the stages it waits for
(its job's previous one, the last one on each of its devices) have ended: a run that takes longer than simulated
delays those after it, one that takes less leaves its devices idle until the next decision, as in the cluster.
A job's real completion is its last stage's end; its JCT that less its submit time. Since the replay waits for the
simulated starts, the JCT is mostly the simulation's own waiting: each job's busy time (its stages' durations, real
against simulated) is what holds the throughput model and the start-up cost against reality.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd

from ddlrepro.host.figures import device_types
from ddlrepro.host.launchers.base import Launcher
from ddlrepro.host.run import run_point
from ddlrepro.host.simulator.stages import ReplayError, Stage
from ddlrepro.host.simulator.traces import Job
from ddlrepro.points import Point

FIGURE = "simulator-replay"  # where the runs are filed: the replay is a benchmark, not a figure
POLL_S = 0.1  # how often a waiting stage looks whether another failed
RUN_COLUMNS = ["job", "stage", "placement", "steps", "simulated_start_s", "simulated_end_s", "start_s", "end_s"]


def typed_point(
    model: str,
    batch: int,
    processes: Sequence[tuple[int, str]],
    launcher_config: dict[str, Any],
    settings: Mapping[str, Any],
    **params: Any,
) -> Point:
    """A D1 consistent-training run of `model` with `processes` [(ESTs, device type)], one process each;
    `settings`: learning_rate, threads_per_worker."""
    counts, names = [ests for ests, _ in processes], [name for _, name in processes]
    section = {"model": model, "batch_size": batch, **settings}
    return device_types.typed_point(
        FIGURE, section, launcher_config, names, logical_workers=sum(counts), placement=counts, mode="D1", **params
    )


def stage_points(
    stages: Sequence[Stage], jobs: Sequence[Job], launcher_config: dict[str, Any], settings: Mapping[str, Any]
) -> dict[tuple[str, int], Point]:
    """Each stage's run, resuming from its job's previous stage (its run folder is a sibling of the others)."""
    by_id = {job.id: job for job in jobs}
    points: dict[tuple[str, int], Point] = {}
    for stage in stages:
        job = by_id[stage.job]
        previous = points[(stage.job, stage.index - 1)].id if stage.index else None
        points[(stage.job, stage.index)] = typed_point(
            job.application,
            job.batch,
            stage.processes,
            launcher_config,
            settings,
            steps=stage.steps,
            resume_from=previous,
            replay_job=stage.job,
            stage=stage.index,
        )
    return points


def execute(
    stages: Sequence[Stage], points: Mapping[tuple[str, int], Point], folder: Path, launcher: Launcher
) -> pd.DataFrame:
    """Run every stage (RUN_COLUMNS; start and end in seconds since the replay began); a failed run fails it, and
    the stages not yet started then stop waiting and start nothing."""
    if not stages:
        raise ReplayError("the plan has no stages: nothing to replay")
    origin, failed = time.monotonic(), threading.Event()
    futures: dict[tuple[str, int], Future[Any]] = {}
    # One thread per stage, not per device: a stage waiting for a late stage must not keep a ready one from starting.
    with ThreadPoolExecutor(max_workers=len(stages)) as pool:
        for stage in stages:
            waits = [futures[key] for key in stage.after]
            key = (stage.job, stage.index)
            futures[key] = pool.submit(_run_stage, stage, points[key], waits, origin, failed, folder, launcher)
        try:
            for future in as_completed(futures.values()):
                future.result()
        except BaseException:
            failed.set()
            pool.shutdown(cancel_futures=True)
            raise
    return pd.DataFrame([future.result() for future in futures.values()], columns=RUN_COLUMNS)


def _run_stage(
    stage: Stage,
    point: Point,
    waits: Sequence[Future[Any]],
    origin: float,
    failed: threading.Event,
    folder: Path,
    launcher: Launcher,
) -> tuple[Any, ...]:
    start = origin + stage.start_s
    while not all(waited.done() for waited in waits) or time.monotonic() < start:
        left = start - time.monotonic()
        if failed.wait(min(left, POLL_S) if left > 0 else POLL_S):
            raise ReplayError(f"stage {stage.index} of job {stage.job} not started: another stage failed")
    for waited in waits:
        waited.result()  # raises if a stage it waits for failed
    started = time.monotonic() - origin
    run_point(point, folder / point.id, launcher)
    ended = time.monotonic() - origin
    return (stage.job, stage.index, stage.placement, stage.steps, stage.start_s, stage.end_s, started, ended)


def concurrent_pairs(stages: Sequence[Stage]) -> list[tuple[str, str]]:
    """The pairs of jobs whose finishing order the replay leaves to the runs: their last stages overlap in simulated
    time and neither waits for the other, directly or through other stages."""
    waited: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for stage in stages:  # in start order: whatever a stage waits for came before it
        waited[(stage.job, stage.index)] = set(stage.after).union(*(waited[key] for key in stage.after))
    last = {stage.job: stage for stage in stages}
    pairs = []
    for first, second in itertools.combinations(last.values(), 2):
        one, other = (first.job, first.index), (second.job, second.index)
        overlap = max(first.start_s, second.start_s) < min(first.end_s, second.end_s)
        if overlap and one not in waited[other] and other not in waited[one]:
            pairs.append((first.job, second.job))
    return pairs


def completion_times(runs: pd.DataFrame, simulated: pd.DataFrame) -> pd.DataFrame:
    """Per job (simulated jobs table order): simulated and real finish and JCT, the relative JCT error, each job's
    busy time (its stages' durations summed) in both and its relative error, and each job's rank by finish in both."""
    real_finish = runs.groupby("job")["end_s"].max()
    durations = runs.assign(
        real=runs["end_s"] - runs["start_s"], simulated=runs["simulated_end_s"] - runs["simulated_start_s"]
    )
    busy = durations.groupby("job")[["real", "simulated"]].sum()
    table = simulated[["id", "submit_s", "finish_s", "jct_s"]].rename(
        columns={"finish_s": "simulated_finish_s", "jct_s": "simulated_jct_s"}
    )
    table["real_finish_s"] = table["id"].map(real_finish)
    table["real_jct_s"] = table["real_finish_s"] - table["submit_s"]
    table["jct_error"] = table["real_jct_s"] / table["simulated_jct_s"] - 1
    table["simulated_busy_s"] = table["id"].map(busy["simulated"])
    table["real_busy_s"] = table["id"].map(busy["real"])
    table["busy_error"] = table["real_busy_s"] / table["simulated_busy_s"] - 1
    table["simulated_rank"] = table["simulated_finish_s"].rank(method="first").astype(int)
    table["real_rank"] = table["real_finish_s"].rank(method="first").astype(int)
    return table.reset_index(drop=True)


def order_differences(times: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> int:
    """Of `pairs` (job ids), how many finish in the other order for real than simulated (times: completion_times)."""
    finish = times.set_index("id")
    return sum(
        (finish.loc[a, "real_finish_s"] < finish.loc[b, "real_finish_s"])
        != (finish.loc[a, "simulated_finish_s"] < finish.loc[b, "simulated_finish_s"])
        for a, b in pairs
    )
