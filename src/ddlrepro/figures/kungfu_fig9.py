"""KungFu Fig 9: throughput scalability of synchronous data-parallel training (artifacts.md §1, Fig 9).

Points: one throughput run per (model, workers). Plot: per-worker img/s (mean ± 1.96·std) and total img/s with
the ideal linear line, per model; scaling efficiency rate_N / (N × rate_1) in the summary table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.figures.common import throughput_points
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "kungfu-fig9"
TITLE = "KungFu Fig 9: training throughput vs number of workers"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    return throughput_points(ID, section, section["models"], launcher)


def plot(table: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> tuple[Figure, pd.DataFrame]:
    from ddlrepro import plotting

    summary = plotting.throughput_summary(table, by=["model"])
    figure, (per_worker, total) = plotting.new_figure(2, TITLE)

    plotting.errorbar_lines(per_worker, summary, "per_worker", "confidence", hue="model")
    for series, rows in plotting.drawn_references(references, "per_worker", "workers", scale).groupby("series"):
        per_worker.plot(rows["workers"], rows["value"], label=series, **plotting.REFERENCE_STYLE)
    per_worker.set_ylabel("images/s per worker (mean ± 1.96·std)")
    per_worker.set_ylim(bottom=0)
    per_worker.legend(title="model")

    for model, rows in summary.groupby("model", sort=True):
        line = total.plot(rows["workers"], rows["total"], marker="o", label=f"{model}")[0]
        total.plot(
            rows["workers"],
            rows["ideal_total"],
            linestyle="--",
            color=line.get_color(),
            label=f"{model} ideal",
        )
    total.set_ylabel("total images/s")
    total.set_ylim(bottom=0)
    total.legend()
    for axis in (per_worker, total):
        plotting.workers_axis(axis, summary["workers"])
    return figure, summary
