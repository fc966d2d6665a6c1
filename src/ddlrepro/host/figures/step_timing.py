"""Shared by the EasyScale overhead figures (10–12): the timed steps of consistent-training runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


MEMORY_COLUMNS = {"pss_bytes": "total_pss_mib", "rss_bytes": "total_rss_mib"}


def timed_steps(table: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    """Per run and rank, the step and EST-switching times after the warm-up steps, one row per step."""
    timed = table[table["metric"].isin(["step_time_s", "switch_time_s"]) & (table["step"] >= warmup_steps)]
    keys = [column for column in ("point_id", "rank", "step") if column in timed]
    return (
        timed.pivot_table(index=keys, columns="metric", values="value")
        .reset_index()
        .merge(
            table.drop_duplicates("point_id").drop(columns=["rank", "iteration", "step", "time", "metric", "value"]),
            on="point_id",
        )
    )


def median_step_time(steps: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per `by`: the median over steps of the slowest rank's step time (a step ends when its last rank does)."""
    slowest = steps.groupby([by, "step"], as_index=False)["step_time_s"].max()
    return slowest.groupby(by, as_index=False)["step_time_s"].median()


def peak_memory(table: pd.DataFrame) -> pd.DataFrame:
    """Per run: the sum over its processes of each process's peak PSS and, beside it, peak RSS, in MiB; NaN for a
    run with no samples of one (its sampler was denied PSS), never 0."""
    sampled = table[table["metric"].isin(MEMORY_COLUMNS)]
    per_rank = sampled.pivot_table(index=["point_id", "rank"], columns="metric", values="value", aggfunc="max")
    missing = set(MEMORY_COLUMNS) - set(per_rank.columns)
    if missing:
        raise ValueError(
            f"no {', '.join(sorted(missing))} samples in the runs: rerun them with this version"
            " (PSS also needs /proc/<pid>/smaps_rollup to be readable)"
        )
    return (
        (per_rank.groupby("point_id").sum(min_count=1) / 2**20)
        .rename(columns=MEMORY_COLUMNS)[list(MEMORY_COLUMNS.values())]
        .reset_index()
    )
