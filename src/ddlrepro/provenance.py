"""Where a run ran and with what: code version, software, hardware. No environment variable values are recorded."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from ddlrepro.config import REPO_ROOT

PACKAGES = [
    "ddlrepro",
    "torch",
    "numpy",
    "pandas",
    "matplotlib",
    "seaborn",
    "snakemake",
    "jsonschema",
    "psutil",
]


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """HEAD commit and whether tracked files differ from it (None when not a git checkout)."""

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
    point: dict[str, Any], jobspec: dict[str, Any], workers: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """Everything `provenance.json` holds for one run; `workers` are what each rank reported about itself."""
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
        "jobspec": jobspec,
        "point": point,
    }
