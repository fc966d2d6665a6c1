"""EasyScale Fig 11: the cost of switching between ESTs (their RNG state and BatchNorm buffers) in one process.

Points: D1 training of N ESTs in one process, for every N. Plot: time spent switching ESTs per step, as a share
of the step time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import consistent_point
from ddlrepro.host.figures.step_timing import timed_steps
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "easyscale-fig11"
TITLE = "EasyScale Fig 11: EST context-switch overhead"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    return [
        consistent_point(
            ID, section, launcher, logical_workers=count, placement=[count], mode="D1", steps=section["steps"]
        )
        for count in section["logical_worker_counts"]
    ]


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per number of ESTs in the process: median step and switch times, and the switch's share of the step."""
    from ddlrepro.host import summaries

    steps = timed_steps(table, int(table["warmup_steps"].iloc[0]))
    summary = steps.groupby("logical_workers", as_index=False).agg(
        step_time_s=("step_time_s", "median"), switch_time_s=("switch_time_s", "median")
    )
    summary["switch_percent"] = 100 * summary["switch_time_s"] / summary["step_time_s"]
    summary = summaries.with_host_load(summary, table, ["logical_workers"])
    return summary


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    figure, (share,) = plotting.new_figure(1, TITLE, panel_size=(6.5, 4.2))
    bars = share.bar(summary["logical_workers"].astype(str), summary["switch_percent"], alpha=0.8, label="measured")
    plotting.hatch_disturbed(bars, summary["disturbed"])
    plotting.note_disturbed(share, summary, ["logical_workers"])
    share.axhspan(0.5, 2.0, color="grey", alpha=0.2, label="EasyScale: 0.5–2 % per iteration")
    share.set_xlabel("number of ESTs in the process")
    share.set_ylabel("EST switching, share of step time (%)")
    plotting.legend(share)
    return figure
