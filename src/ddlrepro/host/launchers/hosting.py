"""Elastic runs a launcher hosts on the machine it runs on (this one, or the one node of a Slurm allocation): a
point's `elastic` parameter names the runtime it needs, in place (inplace.py), torchrun's (torchrun.py) or, as the
non-elastic baseline, a static world (ddp.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlrepro.host.launchers import ddp, inplace, torchrun
from ddlrepro.host.launchers.base import JobSpec
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point
from ddlrepro.rank.elastic.schedule import largest_cluster

RUNTIMES = {"inplace": inplace, "torchrun": torchrun, "ddp": ddp}
HOSTED_REQUESTS = {inplace.InplaceRequest: inplace, torchrun.TorchrunRequest: torchrun, ddp.DdpRequest: ddp}


def elastic_runtime(point: Point) -> str | None:
    """The elastic runtime `point` needs (a point parameter), or None for a fixed-size run."""
    return point.params.get("elastic")


def peak_workers(point: Point) -> int:
    """Worker processes the point runs at once at most. An elastic point starts its initial workers and its warm
    standbys; a grow takes idle standbys first and starts a process only for the rest, and leavers return to the
    pool (or, with no pool, exit), so no more processes are ever alive than the start's or the largest cluster's,
    whether a schedule or a policy resizes it."""
    if elastic_runtime(point) is None:
        return point.workers
    return max(largest_cluster(point.params), point.params["initial_workers"] + point.params["standby"])


def render_elastic(point: Point, run_dir: Path, launcher: str, timeout_s: float) -> JobSpec[Any]:
    """The elastic job of `point` under its runtime, started by `launcher` on the machine it runs on."""
    return JobSpec(launcher, timeout_s, RUNTIMES[elastic_runtime(point)].request(point, run_dir))


def is_elastic(spec: JobSpec[Any]) -> bool:
    return type(spec.request) in HOSTED_REQUESTS


def execute_elastic(spec: JobSpec[Any], output: OutputCollector) -> None:
    HOSTED_REQUESTS[type(spec.request)].execute(spec.request, spec.timeout_s, output)
