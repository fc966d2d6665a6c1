"""IBM DLaaS scaling-efficiency table ("IBM Deep Learning Service", IBM J. Res. Dev. 2017): images/s and
efficiency vs workers, one model and batch.

Points: one throughput run per number of workers. Plot: total images/s against the ideal, and efficiency
rate_N / (N × rate_1) beside the DLaaS measurements; the summary table is the DLaaS-style table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import throughput_points
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "dlaas-scaling"
TITLE = "DLaaS scaling efficiency: images/s and efficiency vs workers"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    return throughput_points(ID, section, [section["model"]], launcher)


def plot(table: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> tuple[Figure, pd.DataFrame]:
    from ddlrepro.host import plotting

    summary = plotting.throughput_summary(table, by=["model", "batch_size"])
    figure, (rate, efficiency) = plotting.new_figure(2, TITLE, panel_size=(6.0, 4.2))

    bars = rate.bar(summary["workers"], summary["total"], width=summary["workers"] * 0.35, label="measured", alpha=0.8)
    plotting.hatch_disturbed(bars, summary["disturbed"])
    rate.plot(summary["workers"], summary["ideal_total"], "k--", label="ideal (N × rate₁)")
    efficiency.plot(summary["workers"], summary["efficiency"], "o-", label="measured")
    plotting.ring_disturbed(efficiency, summary["workers"], summary["efficiency"], summary["disturbed"])
    plotting.note_disturbed(efficiency, summary, ["workers"])
    for axis, column in ((rate, "images_per_sec"), (efficiency, "efficiency")):
        drawn = plotting.drawn_references(references, column, "workers", scale)
        for series, rows in drawn.groupby("series", sort=True):
            axis.plot(rows["workers"], rows["value"], marker="s", linestyle=":", alpha=0.7, label=series)
        plotting.workers_axis(axis, [*summary["workers"], *drawn["workers"]])
        plotting.legend(axis)
    rate.set_ylabel("throughput, all workers (images/s)")
    efficiency.set_ylabel("scaling efficiency (fraction of N × rate₁)")
    efficiency.set_ylim(0, 1.1)
    columns = ["model", "batch_size", "workers", "total", "per_worker", "confidence", "efficiency"]
    columns += plotting.HOST_LOAD_COLUMNS
    return figure, summary[columns].rename(columns={"total": "images_per_sec"})
