"""The in-place runtime's fork server: a joiner forked from it starts with the server's imports done, gets its own
output pipes, process group and environment, runs its module as `python -m` would, and its exit code (or the signal that
killed it) comes back; a cold grow of a real in-place job forks its joiners."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_elastic import elastic_point

from ddlrepro.host.launchers.base import WorkerSpec
from ddlrepro.host.launchers.forkserver import ForkServer
from ddlrepro.host.launchers.processes import stop
from ddlrepro.host.run import run_point
from ddlrepro.host.testing import live_records, local_launcher


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ForkServer]:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    forks = ForkServer({"DDLREPRO_COMMON": "shared"}, ["json", "calendar"]).start()
    yield forks
    forks.stop()
    assert not forks.folder.exists(), "the server's socket folder was left"


def test_a_forked_child_runs_its_module_with_its_own_output_and_environment(server: ForkServer) -> None:
    lines: list[tuple[str, str]] = []
    spec = WorkerSpec(3, [sys.executable, "-m", "calendar", "2026", "11"], {"DDLREPRO_COMMON": "shared", "X": "y"})
    started = server.fork(spec, lambda stream, line: lines.append((stream, line)))
    assert started is not None, list(server.stderr_tail)
    assert started.process.wait(timeout=60) == 0
    for reader in started.readers:
        reader.join(timeout=10)
    assert ("stdout", "   November 2026") in lines, lines
    assert started.process.pid != server.process.pid


def test_exit_codes_and_signals_come_back_as_popen_reports_them(server: ForkServer) -> None:
    failing = WorkerSpec(0, [sys.executable, "-m", "json.tool", "/nonexistent/file.json"], {})
    lines: list[tuple[str, str]] = []
    failed = server.fork(failing, lambda stream, line: lines.append((stream, line)))
    as_a_process = subprocess.run(failing.command, capture_output=True, timeout=60).returncode
    assert as_a_process != 0 and failed is not None and failed.process.wait(timeout=60) == as_a_process
    for reader in failed.readers:
        reader.join(timeout=10)
    assert any(stream == "stderr" and "No such file" in line for stream, line in lines), lines
    sleeping = WorkerSpec(1, [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"], {})
    served = server.fork(sleeping, lambda stream, line: None)
    assert served is not None and served.process.poll() is None
    assert os.getpgid(served.process.pid) == served.process.pid, "a forked child leads its own process group"
    stop([served])  # SIGTERM to its process group, as the launchers stop workers
    assert served.process.wait(timeout=30) == -signal.SIGTERM


def test_a_child_outliving_its_server_is_still_seen_to_end(server: ForkServer) -> None:
    """The server killed first (no exit code will come): the child's end is still noticed, as killed."""
    served = server.fork(
        WorkerSpec(0, [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"], {}), lambda *_: None
    )
    assert served is not None and server.process is not None
    server.process.kill()
    server.process.wait(timeout=30)
    assert served.process.poll() is None, "the child runs on without its server"
    os.killpg(served.process.pid, signal.SIGKILL)
    assert served.process.wait(timeout=30) == -signal.SIGKILL


def test_a_server_that_cannot_start_makes_fork_say_no(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    forks = ForkServer({}, ["no_such_module_anywhere"]).start()
    try:
        assert forks.fork(WorkerSpec(0, [sys.executable, "-m", "calendar"], {}), lambda *_: None) is None
        deadline = time.monotonic() + 10
        while not any("No module named" in line for line in forks.stderr_tail) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("No module named 'no_such_module_anywhere'" in line for line in forks.stderr_tail)
    finally:
        forks.stop()


@pytest.mark.slow
def test_a_cold_grow_of_an_in_place_job_forks_its_joiners(tmp_path: Path) -> None:
    point = elastic_point("4:2,8:1,12:3,16:0")
    result = run_point(point, tmp_path / "run", local_launcher(240))
    assert result["summary"]["steps"] == 16
    workers = [record for record in live_records(tmp_path / "run") if record["kind"] == "worker"]
    started = {record["rank"]: record["started"] for record in workers}
    assert started[0] == "process", started  # the first member: started with the job
    assert set(started) == {0, 1, 2, 3} and {started[worker] for worker in (1, 2, 3)} == {"forked"}, started
