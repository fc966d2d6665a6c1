"""What figures' summaries share (pandas only, no matplotlib: the checks read summaries without drawing anything):
throughput per worker with its spread, and the host load of the runs behind each value."""

from __future__ import annotations

import pandas as pd

from ddlrepro.host.tables import HOST_LOAD_COLUMNS as HOST_LOAD_COLUMNS  # the figures read it here
from ddlrepro.host.tables import as_flags

CONFIDENCE_Z = 1.96


def throughput_summary(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per (group, workers): per-worker img/s mean ± 1.96·std over all ranks' iterations, total, efficiency.

    Efficiency is rate_N / (N × rate_1); where a group has no 1-worker point, its smallest worker count stands in
    for 1 (rate_N / (N/N0 × rate_N0)).
    """
    rates = table[table["metric"] == "img_per_sec"]
    grouped = rates.groupby([*by, "workers"], sort=True)["value"]
    summary = grouped.agg(per_worker="mean", std=lambda v: v.std(ddof=0), samples="count").reset_index()
    summary["confidence"] = CONFIDENCE_Z * summary.pop("std")
    summary["total"] = summary["workers"] * summary["per_worker"]
    base = summary.loc[summary.groupby(by)["workers"].idxmin(), [*by, "per_worker"]]
    summary = summary.merge(base.rename(columns={"per_worker": "base_per_worker"}), on=by)
    summary["ideal_total"] = summary["workers"] * summary.pop("base_per_worker")
    summary["efficiency"] = summary["total"] / summary["ideal_total"]
    return with_base_load(with_host_load(summary, table, [*by, "workers"]), by)


def with_base_load(summary: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Fold the load of each group's smallest-worker-count rows into the group's rows: efficiency divides by them."""
    smallest = summary["workers"] == summary.groupby(by, dropna=False)["workers"].transform("min")
    base = (
        summary[smallest]
        .groupby(by, dropna=False)
        .agg(
            foreign_base=("foreign_share", "max"),
            steal_base=("steal_share", "max"),
            disturbed_base=("disturbed", "any"),
        )
    )
    merged = summary.join(base, on=by)
    merged["foreign_share"] = merged[["foreign_share", "foreign_base"]].max(axis=1)
    merged["steal_share"] = merged[["steal_share", "steal_base"]].max(axis=1)
    merged["disturbed"] = merged["disturbed"] | merged["disturbed_base"].fillna(False).astype(bool)
    return merged.drop(columns=["foreign_base", "steal_base", "disturbed_base"])


def skipped_points(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The points a machine could not run: their `by` columns and the reason (e.g. "skipped: needs CUDA")."""
    if "status" not in table:
        return pd.DataFrame(columns=[*by, "workers", "status", "reason"])
    skipped = table[table["status"] == "skipped"]
    return skipped[[*by, "workers", "status", "reason"]].drop_duplicates().reset_index(drop=True)


def run_host_load(table: pd.DataFrame) -> pd.DataFrame:
    """The tidy table with its host-load columns present (tables made before they existed: unknown, judged)."""
    defaults = {"foreign_share": float("nan"), "steal_share": float("nan"), "disturbed": False}
    missing = {column: value for column, value in defaults.items() if column not in table}
    table = table.assign(**missing)
    return table.assign(disturbed=as_flags(table["disturbed"]))


def with_host_load(summary: pd.DataFrame, table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """`summary` with the host load of the runs behind each row, matched on `by`: the largest foreign and steal
    shares, and disturbed if any of those runs was."""
    table = run_host_load(table)
    load = table.groupby(by, dropna=False).agg(
        foreign_share=("foreign_share", "max"), steal_share=("steal_share", "max"), disturbed=("disturbed", "any")
    )
    merged = summary.drop(columns=HOST_LOAD_COLUMNS, errors="ignore").join(load, on=by)
    merged["disturbed"] = merged["disturbed"].fillna(False).astype(bool)
    return merged


def fold_load(summary: pd.DataFrame, table: pd.DataFrame, baseline: pd.Series) -> pd.DataFrame:
    """Count the load of the runs every summary value is relative to (`baseline`, a mask of tidy rows: a ratio's
    denominator) in every row."""
    base = run_host_load(table)[baseline]
    if base.empty:
        return summary
    return summary.assign(
        foreign_share=summary["foreign_share"].clip(lower=base["foreign_share"].max()),
        steal_share=summary["steal_share"].clip(lower=base["steal_share"].max()),
        disturbed=summary["disturbed"] | bool(base["disturbed"].any()),
    )
