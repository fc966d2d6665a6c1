"""Shared by the EasyScale overhead figures (10–12): the timed steps of consistent-training runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


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
    """Per run: the sum over its processes of each process's peak RSS, in MiB."""
    rss = table[table["metric"] == "rss_bytes"]
    per_rank = rss.groupby(["point_id", "rank"])["value"].max()
    return (per_rank.groupby("point_id").sum() / 2**20).rename("total_rss_mib").reset_index()
