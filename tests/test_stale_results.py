"""A table and figure never outlive the run folders they were built from: a forced rerun killed mid-run leaves the
next plain `snakemake` to redo the run and everything built from it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ONE_WORKER_COUNT_DLAAS, SNAKEMAKE, checks_excluding, planned_jobs, snakemake, workflow_environment

ONE_POINT = "figures:\n  dlaas-scaling:\n    workers: [1]\n" + checks_excluding(*ONE_WORKER_COUNT_DLAAS)
TARGET = ["--configfile", "tests/configs/tiny.yaml", "one.yaml", "--", "dlaas_scaling"]


def under_way(run_dir: Path) -> bool:
    """The run's new attempt has begun: the earlier one's job spec moved aside, its own written."""
    return any(run_dir.glob("attempts/*/jobspec.json")) and (run_dir / "jobspec.json").exists()


def interrupt_when_run_started(workdir: Path, run_dir: Path, timeout_s: float = 120) -> None:
    """Run a forced rerun and press Ctrl-C (SIGINT to its process group) once its run is under way: the earlier
    attempt set aside and the new one's job spec written. (Ctrl-C before Snakemake has started the job's process
    lets that job run to the end: Snakemake waits for the jobs it has begun.)"""
    forced = subprocess.Popen(
        [SNAKEMAKE, "--cores", "2", "--forceall", *TARGET],
        cwd=workdir,
        env=workflow_environment(workdir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not under_way(run_dir) and forced.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert under_way(run_dir), "the forced rerun never started its run"
        os.killpg(forced.pid, signal.SIGINT)
        forced.wait(timeout=60)
    finally:
        if forced.poll() is None:
            os.killpg(forced.pid, signal.SIGKILL)
            forced.wait(timeout=30)


@pytest.mark.slow
def test_a_killed_forced_rerun_is_redone_by_the_next_run(workflow_copy: Path) -> None:
    (workflow_copy / "one.yaml").write_text(ONE_POINT)
    built = snakemake(workflow_copy, *TARGET, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (result,) = (workflow_copy / "results/runs/dlaas-scaling").glob("*/result.json")
    table = workflow_copy / "results/tables/dlaas-scaling.csv"

    interrupt_when_run_started(workflow_copy, result.parent)
    assert table.exists() and not result.exists()

    plan = snakemake(workflow_copy, "-n", *TARGET, timeout=120)
    assert plan.returncode == 0, plan.stderr[-3000:]
    jobs = planned_jobs(plan.stdout + plan.stderr)
    assert {rule: jobs.get(rule) for rule in ("run_point", "tabulate", "plot")} == {
        "run_point": 1,
        "tabulate": 1,
        "plot": 1,
    }
