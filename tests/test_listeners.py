"""Nothing a single-host run starts listens beyond loopback: while a run of each runtime goes on, `ss` lists the
listening TCP sockets of this test's descendant processes, and every one is on 127.0.0.1 or ::1.

Covered: torch DDP ranks (env:// rendezvous: rank 0's TCPStore, gloo's pairs), the in-place elastic runtime, the
elastic DDP runtime and torchrun's workers. Not yet: torchrun's own agent store, TensorFlow's gRPC servers and
mpirun, which bind every interface whatever they are told (docs/trust-model.md)."""

from __future__ import annotations

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

from ddlrepro.host.launchers import local_launcher
from ddlrepro.host.run import run_point
from ddlrepro.points import Point

LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|\[::1\]|\[::ffff:127\.\d+\.\d+\.\d+\]):\d+$")
SAMPLE_INTERVAL_S = 0.05


def listening(pids: set[int]) -> set[str]:
    """`address:port` of every listening TCP socket that one of `pids` holds."""
    found = set()
    lines = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    for line in lines:
        fields = line.split()
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.add(fields[3])
    return found


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
