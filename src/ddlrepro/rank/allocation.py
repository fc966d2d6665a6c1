"""What this process's allocation may use: its cgroup's CPU quota and memory limit (v1 or v2), else Slurm's
SLURM_CPUS_ON_NODE / SLURM_MEM_PER_NODE, else nothing (the whole node). Torch-free; the paths are parameters so a
fake cgroup folder can stand in for /sys/fs/cgroup in tests."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit value; anything this large is no limit.
UNLIMITED_BYTES = 2**60


@dataclass(frozen=True)
class AllocationLimits:
    """CPU cores and memory bytes the allocation may use (None: not limited) and where each was read."""

    cpu_cores: float | None
    memory_bytes: float | None
    cpu_source: str
    memory_source: str


def own_cgroups(proc_cgroup: Path) -> dict[str, str]:
    """Controller (v1 names; "" for the v2 unified hierarchy) → this process's cgroup path, relative."""
    groups = {}
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path.lstrip("/")
    return groups


def group_file(hierarchy: Path, relative: str, name: str) -> Path | None:
    """`name` in the process's group under `hierarchy`; in a container with its own cgroup namespace missing, the
    group is mounted as the hierarchy's root, so the root's file stands in."""
    for folder in (hierarchy / relative, hierarchy):
        if (folder / name).exists():
            return folder / name
    return None


def cgroup_cpu_limit(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The CPU limit (in cores) of this process's own cgroup, v1 `cpu` or v2 `cpu.max`; None when unlimited or
    unreadable."""
    groups = own_cgroups(proc_cgroup)
    if "cpu" in groups:
        quota = group_file(root / "cpu", groups["cpu"], "cpu.cfs_quota_us")
        if quota is not None and int(quota.read_text()) > 0:
            return int(quota.read_text()) / int((quota.parent / "cpu.cfs_period_us").read_text())
    elif "" in groups:
        limits = group_file(root, groups[""], "cpu.max")
        if limits is not None:
            limit, period = limits.read_text().split()
            if limit != "max":
                return int(limit) / int(period)
    return None


def cgroup_memory_limit(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The memory limit (bytes) of this process's own cgroup, v1 `memory.limit_in_bytes` or v2 `memory.max`."""
    groups = own_cgroups(proc_cgroup)
    if "memory" in groups:
        limit = group_file(root / "memory", groups["memory"], "memory.limit_in_bytes")
    else:
        limit = group_file(root, groups.get("", ""), "memory.max") if "" in groups else None
    if limit is None or limit.read_text().strip() == "max":
        return None
    value = int(limit.read_text())
    return float(value) if value < UNLIMITED_BYTES else None


def allocation_limits(
    proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT, environ: Mapping[str, str] | None = None
) -> AllocationLimits:
    """The cgroup's limits where set, else Slurm's allocation (SLURM_MEM_PER_NODE is in MB), else none."""
    environ = os.environ if environ is None else environ
    readable = proc_cgroup.exists()
    cores = cgroup_cpu_limit(proc_cgroup, root) if readable else None
    memory = cgroup_memory_limit(proc_cgroup, root) if readable else None
    cpu_source = memory_source = "none: the whole node"
    if cores is not None:
        cpu_source = "cgroup"
    elif "SLURM_CPUS_ON_NODE" in environ:
        cores, cpu_source = float(environ["SLURM_CPUS_ON_NODE"]), "SLURM_CPUS_ON_NODE"
    if memory is not None:
        memory_source = "cgroup"
    elif "SLURM_MEM_PER_NODE" in environ:
        memory, memory_source = float(environ["SLURM_MEM_PER_NODE"]) * 2**20, "SLURM_MEM_PER_NODE"
    return AllocationLimits(cores, memory, cpu_source, memory_source)
