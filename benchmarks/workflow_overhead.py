"""Workflow overhead: Snakemake's planning time over every paper-scale point (target ≤ 5 s) and a no-op rerun
at smoke scale (target ≤ 3 s), each timed in this run on a private copy of the workflow.

    python benchmarks/workflow_overhead.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import judged

from ddlrepro.host.hostload import ForeignLoadMeter

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
PLAN_TARGET_S = 5.0
NOOP_TARGET_S = 3.0
PARTS = ["Snakefile", "workflow", "src", "config", "profiles", "envs", "scripts", "containers", "pyproject.toml"]


PAPER_LAUNCHER = "launcher={name: slurm}"  # what profiles/slurm sets


def copy_workflow(target: Path) -> None:
    for part in PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, target / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, target / part)


def timed(workdir: Path, *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    # The workflow edits no environment: its jobs run this venv's python, with the copy's package.
    environment = {**os.environ, "PATH": f"{Path(SNAKEMAKE).parent}{os.pathsep}{os.environ['PATH']}"}
    environment["PYTHONPATH"] = str(workdir / "src")
    done = subprocess.run(
        [SNAKEMAKE, "--cores", "2", *args], cwd=workdir, env=environment, capture_output=True, text=True, check=True
    )
    return time.perf_counter() - started, done.stdout + done.stderr


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        copy_workflow(workdir)
        with ForeignLoadMeter() as meter:
            # paper.yaml is sized for a cluster: with the local launcher its points do not fit this machine
            plan_s, plan = timed(workdir, "-n", "--configfile", "config/paper.yaml", "--config", PAPER_LAUNCHER)
        points = plan.count("rule run_point:")
        figure = f"dry run over every paper-scale point ({points} runs): {plan_s:.2f} s"
        print(judged(figure, plan_s <= PLAN_TARGET_S, f"<= {PLAN_TARGET_S:g} s", meter.load))

        print("building the smoke-scale results once (not timed) ...", flush=True)
        timed(workdir)
        with ForeignLoadMeter() as meter:
            noop_s, noop = timed(workdir)
        assert "Nothing to be done" in noop, noop
        figure = f"no-op rerun at smoke scale: {noop_s:.2f} s"
        print(judged(figure, noop_s <= NOOP_TARGET_S, f"<= {NOOP_TARGET_S:g} s", meter.load))


if __name__ == "__main__":
    main()
