"""EasyScale Fig 10: N logical workers on one machine as N packed processes or as N ESTs in one process.

Points: for every N, D1 training with N processes × 1 EST ("packed") and with 1 process × N ESTs ("ESTs").
Plot: the job's memory and median step time, against N. Memory is the sum over the job's processes of each one's
peak PSS (proportional set size, `/proc/<pid>/smaps_rollup`), so the libtorch pages packed processes share count
once; the sum of peak RSS, which counts them in every process, is kept beside it (`total_rss_mib`,
`memory_vs_packed_rss`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import consistent_point
from ddlrepro.host.figures.step_timing import median_step_time, peak_memory, timed_steps
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "easyscale-fig10"
TITLE = "EasyScale Fig 10: N logical workers as packed processes or as ESTs in one process"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    result = []
    for count in section["logical_worker_counts"]:
        for placement in ([1] * count, [count]):
            result.append(
                consistent_point(
                    ID, section, launcher, logical_workers=count, placement=placement, mode="D1", steps=section["steps"]
                )
            )
    return list({point.id: point for point in result}.values())


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per (layout, logical workers): median step time, summed peak memory, and memory against the packed processes'."""
    from ddlrepro.host import summaries

    steps = timed_steps(table, int(table["warmup_steps"].iloc[0]))
    steps["layout"] = steps["workers"].map(lambda workers: "ESTs in 1 process" if workers == 1 else "packed processes")
    timing = median_step_time(steps, by="point_id")
    runs = steps.drop_duplicates("point_id")[["point_id", "logical_workers", "layout"]]
    summary = runs.merge(timing, on="point_id").merge(peak_memory(table), on="point_id")
    summary = summaries.with_host_load(summary, table, ["point_id"])  # the step times; memory is not a timing
    summary = expand_single_worker(summary).sort_values(["layout", "logical_workers"], ignore_index=True)
    for measure, ratio in (("total_pss_mib", "memory_vs_packed"), ("total_rss_mib", "memory_vs_packed_rss")):
        packed = summary[summary["layout"] == "packed processes"].set_index("logical_workers")[measure]
        summary[ratio] = summary[measure] / summary["logical_workers"].map(packed)

    return summary.drop(columns="point_id")


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    figure, (memory, seconds) = plotting.new_figure(2, TITLE, panel_size=(6.2, 4.2))
    for layout, rows in summary.groupby("layout", sort=True):
        (line,) = memory.plot(rows["logical_workers"], rows["total_pss_mib"], marker="o", label=f"{layout}, PSS")
        memory.plot(rows["logical_workers"], rows["total_rss_mib"], linestyle=":", color=line.get_color(), label="RSS")
        seconds.plot(rows["logical_workers"], rows["step_time_s"], marker="o", label=layout)
    plotting.ring_disturbed(seconds, summary["logical_workers"], summary["step_time_s"], summary["disturbed"])
    memory.set_ylabel("job's summed peak PSS, RSS dotted (MiB)")
    seconds.set_ylabel("median step time (s)")
    plotting.note_disturbed(seconds, summary, ["layout", "logical_workers"])
    for axis in (memory, seconds):
        plotting.workers_axis(axis, summary["logical_workers"], label="number of logical workers N")
        axis.set_ylim(bottom=0)
        plotting.legend(axis)
    return figure


def expand_single_worker(summary: pd.DataFrame) -> pd.DataFrame:
    """N = 1 is both layouts (one process with one EST): list it under each."""
    import pandas as pd

    single = summary[summary["logical_workers"] == 1]
    return pd.concat([summary, single.assign(layout="packed processes")], ignore_index=True).drop_duplicates(
        ["logical_workers", "layout"]
    )
