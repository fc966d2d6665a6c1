"""Verdict stability: does a second full run of the workflow, every run forced again, give the same verdict for
every check? The first verdict table is results/checks.tsv as `make reproduce` left it (built first when missing);
then every run is forced again (`snakemake --profile profiles/local --cores all --forcerun run_point`: the same
experiment, fresh processes) and the two tables are diffed check by check. Figures: the checks whose verdict
changed (target 0), the share of judged checks that are `inconclusive` in the second table (target ≤ 10 %), both
tables' headlines, and the forced rerun's wall time and host load. Both tables side by side:
results/benchmarks/verdict_stability.tsv.

    python benchmarks/verdict_stability.py [--cores N] [--configfile PATH ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from _common import REPO, RESULTS, BenchmarkRecord

from ddlrepro.host.checks import headline
from ddlrepro.host.figures import FIGURES
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.report import figure_runs

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
CHECKS = REPO / "results" / "checks.tsv"
KEY = ["figure", "check"]
SHOWN = ["tier", "status", "measured", "low", "high", "n"]


def workflow(options: argparse.Namespace, *extra: str) -> None:
    """The workflow, as `make reproduce` runs it (this environment's python first on PATH), plus `extra`."""
    configs = ["--configfile", *options.configfile] if options.configfile else []
    command = [SNAKEMAKE, "--profile", "profiles/local", "--cores", options.cores, *configs, *extra]
    environment = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run(command, cwd=REPO, check=True, env=environment)


def read_checks() -> pd.DataFrame:
    return pd.read_csv(CHECKS, sep="\t", dtype=str, keep_default_na=False)


def second_runs() -> pd.DataFrame:
    """One row per run of every built figure's runs table (the forced rerun's): its speed index and drift."""
    results = REPO / "results"
    built = [figure for figure in FIGURES if (results / "tables" / f"{figure}.csv").exists()]
    runs = [figure_runs(figure, results) for figure in built]
    return pd.concat([table for table in runs if "speed_drift" in table], ignore_index=True)


def side_by_side(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """One row per check: both runs' tier, status, value and interval, and whether the verdict changed."""
    both = first[KEY + SHOWN].merge(second[KEY + SHOWN], on=KEY, suffixes=("_first", "_second"), validate="1:1")
    return both.assign(changed=both["status_first"] != both["status_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", default="all")
    parser.add_argument("--configfile", nargs="*", default=[], help="config files after config/config.yaml")
    options = parser.parse_args()
    if not CHECKS.exists():
        workflow(options)
    first = read_checks()
    with BenchmarkRecord(__file__, options) as record:
        meter, started = ForeignLoadMeter().start(), time.monotonic()
        workflow(options, "--forcerun", "run_point")
        wall_s, load = time.monotonic() - started, meter.stop()
        second = read_checks()
        compared = side_by_side(first, second)
        RESULTS.mkdir(parents=True, exist_ok=True)
        compared.to_csv(RESULTS / "verdict_stability.tsv", sep="\t", index=False)
        changed = compared[compared["changed"]]
        names = [f"{row.figure}/{row.check}: {row.status_first} -> {row.status_second}" for row in changed.itertuples()]
        record.add("verdicts-changed", "checks whose verdict changed", len(changed), "checks", load, changed=names)
        judged = second[second["status"].isin(["pass", "fail", "inconclusive"])]
        share = (judged["status"] == "inconclusive").mean() if len(judged) else float("nan")
        record.add("inconclusive-share", "judged checks inconclusive (second run)", share, "share", load)
        headlines = {"first": headline(first), "second": headline(second)}
        record.add("forced-rerun", "every run forced again, wall time", wall_s, "s", load, **headlines)
        runs = second_runs()
        drift = runs["speed_drift"].abs()
        largest = {"largest": float(drift.max()), "runs": int(drift.notna().sum())}
        record.add(
            "speed-drift",
            "runs' machine-speed move, median |after/before - 1|",
            drift.median(),
            "share",
            load,
            **largest,
        )
        record.add(
            "machine-speed", "machine-speed index, median of the runs", runs["machine_speed"].median(), "M it/s", load
        )
    for line in names:
        print(f"  changed: {line}")


if __name__ == "__main__":
    main()
