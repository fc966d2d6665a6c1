"""Workflow overhead: Snakemake's planning time over every paper-scale point (target ≤ 5 s) and a no-op rerun
at smoke scale (target ≤ 3 s), each timed in this run on a private copy of the workflow. The smoke-scale results
are built once first (not timed; a whole `make reproduce` of work unless `--smoke-config` names a smaller config,
merged on top of config/config.yaml, e.g. tests/configs/tiny.yaml).

    python benchmarks/workflow_overhead.py [--smoke-config PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, BenchmarkRecord

from ddlrepro.host.hostload import ForeignLoadMeter

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
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
    environment = {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    environment["PYTHONPATH"] = str(workdir / "src")
    done = subprocess.run(
        [SNAKEMAKE, "--cores", "2", *args], cwd=workdir, capture_output=True, text=True, env=environment
    )
    if done.returncode:
        sys.exit(f"snakemake {' '.join(args)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return time.perf_counter() - started, done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke-config", type=Path, help="a config merged on top of config/config.yaml")
    args = parser.parse_args()
    smoke = ["--configfile", str(args.smoke_config.resolve())] if args.smoke_config else []
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        workdir = Path(scratch)
        copy_workflow(workdir)
        with ForeignLoadMeter() as meter:
            # paper.yaml is sized for a cluster: with the local launcher its points do not fit this machine
            plan_s, plan = timed(workdir, "-n", "--configfile", "config/paper.yaml", "--config", PAPER_LAUNCHER)
        points = plan.count("rule run_point:")
        what = f"`snakemake -n` over every paper-scale point ({points} runs)"
        record.add("dry-run", what, plan_s, "s", meter.load, runs=points)

        print("building the smoke-scale results once (not timed) ...", flush=True)
        timed(workdir, *smoke)
        with ForeignLoadMeter() as meter:
            noop_s, noop = timed(workdir, *smoke)
        assert "Nothing to be done" in noop, noop
        record.add("noop-rerun", "no-op rerun at smoke scale", noop_s, "s", meter.load)


if __name__ == "__main__":
    main()
