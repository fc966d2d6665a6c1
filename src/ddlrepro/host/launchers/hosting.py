"""Elastic runs a launcher hosts on the machine it runs on (this one, or the one node of a Slurm allocation): a
point's `elastic` parameter names the runtime it needs, in place (inplace.py), torchrun's (torchrun.py) or, as the
non-elastic baseline, a static world (ddp.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers import ddp, inplace, torchrun
from ddlrepro.host.launchers.base import JobSpec
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.points import Point

RUNTIMES = {"inplace": inplace, "torchrun": torchrun, "ddp": ddp}
HOSTED_REQUESTS = {inplace.InplaceRequest: inplace, torchrun.TorchrunRequest: torchrun, ddp.DdpRequest: ddp}


def render_elastic(point: Point, run_dir: Path, launcher: str, timeout_s: float) -> JobSpec[Any]:
    """The elastic job of `point` under its runtime (launch.Launch.runtime), started by `launcher` on the machine it
    runs on."""
    runtime = launch_of(point).runtime
    if runtime is None:
        raise ValueError(f"point {point.id} is not elastic")
    return JobSpec(launcher, timeout_s, RUNTIMES[runtime].request(point, run_dir))


def is_elastic(spec: JobSpec[Any]) -> bool:
    return type(spec.request) in HOSTED_REQUESTS


def execute_elastic(spec: JobSpec[Any], output: OutputCollector) -> None:
    HOSTED_REQUESTS[type(spec.request)].execute(spec.request, spec.timeout_s, output)
