"""Tidy tables: one row per point × worker × iteration × metric, with the point's parameters as columns."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ddlrepro.rundir import RESULT

POINT_COLUMNS = ["figure", "point_id", "workload", "workers", "threads_per_worker"]
RECORD_COLUMNS = ["rank", "iteration", "step", "time", "metric", "value"]


def run_rows(run_dir: Path) -> pd.DataFrame:
    """The tidy rows of one completed run (its `result.json` must exist)."""
    result = json.loads((run_dir / RESULT).read_text())
    point = result["point"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    rows = pd.DataFrame.from_records(records, columns=RECORD_COLUMNS)
    provenance = json.loads((run_dir / "provenance.json").read_text())
    constants = {
        "figure": point["figure"],
        "point_id": result["point_id"],
        "workload": point["workload"],
        "workers": point["workers"],
        "threads_per_worker": point["threads_per_worker"],
        **{key: scalar(value) for key, value in point["params"].items()},
        "backend_used": provenance["torch"]["backend"],
    }
    return rows.assign(**constants)[[*constants, *RECORD_COLUMNS]]


def scalar(value: object) -> object:
    """A table cell: lists and mappings (e.g. a placement [2, 1, 1]) as compact JSON."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else value


def tidy_table(run_dirs: list[Path]) -> pd.DataFrame:
    table = pd.concat([run_rows(run_dir) for run_dir in run_dirs], ignore_index=True)
    table[["iteration", "step"]] = table[["iteration", "step"]].astype("Int64")
    return table.sort_values(["point_id", "metric", "rank", "time"], kind="stable", ignore_index=True)


def read_table(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"iteration": "Int64", "step": "Int64"})
