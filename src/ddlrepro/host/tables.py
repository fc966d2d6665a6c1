"""Tidy tables: one row per point × worker × iteration × metric, with the point's parameters as columns, and how
busy the host was with foreign work while the point measured (`foreign_share`, `steal_share`, `disturbed`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import pandas as pd

from ddlrepro.host.config import schema_default
from ddlrepro.host.rundir import RESULT, metric_records

POINT_COLUMNS = ["figure", "point_id", "workload", "workers", "threads_per_worker", "replicate"]
# `phase` and `interface`: a node's interface bytes (node_rx_bytes, node_tx_bytes) at the run's start and end.
# `est` and `phase`: a consistent-training step's piece (est_time_s): its EST and which piece (easyscale.StepLaps).
# `device_type`: the rank's emulated device type (rank/devicetypes.py); `setting`: which of the settings a paired
# run trains side by side the value is of (throughput's `settings`); `detail`: a note on the value (e.g. why a
# CPU quota was not applied).
RECORD_COLUMNS = [
    "rank",
    "iteration",
    "step",
    "est",
    "size_bytes",
    "phase",
    "interface",
    "device_type",
    "setting",
    "time",
    "metric",
    "value",
    "detail",
]
INTEGER_COLUMNS = ["iteration", "step", "est", "size_bytes"]
SKIPPED_METRIC = "skipped"
DEFAULT_MAX_FOREIGN_SHARE = schema_default("checks", "max_foreign_share")
DEFAULT_MAX_SPEED_DRIFT = schema_default("checks", "max_speed_drift")
HOST_LOAD_COLUMNS = ["foreign_share", "steal_share", "disturbed"]  # the run's load, as host_load_columns gives it
# The run's machine-speed index (hostload.machine_speed, the mean of before and after) and how far it moved
# (after ÷ before − 1); NaN where the ranks ran on other hosts or the run predates them. Per run, not summarised.
SPEED_COLUMNS = ["machine_speed", "speed_drift"]


def as_flags(column: pd.Series) -> pd.Series:
    """A `disturbed` column as booleans, however it was stored: bool, or 'True'/'False' read back from a CSV; a
    missing value counts as not disturbed."""
    return column.astype(str).str.lower().isin(["true", "1"])


def host_load_columns(
    result: dict[str, Any], max_foreign_share: float, max_speed_drift: float | None = DEFAULT_MAX_SPEED_DRIFT
) -> dict[str, object]:
    """A run's foreign and steal CPU shares (NaN when unknown), its machine-speed index and drift (SPEED_COLUMNS),
    and whether it was disturbed: foreign + steal above `max_foreign_share`, or (where `max_speed_drift` is set)
    the speed moved by more than it (either way) between just before and just after the run."""
    load = result.get("host_load") or {}
    foreign, steal, before, after = (
        float("nan") if load.get(key) is None else float(load[key])
        for key in ("foreign_share", "steal_share", "speed_before", "speed_after")
    )
    known_load = sum(share for share in (foreign, steal) if share == share)  # NaN (unknown) counts as none
    drift = after / before - 1
    moved = max_speed_drift is not None and abs(drift) > max_speed_drift  # False for NaN: unknown counts as steady
    return {
        "foreign_share": foreign,
        "steal_share": steal,
        "disturbed": known_load > max_foreign_share or moved,
        "machine_speed": (before + after) / 2,
        "speed_drift": drift,
    }


def run_rows(
    run_dir: Path,
    max_foreign_share: float = DEFAULT_MAX_FOREIGN_SHARE,
    max_speed_drift: float | None = DEFAULT_MAX_SPEED_DRIFT,
) -> pd.DataFrame:
    """The tidy rows of one completed run (its `result.json` must exist); a skipped run gives one row, metric
    `skipped`, with the reason in the `reason` column."""
    result = json.loads((run_dir / RESULT).read_text())
    point = result["point"]
    status = result.get("status", "ok")
    if status == "skipped":
        records = [{"metric": SKIPPED_METRIC, "value": float("nan")}]
    else:
        records = metric_records(run_dir)
        records += attempt_records(result.get("attempts", []))
    rows = pd.DataFrame.from_records(records, columns=RECORD_COLUMNS)
    provenance = json.loads((run_dir / "provenance.json").read_text())
    constants = {
        "figure": point["figure"],
        "point_id": result["point_id"],
        "workload": point["workload"],
        "workers": point["workers"],
        "threads_per_worker": point["threads_per_worker"],
        "replicate": point.get("replicate", 0),  # absent from runs made before replicates existed
        **{key: scalar(value) for key, value in point["params"].items()},
        "backend_used": provenance["torch"]["backend"],
        "status": status,
        "reason": result.get("reason", ""),
        **host_load_columns(result, max_foreign_share, max_speed_drift),
    }
    return rows.assign(**constants)[[*constants, *RECORD_COLUMNS]]


def attempt_records(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's attempts (result.json's, host/run.py) as rows: `attempt_wall_s` and, where a rank recorded how far
    it got, `attempt_steps_done`; iteration = the attempt, detail = its outcome and its error's last line."""
    records = []
    for attempt in attempts:
        last_line = attempt["error"].strip().splitlines()[-1].strip() if attempt["error"].strip() else ""
        common = {"rank": 0, "iteration": attempt["attempt"], "detail": f"{attempt['outcome']}: {last_line}".strip()}
        records.append(common | {"metric": "attempt_wall_s", "value": attempt["wall_s"]})
        if attempt.get("steps_done") is not None:
            records.append(common | {"metric": "attempt_steps_done", "value": attempt["steps_done"]})
    return records


def scalar(value: object) -> object:
    """A table cell: lists and mappings (e.g. a placement [2, 1, 1]) as compact JSON."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else value


def tidy_table(
    run_dirs: list[Path],
    max_foreign_share: float = DEFAULT_MAX_FOREIGN_SHARE,
    max_speed_drift: float | None = DEFAULT_MAX_SPEED_DRIFT,
) -> pd.DataFrame:
    """Every run's rows (a run's disturbance judged by the two thresholds, host_load_columns); a figure without runs
    (e.g. simulated from given profiles) gets an empty table."""
    if not run_dirs:
        return pd.DataFrame(columns=[*POINT_COLUMNS, *RECORD_COLUMNS])
    # In point-id order: a param only some runs have (device_types) then sits in the same column wherever the
    # runs are listed from (the workflow's input order, a bundle's folders).
    ordered = sorted(run_dirs, key=lambda run_dir: run_dir.name)
    table = pd.concat([run_rows(run_dir, max_foreign_share, max_speed_drift) for run_dir in ordered], ignore_index=True)
    table[INTEGER_COLUMNS] = table[INTEGER_COLUMNS].astype("Int64")
    return table.sort_values(["point_id", "metric", "rank", "time"], kind="stable", ignore_index=True)


def read_table(path: Path | IO[bytes]) -> pd.DataFrame:
    return pd.read_csv(path, dtype=dict.fromkeys(INTEGER_COLUMNS, "Int64"))


def by_replicate(table: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """A table's rows per replicate (a table from before replicates existed is replicate 0 alone)."""
    if "replicate" not in table or table.empty:
        return {0: table}
    return {int(replicate): rows for replicate, rows in table.groupby("replicate", sort=True)}
