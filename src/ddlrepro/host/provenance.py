"""Where a run ran and with what: code version, software, hardware. No environment variable values are recorded."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ddlrepro.host.redaction import secret_variable_names

PACKAGES = [
    "ddlrepro",
    "torch",
    "numpy",
    "pandas",
    "matplotlib",
    "snakemake",
    "jsonschema",
    "psutil",
]


def git_state(repo: Path = Path(".")) -> dict[str, Any]:
    """HEAD commit of the checkout `repo` lies in and whether tracked files differ from it (None when not a git
    checkout). The default, the working directory, is the workflow's checkout in every job Snakemake starts."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        return done.stdout.strip()

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def package_versions(names: list[str] = PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_inventory() -> dict[str, Any]:
    """This host: name, OS, CPU model and cores (all, and usable by this process), memory."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable,
        "memory_bytes": memory,
    }


def run_provenance(
    point: dict[str, Any],
    jobspec: dict[str, Any],
    workers: dict[int, dict[str, Any]],
    image: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything `provenance.json` holds for one run; `workers` are what each rank reported about itself,
    `image` the container image the workers ran in (reference and digest; None when they ran on the host)."""
    first = workers.get(0, {})
    return {
        "git": git_state(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "torch": {"version": first.get("torch"), "cuda": first.get("cuda"), "backend": first.get("backend")},
        "launcher_host": host_inventory(),
        "hostnames": sorted({worker["hostname"] for worker in workers.values()}),
        "gpus": sorted({worker["gpu"] for worker in workers.values() if worker.get("gpu")}),
        "workers": [workers[rank] for rank in sorted(workers)],
        "image": image,
        "jobspec": jobspec,
        "point": point,
        "secret_variables": secret_variable_names(),  # names, never values: what a bundle must look for
    }


def profile_from_command(argv: list[str]) -> str | None:
    """The Snakemake profile named on the command line (--profile or --workflow-profile), else SNAKEMAKE_PROFILE."""
    for flag in ("--profile", "--workflow-profile"):
        for index, argument in enumerate(argv):
            if argument == flag and index + 1 < len(argv):
                return argv[index + 1]
            if argument.startswith(flag + "="):
                return argument.split("=", 1)[1]
    return os.environ.get("SNAKEMAKE_PROFILE")


def invocation_provenance(config: dict[str, Any], argv: list[str], repository: Path = Path(".")) -> dict[str, Any]:
    """One workflow invocation: Snakemake, the command and profile, the config as used, code (the checkout
    `repository`), software, host."""
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "snakemake": package_versions(["snakemake"])["snakemake"],
        "command": argv,
        "profile": profile_from_command(argv),
        "config": config,
        "git": git_state(repository),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "host": host_inventory(),
    }


def record_invocation(config: dict[str, Any], folder: Path, repository: Path = Path(".")) -> Path:
    """Write this invocation's provenance as `invocation-<UTC time>.json` under `folder` (secrets redacted)."""
    from ddlrepro.host.rundir import write_json_atomic

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"invocation-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.json"
    write_json_atomic(path, invocation_provenance(config, sys.argv, repository))
    return path
