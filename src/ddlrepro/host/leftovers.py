"""What a run makes on this host outside its run folder, named after the process that owns it, and the sweep of
what a dead owner (a SIGKILLed run) left behind.

Owned, each under a name holding its owner's pid (owners.py): the object store's temporary folder and its
`weed` server (`ddlrepro-store-<pid>-…`), the s3fs mount and its folder (`ddlrepro-s3fs-<pid>-…`), the CPU quota
cgroups (`ddlrepro-quota-<pid>-<run>`), and containers (label `ddlrepro.owner=<pid>`). Network namespaces and
testbeds carry their owner in their names the same way (launchers/isolation.py, testbed/network.py).

A run that ends removes what it made on every exit path; one that is SIGKILLed cannot. `sweep()` runs when the
next run starts (run.run_point): whatever belongs to an owner no longer running goes, in order (processes, then
mounts, then folders and groups); what a live owner holds, another checkout's run included, is never touched.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psutil

from ddlrepro.host import cpuquota, objectstore
from ddlrepro.host.owners import OWNED, OWNER_LABEL, dead_owner

UMOUNT_TIMEOUT_S = 30.0
ENGINE_TIMEOUT_S = 60.0
PORT = re.compile(r"^-\w+\.port=(\d+)$")  # weed's service ports: its /tmp sockets are named after them


def sweep() -> list[str]:
    """Remove everything a dead owner left; what was removed, in words."""
    return [*_stop_processes(), *_unmount(), *_remove_folders(), *_remove_cgroups()]


def _owned_folder_in(argument: str) -> str | None:
    """The owned folder (`…/ddlrepro-<kind>-<pid>-…`) an argument points into, if any."""
    for part in Path(argument.split("=", 1)[-1]).parts:
        if OWNED.match(part):
            return part
    return None


def _stop_processes() -> list[str]:
    """Kill a dead owner's `weed` and `s3fs` processes (they outlive a SIGKILLed run) and weed's /tmp sockets."""
    removed = []
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        command = process.info["cmdline"] or []
        if process.info["name"] not in ("weed", "s3fs") or not command:
            continue
        folders = {folder for argument in command if (folder := _owned_folder_in(argument))}
        if not any(dead_owner(folder) for folder in folders):
            continue
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        objectstore.remove_leftover_sockets(int(port) for argument in command for port in PORT.findall(argument))
        removed.append(f"{process.info['name']} process {process.info['pid']} of {sorted(folders)}")
    return removed


def _unmount() -> list[str]:
    """Lazily unmount a dead owner's s3fs mounts (the endpoint is gone: a plain umount could hang)."""
    removed = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        mountpoint = line.split()[1].replace("\\040", " ")
        folder = _owned_folder_in(mountpoint)
        if folder and dead_owner(folder):
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(["umount", "-l", mountpoint], capture_output=True, timeout=UMOUNT_TIMEOUT_S)
            removed.append(f"mount {mountpoint}")
    return removed


def _remove_folders() -> list[str]:
    """A dead owner's temporary folders (data, keys, sockets), once nothing is mounted in them."""
    mounted = Path("/proc/self/mounts").read_text()
    removed = []
    for folder in Path(tempfile.gettempdir()).glob("ddlrepro-*-*-*"):
        if folder.is_dir() and not folder.is_symlink() and dead_owner(folder.name) and str(folder) not in mounted:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(f"folder {folder}")
    return removed


def _remove_cgroups(root: Path | None = None) -> list[str]:
    """A dead owner's CPU quota groups (their processes moved to the hierarchy's root first)."""
    found = cpuquota.cpu_hierarchy(root or cpuquota.CGROUP_ROOT)
    if found is None:
        return []
    removed = []
    for base in found[1].glob("ddlrepro-quota-*"):
        if base.is_dir() and dead_owner(base.name):
            with contextlib.suppress(OSError):
                cpuquota.remove_groups(base, [group for group in base.iterdir() if group.is_dir()])
                removed.append(f"cgroup {base}")
    return removed


def sweep_containers(engine: list[str]) -> list[str]:
    """Remove the containers (`engine`: podman or docker) whose owner label names a dead process."""
    owner = f'{{{{index .Labels "{OWNER_LABEL}"}}}}'
    listed = subprocess.run(
        [*engine, "ps", "--all", "--filter", f"label={OWNER_LABEL}", "--format", f"{{{{.ID}}}} {owner}"],
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    dead = [
        container
        for container, owner in (line.split() for line in listed.stdout.splitlines() if len(line.split()) == 2)
        if owner.isdigit() and not psutil.pid_exists(int(owner))
    ]
    if dead:
        subprocess.run([*engine, "rm", "--force", *dead], capture_output=True, timeout=ENGINE_TIMEOUT_S)
    return [f"container {container}" for container in dead]
