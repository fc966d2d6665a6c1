"""Nothing a single-host run starts listens beyond loopback: while a run of each runtime goes on, `ss` lists the
listening TCP sockets of this test's descendant processes, and every one is on 127.0.0.1 or ::1.

Covered: torch DDP ranks (env:// rendezvous: rank 0's TCPStore, gloo's pairs), Horovod over gloo and over MPI,
TensorFlow, the in-place elastic runtime and torchrun (its agents' c10d store too). Open MPI's and TensorFlow's
servers bind every interface whatever they are told: their runs get a network namespace holding only loopback
(`isolated:` below; as root), which the test checks holds nothing else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import tiny_point
from test_elastic import elastic_point

from ddlrepro.host.launchers import isolation, local_launcher
from ddlrepro.host.run import run_point
from ddlrepro.points import Point

LOOPBACK = re.compile(r"^(isolated:.*|127\.\d+\.\d+\.\d+:\d+|\[::1\]:\d+|\[::ffff:127\.\d+\.\d+\.\d+\]:\d+)$")
SAMPLE_INTERVAL_S = 0.05
OWN_NETWORK = os.readlink("/proc/self/ns/net")


def listening(pids: set[int]) -> set[str]:
    """`address:port` of every listening TCP socket that one of `pids` holds; a socket in a network namespace of its
    own that holds nothing but loopback as `isolated:address:port` (nothing outside can reach it)."""
    found = set()
    namespaces = {network_of(pid): pid for pid in pids}
    others = [pid for namespace, pid in namespaces.items() if namespace not in (None, OWN_NETWORK)]
    for pid in [None, *others]:
        enter = ["nsenter", f"--net=/proc/{pid}/ns/net"] if pid else []
        script = "ip -o link; echo ---; ss -ltnpH"  # one entry into the namespace: the process may end meanwhile
        links, _, sockets = subprocess.run(
            [*enter, "sh", "-c", script], capture_output=True, text=True, timeout=10
        ).stdout.partition("---\n")
        names = {line.split(":")[1].strip() for line in links.splitlines()}
        label = "" if not pid else "isolated:" if names == {"lo"} else f"namespace with {sorted(names)}:"
        for line in sockets.splitlines():
            owners = {int(owner) for owner in re.findall(r"pid=(\d+)", line)}
            if owners & pids:
                found.add(label + line.split()[3])
    return found


def network_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def listeners_during(run: Callable[[], dict]) -> tuple[dict, set[str]]:
    """What `run` returned, and every listening address its processes held while it ran (sampled)."""
    seen: set[str] = set()
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(run()))
    worker.start()
    me = psutil.Process()
    deadline = time.monotonic() + 300
    while worker.is_alive() and time.monotonic() < deadline:
        pids = {child.pid for child in me.children(recursive=True)} | {me.pid}
        seen |= listening(pids)
        time.sleep(SAMPLE_INTERVAL_S)
    worker.join(timeout=60)
    return outcome, seen


POINTS = {
    "torch-ddp": tiny_point(workers=2, iterations=12),
    "horovod-gloo": tiny_point(workers=2, iterations=12, framework="horovod", horovod_controller="gloo"),
    "horovod-mpi": tiny_point(workers=2, iterations=12, framework="horovod", horovod_controller="mpi"),
    "tensorflow": tiny_point(workers=2, iterations=12, framework="tensorflow"),
    "inplace": elastic_point("6:2,12:0"),
    "torchrun": elastic_point("6:2,12:0", runtime="torchrun"),
}


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
@pytest.mark.parametrize("name", list(POINTS))
def test_a_single_host_run_listens_on_loopback_only(tmp_path: Path, name: str) -> None:
    point: Point = POINTS[name]
    result, addresses = listeners_during(lambda: run_point(point, tmp_path / "run", local_launcher(240)))
    assert result.get("status") == "ok", result
    assert addresses, "no listening socket seen: the sampling missed the run"
    beyond = sorted(address for address in addresses if not LOOPBACK.match(address))
    assert not beyond, f"{name} listened beyond loopback: {beyond}"


@pytest.mark.skipif(isolation.unavailable_reason() is not None, reason=isolation.unavailable_reason() or "")
def test_a_dead_runs_namespace_is_swept_and_a_live_ones_is_kept() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, alive = f"{isolation.PREFIX}{gone.pid}-aaaaaa", f"{isolation.PREFIX}{os.getpid()}-bbbbbb"
    for name in (dead, alive):
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        assert dead in isolation.sweep_dead_owners()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert dead not in listed and alive in listed
    finally:
        for name in (dead, alive):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
