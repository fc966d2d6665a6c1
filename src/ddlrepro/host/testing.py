"""What tests and benchmarks drive runs with, kept apart from the workflow's code: the local launcher as shipped,
and the live log of a running elastic job (to find a worker and kill it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

from ddlrepro.host.launchers import configured_launcher
from ddlrepro.host.launchers.base import Launcher
from ddlrepro.records import RECORD_PREFIX


def live_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records every rank has printed so far (from `log.txt`, which the launcher writes line by line)."""
    log = run_dir / "log.txt"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line.split(RECORD_PREFIX, 1)[1]) for line in lines if RECORD_PREFIX in line]


def worker_pid(run_dir: Path, worker: int, after_steps: int, timeout_s: float = 120) -> int:
    """The pid of `worker` once rank 0 has reported `after_steps` steps."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = live_records(run_dir)
        pids = {record["rank"]: record["pid"] for record in records if record["kind"] == "worker"}
        steps = sum(1 for record in records if record.get("metric") == "cluster_size")
        if worker in pids and steps >= after_steps:
            return cast("int", pids[worker])
        time.sleep(0.05)
    raise TimeoutError(f"worker {worker} did not reach step {after_steps} within {timeout_s:g} s")


def local_launcher(timeout_s: float) -> Launcher:
    """The local launcher as shipped, stopping a run after `timeout_s`."""
    return configured_launcher({"launcher": {"name": "local", "timeout_s": timeout_s}})
