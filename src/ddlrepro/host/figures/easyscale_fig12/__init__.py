"""EasyScale Fig 12: step time of consistent training (D0, D1) normalised to plain DDP at the same global batch.

Points: plain DDP on P processes with a per-process batch of E/P × b; D0 and D1 with E ESTs of batch b on the same
P processes. Plot: median step time (slowest rank per step, after warm-up) of each, and its ratio to DDP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import consistent_point, require
from ddlrepro.host.figures.step_timing import median_step_time, timed_steps
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "easyscale-fig12"
TITLE = "EasyScale Fig 12: step time normalised to plain DDP (same global batch)"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    logical, processes, steps = section["logical_workers"], section["workers"], section["steps"]
    require(logical % processes == 0, ID, "workers", f"{processes} processes cannot share {logical} ESTs evenly")
    per_process = logical // processes
    ddp_section = {**section, "batch_size": section["batch_size"] * per_process}
    result = [
        consistent_point(
            ID, ddp_section, launcher, logical_workers=processes, placement=[1] * processes, mode="ddp", steps=steps
        )
    ]
    for mode in ("D0", "D1"):
        result.append(
            consistent_point(
                ID,
                section,
                launcher,
                logical_workers=logical,
                placement=[per_process] * processes,
                mode=mode,
                steps=steps,
            )
        )
    return result


def step_times(table: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    summary = median_step_time(timed_steps(table, warmup_steps), by="mode")
    summary["normalised_to_ddp"] = summary["step_time_s"] / summary.set_index("mode").loc["ddp", "step_time_s"]
    return summary.set_index("mode").loc[["ddp", "D0", "D1"]].reset_index()


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per training mode: the slowest rank's median step time and its ratio to plain DDP's."""
    from ddlrepro.host import summaries

    summary = step_times(table, int(table["warmup_steps"].iloc[0]))
    summary = summaries.with_host_load(summary, table, ["mode"])
    summary = summaries.fold_load(summary, table, table["mode"] == "ddp")  # every ratio is ÷ plain DDP's
    return summary


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting, summaries

    figure, (seconds, ratio) = plotting.new_figure(2, TITLE)
    own = summaries.with_host_load(summary.drop(columns=summaries.HOST_LOAD_COLUMNS), table, ["mode"])
    plotting.hatch_disturbed(seconds.bar(summary["mode"], summary["step_time_s"], alpha=0.8), own["disturbed"])
    seconds.set_xlabel("training mode")
    seconds.set_ylabel("median step time, slowest rank (s)")
    bars = ratio.bar(summary["mode"], summary["normalised_to_ddp"], alpha=0.8, label="measured")
    plotting.hatch_disturbed(bars, summary["disturbed"])
    plotting.note_disturbed(ratio, summary, ["mode"])
    for series, rows in plotting.drawn_references(references, "normalised_to_ddp", "mode", scale).groupby("series"):
        ratio.plot(rows["mode"], rows["value"], label=series, **plotting.REFERENCE_STYLE)
    ratio.axhline(1.0, color="black", linewidth=0.8)
    ratio.set_xlabel("training mode")
    ratio.set_ylabel("step time ÷ plain DDP's (ratio)")
    plotting.legend(ratio)
    return figure
