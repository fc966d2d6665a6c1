"""Run one point: set aside any earlier attempt, render and save the job, run it, file its output, then
write `result.json` last. A failed run keeps its logs and never gets a `result.json`. A point this machine
cannot run (NCCL without CUDA) is not started: its `result.json` says `skipped` and why.

Every attempt writes `attempt.json` (its number, outcome, wall time, error, the last `steps_done` its ranks
recorded). The attempt number is Snakemake's (`--attempt`: 1, then 2 on its first retry), never guessed from the
folder: a forced rerun, or a rerun after a killed workflow, is attempt 1 again whatever earlier runs left, so it
injects its faults as the first run did. A retry finds its own failed attempts under `attempts/` (the newest
`attempt - 1` folders, each a failed attempt of this code numbered in turn) and records them in its `result.json`
(`attempts`, which the tidy table turns into rows: tables.py); a point whose workload can resume (the `ps`
workload with `checkpoint_interval`) gets its attempt number and the last failed attempt's `checkpoint/` folder as
inputs (`attempt`, `resume_checkpoint`)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ddlrepro.host import environments, leftovers
from ddlrepro.host.hostload import ForeignLoadMeter, machine_speed
from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers import configured_launcher
from ddlrepro.host.launchers.base import Launcher, RunFailed
from ddlrepro.host.objectstore import data_inputs, s3fs_unavailable_reason
from ddlrepro.host.provenance import git_state, run_provenance
from ddlrepro.host.rundir import (
    ATTEMPT,
    METRICS,
    RESULT,
    OutputCollector,
    metric_records,
    result_record,
    set_aside_previous_attempt,
    write_json_atomic,
)
from ddlrepro.host.testbed.limits import unavailable_reason as testbed_unavailable_reason
from ddlrepro.points import Point
from ddlrepro.records import CHECKPOINT_DIR

RESUMABLE_WORKLOADS = {"ps"}  # workloads that resume from their own checkpoint/ (with `checkpoint_interval`)


def unmet_requirement(point: Point, launcher: str = "local", in_image: bool = False) -> str | None:
    """Why this machine cannot run `point`, or None: NCCL needs CUDA; a point on testbed hosts needs the local
    launcher, which makes them, its ranks on the hosts themselves (not in the training image), and root for
    network namespaces; a Horovod point needs the project's Horovod build in this environment."""
    launch = launch_of(point)
    if launch.testbed:
        if launcher != "local":
            return f"skipped: runs on testbed hosts, which the local launcher makes, not the {launcher} launcher"
        if in_image:
            return "skipped: runs its ranks on testbed hosts, not in the training image (images.build)"
        reason = testbed_unavailable_reason()
        if reason:
            return f"skipped: {reason}"
    reason = data_source_unavailable_reason(point, launcher)
    if reason:
        return f"skipped: {reason}"
    if launch.horovod_build and not in_image and not horovod_importable():
        return f"skipped: {HOROVOD_MISSING}"
    if launch.nccl:
        return nccl_unmet_requirement(point, launcher)
    return None


HOROVOD_MISSING = (
    "needs the project's Horovod build, not installed here (`make horovod`; scripts/horovod builds it where cmake,"
    " g++ and Open MPI are installed, or as root)"
)


def horovod_importable() -> bool:
    """Whether this environment has Horovod (its ranks run this `python`): found, without importing it (seconds)."""
    try:
        return importlib.util.find_spec("horovod") is not None
    except ModuleNotFoundError:  # a finder that refuses it
        return False


def nccl_unmet_requirement(point: Point, launcher: str) -> str | None:
    """NCCL needs CUDA, and a GPU for each rank on a host: the local launcher puts every rank on this one."""
    from ddlrepro.rank.runtime import cuda_device_count

    gpus = cuda_device_count()
    if gpus == 0:
        return "skipped: needs CUDA"
    if launcher == "local" and point.workers > gpus:
        return f"skipped: needs a GPU per NCCL rank, {point.workers} ranks on this host, which has {gpus} GPU(s)"
    return None


def data_source_unavailable_reason(point: Point, launcher: str) -> str | None:
    """Why the point's data source cannot be read here: the store started for a run and the s3fs mount are on
    this host (127.0.0.1), which only the local launcher's ranks share; s3fs needs FUSE and root."""
    source = launch_of(point).data_source
    if source not in ("s3", "s3fs"):
        return None
    if launcher != "local" and (source == "s3fs" or not point.inputs.get("store_endpoint")):
        return f"the {source} data source is served on this host (127.0.0.1): the local launcher's ranks only"
    return s3fs_unavailable_reason() if source == "s3fs" else None


def measured_host_load(meter: ForeignLoadMeter | None, source: str, speeds: list[float]) -> dict[str, Any]:
    """The `host_load` entry of result.json: foreign and steal CPU shares while the run measured, and the
    machine-speed index just before and just after it (hostload.machine_speed)."""
    if meter is None or meter.load is None:
        return {"own_cpu": source, "foreign_share": None, "steal_share": None}
    speed_before, speed_after = speeds
    return meter.load.to_dict() | {"own_cpu": source, "speed_before": speed_before, "speed_after": speed_after}


def skip_point(point: Point, run_dir: Path, reason: str) -> dict[str, Any]:
    """Record that `point` was not run here, and why (provenance of the machine that decided it)."""
    now = time.time()
    write_json_atomic(run_dir / "provenance.json", run_provenance(asdict(point), {}, {}))
    record = result_record(point, {}, now, now) | {"status": "skipped", "reason": reason}
    write_json_atomic(run_dir / RESULT, record)
    return record


def run_point(
    point: Point,
    run_dir: Path,
    launcher: Launcher | None = None,
    image: dict[str, Any] | None = None,
    attempt: int = 1,
) -> dict[str, Any]:
    """Run `point` into `run_dir` with `launcher` (default: the local launcher as the schema configures it) and
    return its result record; raise RunFailed if any rank fails. `image`: the built image's reference and digest,
    recorded in the provenance; `attempt`: Snakemake's attempt number of this job."""
    launcher = launcher or configured_launcher()
    run_dir.mkdir(parents=True, exist_ok=True)
    set_aside_previous_attempt(run_dir)
    reason = unmet_requirement(point, launcher.name, in_image=image is not None)
    reason = reason or environments.unavailable_reason(point, launcher.name)
    if reason:
        return skip_point(point, run_dir, reason)
    leftovers.sweep()  # what SIGKILLed runs left on this host (their stores, mounts, quota groups)
    code = git_state()  # once per run: the series an attempt continues is this code's
    earlier = earlier_attempts(run_dir, code, attempt)
    started = time.time()
    try:
        record = run_attempt(point, run_dir, launcher, image, earlier)
    except BaseException as error:
        write_attempt(run_dir, attempt, started, "failed", str(error), code)
        raise
    this = write_attempt(run_dir, attempt, started, "ok", "", code)
    record |= {"attempts": [*earlier, this]}
    write_json_atomic(run_dir / RESULT, record)
    return record


def run_attempt(
    point: Point, run_dir: Path, launcher: Launcher, image: dict[str, Any] | None, earlier: list[dict[str, Any]]
) -> dict[str, Any]:
    """One attempt at `point`: its result record (not yet written); raise RunFailed if any rank fails."""
    # The run's data source: a store started (and a bucket mounted) for it, stopped when it ends; the run's
    # environment (environments.py): its launcher, and a neighbour running beside it.
    with data_inputs(point.params, point.inputs) as data, environments.placed(point, launcher, run_dir) as launcher:
        run = replace(point, inputs=point.inputs | data["inputs"] | resume_inputs(point, run_dir, earlier))
        spec = launcher.render(run, run_dir)
        write_json_atomic(run_dir / "jobspec.json", spec.to_dict())
        source, own_cpu = launcher.own_cpu_counter(spec)
        meter = ForeignLoadMeter(own_cpu) if own_cpu else None
        speeds = [machine_speed()] if meter else []  # the ranks run on this host: its speed before and after
        started = time.time()
        with OutputCollector(run_dir) as output:
            try:
                with meter or contextlib.nullcontext():
                    launcher.execute(spec, output)
                speeds += [machine_speed()] if meter else []
            finally:
                provenance = run_provenance(asdict(run), spec.to_dict(), output.workers, image)
                provenance["node"] = environments.node_sharing(run, meter.load if meter else None)
                data_provenance = {"data": data["provenance"]} if data["provenance"] else {}
                write_json_atomic(run_dir / "provenance.json", provenance | data_provenance)
    if output.result is None:
        raise RunFailed(0, "finished without reporting a result", output.stderr_tail(0))
    return result_record(point, output.result, started, time.time(), measured_host_load(meter, source, speeds))


def earlier_attempts(run_dir: Path, code: dict[str, Any], attempt: int) -> list[dict[str, Any]]:
    """This job's failed attempts before attempt number `attempt`, oldest first: the newest `attempt - 1` folders
    under attempts/, as long as each holds a failed attempt of this code (`code`: its git_state) with the number
    its place gives it. Anything else there (a completed run a forced rerun set aside, a killed workflow's
    leftovers, another code's attempt) belongs to another run and is never counted or resumed."""
    folders = sorted((run_dir / "attempts").iterdir()) if (run_dir / "attempts").is_dir() else []
    failed: list[dict[str, Any]] = []
    for number, folder in zip(range(attempt - 1, 0, -1), reversed(folders), strict=False):
        record = json.loads((folder / ATTEMPT).read_text()) if (folder / ATTEMPT).exists() else {}
        own = record.get("outcome") == "failed" and record.get("attempt") == number and record.get("code") == code
        if not own or (folder / RESULT).exists():
            break
        failed.insert(0, record | {"folder": str(folder.relative_to(run_dir))})
    return failed


def resume_inputs(point: Point, run_dir: Path, earlier: list[dict[str, Any]]) -> dict[str, str]:
    """A resumable point's attempt number and the last failed attempt's checkpoint folder (if it left one)."""
    if point.workload not in RESUMABLE_WORKLOADS or not launch_of(point).checkpoint_interval:
        return {}
    inputs = {"attempt": str(earlier[-1]["attempt"] + 1 if earlier else 1)}
    checkpoint = run_dir / earlier[-1]["folder"] / CHECKPOINT_DIR if earlier else None
    if checkpoint and checkpoint.is_dir():
        inputs["resume_checkpoint"] = str(checkpoint)
    return inputs


def write_attempt(
    run_dir: Path, number: int, started: float, outcome: str, error: str, code: dict[str, Any]
) -> dict[str, Any]:
    """This attempt's attempt.json: number, outcome, wall time, error, the last `steps_done` a rank recorded."""
    finished = time.time()
    attempt = {
        "attempt": number,
        "outcome": outcome,
        "started": started,
        "finished": finished,
        "wall_s": finished - started,
        "error": error,
        "steps_done": last_steps_done(run_dir),
        "code": code,
    }
    write_json_atomic(run_dir / ATTEMPT, attempt)
    return attempt


def last_steps_done(run_dir: Path) -> float | None:
    """The last `steps_done` record in a run folder's metrics (how far a workload that records it got), or None."""
    records = metric_records(run_dir) if (run_dir / METRICS).exists() else []
    done = [record["value"] for record in records if record.get("metric") == "steps_done"]
    return done[-1] if done else None
