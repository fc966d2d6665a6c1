"""Workflow overhead: Snakemake's planning time over every paper-scale point with the Slurm profile, with a Slurm
cluster running, with it stopped, and with none of ours configured (each target ≤ 5 s: the Slurm plugin queries
Slurm on every Snakemake start, which a stopped controller once made wait 9 s), and a no-op rerun at smoke scale
(target ≤ 3 s), each timed in this run on a private copy of the workflow. The cluster is scripts/slurm-cluster's
(root, or Slurm installed); without one, only the last dry run is timed. The smoke-scale results are built once
first (not timed; a whole `make reproduce` of work unless `--smoke-config` names a smaller config, merged on top of
config/config.yaml, e.g. tests/configs/tiny.yaml).

    python benchmarks/workflow_overhead.py [--smoke-config PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _common import REPO, BenchmarkRecord

from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.rank.datasets import CIFAR10_FILES, CIFAR10_MIN_BYTES

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
PARTS = ["Snakefile", "workflow", "src", "config", "profiles", "envs", "scripts", "containers", "pyproject.toml"]
SLURM_CLUSTER = str(REPO / "scripts" / "slurm-cluster")
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
# paper.yaml is sized for a cluster: under the Slurm profile the launcher follows its executor (Slurm).
# Fig 4 at paper scale reads CIFAR-10 from a data_dir it checks: the plan is given files of the right size (zeros,
# labelled so in the overlay's name), which it digests as it would the real ones.
PAPER_DATA = "paper-cifar10-stand-in.yaml"
PAPER_PLAN = ("-n", "--profile", "profiles/slurm", "--configfile", "config/paper.yaml", PAPER_DATA)


def cifar10_stand_in(workdir: Path) -> None:
    """Zero-filled files with CIFAR-10's names and sizes, and the config overlay that points Fig 4 at them."""
    folder = workdir / "cifar10-stand-in"
    folder.mkdir()
    for name in CIFAR10_FILES:
        with open(folder / name, "wb") as file:
            file.truncate(CIFAR10_MIN_BYTES)
    (workdir / PAPER_DATA).write_text(f"figures:\n  kungfu-fig4:\n    data_dir: {folder}\n")


def copy_workflow(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, target / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, target / part)


def timed(workdir: Path, *args: str, slurm_conf: Path | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    # The workflow edits no environment: its jobs run this venv's python, with the copy's package.
    environment = {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    environment["PYTHONPATH"] = str(workdir / "src")
    if slurm_conf is not None:
        environment["SLURM_CONF"] = str(slurm_conf)
    done = subprocess.run(
        [SNAKEMAKE, "--cores", "2", *args], cwd=workdir, capture_output=True, text=True, env=environment
    )
    if done.returncode:
        sys.exit(f"snakemake {' '.join(args)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return time.perf_counter() - started, done.stdout + done.stderr


@contextlib.contextmanager
def slurm_cluster(state: Path) -> Iterator[bool]:
    """scripts/slurm-cluster's single-node cluster in `state`, stopped afterwards; yields whether it started."""
    started = subprocess.run([SLURM_CLUSTER, "start", str(state)], capture_output=True, text=True, timeout=600)
    if started.returncode:
        print(f"no Slurm cluster ({started.stderr.strip().splitlines()[-1:]}): the dry run is timed without one")
    try:
        yield started.returncode == 0
    finally:
        subprocess.run([SLURM_CLUSTER, "stop", str(state)], capture_output=True, timeout=60)


def forget_default_link(state: Path) -> None:
    """As root the cluster linked /etc/slurm/slurm.conf to its config in `state`: remove the link with the folder."""
    if DEFAULT_CONF.is_symlink() and DEFAULT_CONF.resolve().is_relative_to(state.resolve()):
        DEFAULT_CONF.unlink()


def time_paper_plan(workdir: Path, record: BenchmarkRecord, figure_id: str, state: str, conf: Path | None) -> None:
    with ForeignLoadMeter() as meter:
        plan_s, plan = timed(workdir, *PAPER_PLAN, slurm_conf=conf)
    points = plan.count("rule run_point:")
    what = f"`snakemake -n --profile slurm` over every paper-scale point ({points} runs), {state}"
    record.add(figure_id, what, plan_s, "s", meter.load, runs=points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke-config", type=Path, help="a config merged on top of config/config.yaml")
    args = parser.parse_args()
    smoke = ["--configfile", str(args.smoke_config.resolve())] if args.smoke_config else []
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        workdir = Path(scratch) / "workflow"
        copy_workflow(workdir)
        cifar10_stand_in(workdir)
        state = Path(scratch) / "slurm"
        conf = state / "slurm.conf"
        with slurm_cluster(state) as running:
            if running:
                time_paper_plan(workdir, record, "dry-run-slurm-running", "Slurm cluster running", conf)
        if running:
            time_paper_plan(workdir, record, "dry-run-slurm-stopped", "Slurm cluster stopped", conf)
        forget_default_link(state)
        time_paper_plan(workdir, record, "dry-run", "no Slurm cluster of ours configured", None)

        print("building the smoke-scale results once (not timed) ...", flush=True)
        timed(workdir, *smoke)
        with ForeignLoadMeter() as meter:
            noop_s, noop = timed(workdir, *smoke)
        assert "Nothing to be done" in noop, noop
        record.add("noop-rerun", "no-op rerun at smoke scale", noop_s, "s", meter.load)


if __name__ == "__main__":
    main()
