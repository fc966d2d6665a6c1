"""IBM DLaaS scaling-efficiency table (artifacts.md §3): images/s and efficiency vs workers, one model and batch.

Points: one throughput run per number of workers. Plot: total images/s against the ideal, and efficiency
rate_N / (N × rate_1) beside the DLaaS measurements; the summary table is the DLaaS-style table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.figures.common import throughput_points
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "dlaas-scaling"
TITLE = "DLaaS scaling efficiency: images/s and efficiency vs workers"

# ResNet-50, batch 128 per P100 (DLaaS benchmark report): workers -> (images/s, efficiency).
PAPER = {
    "object store, real data": {
        1: (226, 1.00),
        2: (426, 0.95),
        4: (704, 0.77),
        8: (1368, 0.76),
        16: (2576, 0.71),
    },
    "synthetic, host network": {1: (220, 1.00), 2: (436, 0.99), 4: (764, 0.87), 8: (1408, 0.80)},
    "synthetic, overlay network": {1: (220, 1.00), 2: (424, 0.95), 4: (652, 0.74), 8: (1240, 0.70)},
}


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    return throughput_points(ID, section, [section["model"]], launcher)


def plot(table: pd.DataFrame, scale: str) -> tuple[Figure, pd.DataFrame]:
    from ddlrepro import plotting

    summary = plotting.throughput_summary(table, by=["model", "batch_size"])
    figure, (rate, efficiency) = plotting.new_figure(2, TITLE)

    rate.bar(summary["workers"], summary["total"], width=summary["workers"] * 0.35, label="measured", alpha=0.8)
    rate.plot(summary["workers"], summary["ideal_total"], "k--", label="ideal (N × rate₁)")
    efficiency.plot(summary["workers"], summary["efficiency"], "o-", label="measured")
    for label, series in PAPER.items():
        workers = sorted(series)
        efficiency.plot(
            workers,
            [series[n][1] for n in workers],
            marker="s",
            linestyle=":",
            alpha=0.7,
            label=f"DLaaS: {label}",
        )
        if scale == "paper":
            rate.plot(
                workers,
                [series[n][0] for n in workers],
                marker="s",
                linestyle=":",
                alpha=0.7,
                label=f"DLaaS: {label}",
            )
    rate.set_ylabel("images/s (all workers)")
    efficiency.set_ylabel("scaling efficiency  rate_N / (N × rate_1)")
    efficiency.set_ylim(0, 1.1)
    plotting.workers_axis(rate, summary["workers"])
    plotting.workers_axis(efficiency, [*summary["workers"], *(n for series in PAPER.values() for n in series)])
    for axis in (rate, efficiency):
        axis.legend(fontsize="small")
    columns = ["model", "batch_size", "workers", "total", "per_worker", "confidence", "efficiency"]
    return figure, summary[columns].rename(columns={"total": "images_per_sec"})
