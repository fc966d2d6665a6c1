"""The environments of the BigGAN resource-profile study: where a point with an `environment` param runs.

- `slurm` (the study's HPC cluster): the Slurm launcher's allocation. It runs only when the run's launcher is
  slurm (launcher.name: slurm, or auto inside an allocation); otherwise the point is skipped, saying whether a
  Slurm cluster is reachable at all (`sinfo`).
- `container` (the stand-in for the study's OpenShift pod): every rank in its own podman container with `--cpus`
  and `--memory` limits, on this machine's own root file system (`podman --runtime runc run --rootfs /:O`: an
  overlay of /, so the checkout and its Python are there and nothing is built). Needs podman and root.
- `local`: plain processes on this machine, no limits (a baseline that runs anywhere).

`neighbour`: a CPU-heavy container (stress-ng, `cpus` workers, the same root file system) started before the run
and removed after it, whatever happened; only beside a container environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddlrepro.host.config import schema_default
from ddlrepro.host.hostload import HostLoad
from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers.base import Launcher
from ddlrepro.host.launchers.local import LocalLauncher
from ddlrepro.host.redaction import redacted_tail
from ddlrepro.host.rundir import write_json_atomic
from ddlrepro.points import Point

ENGINE = ["podman", "--runtime", "runc"]
# runc cannot raise this machine's file limits inside a container: keep them at what the host grants.
LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
ROOTFS = "/:O"
NEIGHBOUR_NAME = "ddlrepro-neighbour-{point}"
ENVIRONMENT_FILE = "environment.json"


def kind_of(point: Point) -> str | None:
    environment = launch_of(point).environment
    return environment.kind if environment else None


def neighbour_of(point: Point) -> dict[str, Any] | None:
    environment = launch_of(point).environment
    return environment.neighbour if environment else None


def container_of(point: Point) -> dict[str, Any]:
    environment = launch_of(point).environment
    if environment is None or environment.container is None:
        raise ValueError(f"point {point.id} names no container")
    return environment.container


@functools.cache
def engine_unavailable_reason() -> str | None:
    """Why podman containers cannot run here, or None: podman must be installed, we root, and a limited container
    on this root file system must really start (a container host without cgroup delegation has podman but cannot)."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/container-tools install)"
    if os.geteuid() != 0:
        return "podman with cgroup limits needs root here"
    probe = [*ENGINE, "run", "--rm", *LIMITS, "--cpus", "0.5", "--memory", "64m", "--network=none", "--rootfs"]
    try:
        done = subprocess.run([*probe, ROOTFS, "true"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "a limited podman container did not start within 60 s"
    if done.returncode != 0:
        return f"a limited podman container does not start here: {redacted_tail(done.stderr.strip(), 200)}"
    return None


def slurm_unreachable_reason() -> str:
    """Why a Slurm point is not run under this launcher: no Slurm cluster reachable, or one that is but unused."""
    if shutil.which("sinfo") is None:
        return "no Slurm cluster reachable (sinfo not installed; scripts/slurm-cluster starts one)"
    try:
        answer = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "no Slurm cluster reachable (sinfo: no answer from the controller in 10 s)"
    if answer.returncode != 0:
        said = " / ".join(line.strip() for line in answer.stderr.splitlines() if line.strip())
        return f"no Slurm cluster reachable (sinfo: {said[:200]})"  # one line: it becomes a table cell
    return "a Slurm cluster is reachable but the launcher is not slurm (launcher.name: slurm runs this environment)"


def unavailable_reason(point: Point, launcher: str) -> str | None:
    """Why `point`'s environment cannot run under `launcher` here (a `skipped: ...` reason), or None."""
    kind = kind_of(point)
    if kind == "slurm" and launcher != "slurm":
        return f"skipped: {slurm_unreachable_reason()}"
    if kind == "container":
        if launcher != "local":
            return f"skipped: container environments run under the local launcher, not {launcher}"
        reason = engine_unavailable_reason()
        if reason:
            return f"skipped: {reason}"
    if neighbour_of(point) and shutil.which("stress-ng") is None:
        return "skipped: the neighbour runs stress-ng, not installed (scripts/container-tools install)"
    return None


def container_options(point: Point) -> list[str]:
    """The `podman run` options of one rank's container: its limits, the host's network, this root file system."""
    limits = container_of(point)
    return [*LIMITS, "--cpus", str(limits["cpus"]), "--memory", str(limits["memory"])]


def neighbour_command(point: Point, cpus: float, timeout_s: float) -> list[str]:
    name = NEIGHBOUR_NAME.format(point=point.id)
    options = [*LIMITS, "--detach", "--rm", "--name", name, "--network=none", "--cpus", str(cpus), "--rootfs"]
    stress = ["stress-ng", "--cpu", str(max(1, round(cpus))), "--timeout", f"{int(timeout_s)}s", "--quiet"]
    return [*ENGINE, "run", *options, ROOTFS, *stress]


@contextlib.contextmanager
def neighbour(point: Point, timeout_s: float) -> Iterator[dict[str, Any]]:
    """The point's CPU-heavy neighbour container, running for the block (removed after it, even on failure)."""
    wanted = neighbour_of(point)
    if not wanted:
        yield {"neighbour": None}
        return
    command = neighbour_command(point, wanted["cpus"], timeout_s)
    remove = [*ENGINE, "rm", "--force", "--time", "0", NEIGHBOUR_NAME.format(point=point.id)]
    subprocess.run(remove, capture_output=True, timeout=60)  # one left by a killed earlier attempt holds the name
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)
    try:
        yield {"neighbour": {"command": command, "cpus": wanted["cpus"]}}
    finally:
        subprocess.run(remove, capture_output=True, timeout=60)


def in_containers(point: Point, launcher: Launcher) -> LocalLauncher:
    """The local launcher running every rank in its own limited container: in the built training image where
    images.build made one, else on this machine's root file system."""
    if not isinstance(launcher, LocalLauncher):  # unavailable_reason skips such points first
        raise ValueError(f"container environments run under the local launcher, not {launcher.name}")
    options = launcher.options
    if options.container and options.container_run:
        run = [*options.container_run, *container_options(point)]
        options = dataclasses.replace(options, container_run=run)
    else:
        run = [*ENGINE, "run", *container_options(point), "--rootfs"]
        options = dataclasses.replace(options, container_run=run, container=ROOTFS, rootfs=True)
    return LocalLauncher(options)


@contextlib.contextmanager
def placed(point: Point, launcher: Launcher, run_dir: Path) -> Iterator[Launcher]:
    """The launcher that runs `point` in its environment (its neighbour running meanwhile); what the environment
    was goes to the run's `environment.json`."""
    environment = launch_of(point).environment
    if environment is None:
        yield launcher
        return
    kind = environment.kind
    record: dict[str, Any] = {"environment": environment.name, "kind": kind}
    if kind == "container":
        contained = in_containers(point, launcher)
        options = contained.options
        record["container"] = {"run": options.container_run, "image": options.container, **container_of(point)}
        launcher = contained
    with neighbour(point, launcher.options.timeout_s) as neighbour_record:
        write_json_atomic(run_dir / ENVIRONMENT_FILE, record | neighbour_record)
        yield launcher


def node_sharing(point: Point, load: HostLoad | None) -> dict[str, Any]:
    """Whether the run shared its node, for provenance: a neighbour container beside it (declared), or processes
    outside the run above checks.max_foreign_share's default of the launcher host's CPU (measured); `shared` is
    None when there was no neighbour and nothing was measured (around containers the launcher cannot count its own
    processes' CPU)."""
    neighbour = bool(neighbour_of(point))
    foreign = load.foreign_share if load else None
    threshold = schema_default("checks", "max_foreign_share")
    shared = True if neighbour else None if foreign is None else foreign > threshold
    return {"shared": shared, "neighbour": neighbour, "foreign_cpu_share": foreign, "threshold": threshold}
