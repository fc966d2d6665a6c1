"""CPU quotas for emulated device types: one cgroup per throttled rank, created for a run and removed after it.

cgroup v1 (a `cpu` hierarchy: `cpu.cfs_quota_us`, `cpu.cfs_period_us`) or v2 (`cpu.max`, the `cpu` controller
enabled in the parent's `cgroup.subtree_control`). Groups are made under `<hierarchy>/ddlrepro-quota-<pid>-<run>/
rank<k>` (named after their owner: owners.py) and removed on exit, whatever happened; a rank's process joins its
group right after it starts (its Python start-up takes far longer than that). Without permission (not root, no cpu
controller, a read-only cgroup file system in a container) nothing is applied and `reason` says why: the run goes on
unthrottled and records so.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from ddlrepro.host.owners import owned_name

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
REMOVE_WAIT_S = 5.0
APPLIED = "applied"


def cpu_hierarchy(root: Path) -> tuple[str, Path] | None:
    """("v1", the cpu hierarchy) or ("v2", the unified root with the cpu controller); None without either."""
    if (root / "cpu" / "cpu.cfs_quota_us").exists():
        return "v1", root / "cpu"
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2", root
    return None


class CpuQuotas:
    """Context manager: a cgroup per rank of `cores` (rank → CPU cores it may use), for the run named `name`."""

    def __init__(self, name: str, cores: dict[int, float], root: Path | None = None) -> None:
        self.name, self.cores, self.root = name, cores, root or CGROUP_ROOT
        self.groups: dict[int, Path] = {}
        self.base: Path | None = None
        self.reason = "no quota requested"
        self.applied = False

    @property
    def status(self) -> str:
        """`applied`, or `not applied: <why>`."""
        return APPLIED if self.applied else f"not applied: {self.reason}"

    def __enter__(self) -> CpuQuotas:
        if not self.cores:
            return self
        found = cpu_hierarchy(self.root)
        if found is None:
            self.reason = f"no cpu controller under {self.root} (cgroup v1 cpu or v2 cpu.max)"
            return self
        version, hierarchy = found
        try:
            base = hierarchy / owned_name("quota", self.name)
            base.mkdir()  # a group of that name already there is someone else's: never adopted, never removed
            self.base = base
            if version == "v2":
                (self.base / "cgroup.subtree_control").write_text("+cpu")
            for rank, cores in self.cores.items():
                group = self.base / f"rank{rank}"
                group.mkdir()
                self.groups[rank] = group
                limit = max(1000, round(cores * PERIOD_US))
                if version == "v1":
                    (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                    (group / "cpu.cfs_quota_us").write_text(str(limit))
                else:
                    (group / "cpu.max").write_text(f"{limit} {PERIOD_US}")
            self.applied = True
        except OSError as error:
            self.reason = f"cannot set a {version} CPU quota under {hierarchy} (uid {os.geteuid()}): {error}"
            self.remove()
        return self

    def join(self, rank: int | None, pid: int) -> None:
        """Move the process `pid` (all its threads) into `rank`'s group, if it has one (None: the process of no
        rank, e.g. mpirun, has none)."""
        if rank in self.groups:
            (self.groups[rank] / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Remove every group made (see `remove_groups`)."""
        if self.base is not None:
            remove_groups(self.base, list(self.groups.values()))
        self.groups, self.base = {}, None

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.remove()


def remove_groups(base: Path, groups: list[Path]) -> None:
    """Remove `groups` and then `base`. Their ranks have been stopped; a process still in one (one a rank started
    that outlived it) is moved to the hierarchy's root first, so the groups go whatever happened."""
    for group in [*groups, base]:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (base.parent / "cgroup.procs").write_text(pid)
        deadline = time.monotonic() + REMOVE_WAIT_S
        while group.exists():
            try:
                group.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
