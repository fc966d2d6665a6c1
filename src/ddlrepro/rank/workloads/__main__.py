"""Entry point of one rank: `python -m ddlrepro.rank.workloads POINT_JSON`."""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # a rank starting: no collections while it loads its libraries (startup.py)
    startup.pause_collection()

import dataclasses
import importlib
import os
import sys
from types import ModuleType
from typing import Any

import torch.distributed as dist

from ddlrepro.points import Point
from ddlrepro.rank import devicetypes
from ddlrepro.rank.interfaces import NodeInterfaceCounter
from ddlrepro.rank.runtime import RankContext, ResourceSampler, init_distributed
from ddlrepro.rank.workloads import WORKLOADS
from ddlrepro.shutdown import run_rank


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m ddlrepro.rank.workloads POINT_JSON")
    point = Point.from_json(argv[0])
    ensure_device_environment(point, argv)
    workload = load_workload(point.workload, point.params)
    ctx = RankContext.from_environment(
        point.threads_per_worker, point.params["backend"], point.params.get("device", "backend")
    )
    ctx = dataclasses.replace(ctx, threads=devicetypes.rank_threads(point.params, ctx.rank, ctx.threads))
    typed = point.params.get("device_types") or point.params.get("kernels")
    init_distributed(ctx, devicetypes.describe_device(point.params, ctx.rank) if typed else {})
    try:
        with (
            NodeInterfaceCounter(ctx.rank, ctx.local_rank),
            ResourceSampler(ctx, point.params["sample_interval_s"]),
        ):
            workload.run({**point.params, **point.inputs}, ctx)
    finally:
        dist.destroy_process_group()


def load_workload(name: str, params: dict[str, Any]) -> ModuleType:
    """The workload's module, imported with the libraries it names; then the collector resumes (ddlrepro.startup)."""
    workload = importlib.import_module(WORKLOADS[name])
    startup.resume_collection(after_loading=workload.libraries(params))
    return workload


def ensure_device_environment(point: Point, argv: list[str]) -> None:
    """Start again with this rank's device-type variables (devicetypes.py) where its launcher could not give each
    rank its own environment (one pod template for every rank): oneDNN, ATen and MKL read them when torch loads."""
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    wanted = devicetypes.rank_environment(point.params, rank)
    if any(os.environ.get(name) != value for name, value in wanted.items()):
        command = [sys.executable, "-m", "ddlrepro.rank.workloads", *argv]
        os.execve(sys.executable, command, {**os.environ, **wanted})


if __name__ == "__main__":
    run_rank(main)
