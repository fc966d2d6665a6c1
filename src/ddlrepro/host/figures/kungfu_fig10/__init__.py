"""KungFu Fig 10: training throughput with NCCL against gloo, per communication strategy ("KungFu: Making Training
in Distributed Machine Learning Adaptive", OSDI 2020, Fig 10; artifact lsds/KungFu).

Points: one torch throughput run per (backend, strategy), same model, batch and workers. NCCL needs CUDA: on a
machine without it those points are not run and are reported as skipped, with the reason ("skipped: needs
CUDA"), in the table, the summary, the figure and the checks. gloo points train on the GPUs where there are
some (device `auto`), else on the CPU.
Plot: per-worker img/s (mean ± 1.96·std) per backend and strategy, the paper's NCCL number drawn in at paper
scale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import throughput_point
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "kungfu-fig10"
TITLE = "KungFu Fig 10: throughput with NCCL vs gloo, by strategy"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    return [
        throughput_point(
            ID,
            section,
            section["model"],
            section["workers"],
            launcher,
            backend=backend,
            strategy=strategy,
            device="auto",
        )
        for backend in section["backends"]
        for strategy in section["strategies"]
    ]


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    from ddlrepro.host import summaries

    measured = table[table["status"] == "ok"]
    summary = summaries.throughput_summary(measured, by=["backend", "strategy"]) if not measured.empty else None
    columns = ["backend", "strategy", "workers", "per_worker", "confidence", "total", *summaries.HOST_LOAD_COLUMNS]
    summary = (summary[columns] if summary is not None else pd.DataFrame(columns=columns)).assign(
        status="ok", reason=""
    )
    skipped = summaries.skipped_points(table, ["backend", "strategy"])
    return pd.concat([summary, skipped], ignore_index=True)


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    figure, (rates,) = plotting.new_figure(1, TITLE, panel_size=(7.5, 5.2))
    labels = summary["backend"] + "/" + summary["strategy"]
    heights = summary["per_worker"].astype(float).fillna(0.0)
    errors = summary["confidence"].astype(float).fillna(0.0)
    bars = rates.bar(range(len(summary)), heights, yerr=errors, capsize=4, alpha=0.8)
    plotting.hatch_disturbed(bars, summary["disturbed"].fillna(False).astype(bool))
    plotting.note_disturbed(rates, summary, ["backend", "strategy"])
    for position, row in enumerate(summary.itertuples()):
        if row.status == "skipped":
            plotting.note_skipped_slot(rates, position, row.reason)
    drawn = plotting.drawn_references(references, "per_worker", "backend", scale)
    for series, rows in drawn.groupby("series"):
        positions = [i for i, backend in enumerate(summary["backend"]) if backend in set(rows["backend"])]
        rates.plot(positions, [rows["value"].iloc[0]] * len(positions), label=series, **plotting.REFERENCE_STYLE)
    rates.set_xticks(range(len(summary)), labels, rotation=20)
    rates.set_xlim(-0.5, len(summary) - 0.5)
    rates.set_xlabel("backend/strategy")
    rates.set_ylabel("throughput per worker (images/s)")
    plotting.panel_title(rates, f"{int(summary['workers'].max())} workers")
    if not drawn.empty:
        plotting.legend(rates)
    return figure
