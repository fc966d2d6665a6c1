"""KungFu Fig 9: throughput scalability of synchronous data-parallel training, by framework and strategy
("KungFu: Making Training in Distributed Machine Learning Adaptive", OSDI 2020, Fig 9; artifact lsds/KungFu).

Points: one throughput run per (model, variant, workers). A variant is a framework and how it averages gradients:
`torch/<STRATEGY>` (DDP with one of KungFu's strategies, strategies.py; at 1 worker only RING, as there is nothing
to exchange), `horovod/<controller>` (horovod.torch over gloo or MPI: the paper's baseline) and `tensorflow`
(MultiWorkerMirroredStrategy, RING). Plot: per-worker img/s (mean ± 1.96·std) vs workers per variant, one panel
per model; and at the largest worker count, each variant's per-worker img/s ÷ Horovod's. Summary: per variant
and workers, with the scaling efficiency rate_N / (N × rate_1) against the framework's own 1-worker run, and
`efficiency_vs_ceiling`: the per-worker rate ÷ that of as many independent torch processes at once (a run of its
own per model and worker count, not drawn: the host's parallel ceiling; on a small VM two busy cores each run
slower than one, which caps the paper's efficiency before any communication; ours, not the paper's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import host_ceiling_point, is_ceiling, throughput_point, with_efficiency_vs_ceiling
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "kungfu-fig9"
TITLE = "KungFu Fig 9: training throughput vs workers, by framework and strategy"
BASELINE = "horovod"


def variants(section: dict[str, Any], workers: int) -> list[dict[str, Any]]:
    """The (framework, strategy, controller) settings of the points with `workers` workers."""
    settings: list[dict[str, Any]] = []
    for framework in section["frameworks"]:
        if framework == "torch":
            strategies = section["strategies"] if workers > 1 else ["RING"]
            settings += [{"framework": "torch", "strategy": strategy} for strategy in strategies]
        elif framework == "horovod":
            settings += [
                {"framework": "horovod", "strategy": "RING", "horovod_controller": controller}
                for controller in section["horovod_controllers"]
            ]
        else:
            settings.append({"framework": framework, "strategy": "RING"})
    return settings


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    """Every (model, workers, variant), and at each worker count above 1 the host's parallel ceiling (that many
    independent torch processes) that the 2-worker efficiency is judged against at smoke scale."""
    runs = [
        throughput_point(ID, section, model, workers, launcher, **setting)
        for model in section["models"]
        for workers in section["workers"]
        for setting in variants(section, workers)
    ]
    ceilings = [
        host_ceiling_point(ID, section, model, workers, launcher, framework="torch")
        for model in section["models"]
        for workers in section["workers"]
        if workers > 1 and section.get("host_ceiling")
    ]
    return runs + ceilings


def variant_labels(table: pd.DataFrame) -> pd.Series:
    """`torch/STAR`, `horovod/gloo`, `tensorflow`: what a legend and the summary call a variant."""
    controller = table.get("horovod_controller")
    labels = table["framework"].where(table["framework"] != "torch", "torch/" + table["strategy"])
    if controller is not None:
        labels = labels.where(table["framework"] != "horovod", "horovod/" + controller.fillna("gloo"))
    return labels


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per (model, variant, workers): per-worker img/s, total, efficiency against the framework's 1-worker rate,
    and the ratio to Horovod's per-worker rate at the same model and workers."""
    from ddlrepro.host import summaries

    table = table.assign(variant=variant_labels(table))
    ceilings, table = table[is_ceiling(table)], table[~is_ceiling(table)]
    summary = summaries.throughput_summary(table, by=["model", "framework", "strategy", "variant"])
    smallest = summary.groupby(["model", "framework"])["workers"].transform("min")
    base = summary[summary["workers"] == smallest].groupby(["model", "framework"])["per_worker"].mean().rename("base")
    summary = summary.join(base, on=["model", "framework"])
    summary["ideal_total"] = summary["workers"] * summary.pop("base")
    summary["efficiency"] = summary["total"] / summary["ideal_total"]
    summary = summaries.with_base_load(summary, ["model", "framework"])  # efficiency ÷ the framework's own base
    horovod = summary[summary["framework"] == BASELINE].groupby(["model", "workers"])["per_worker"].max()
    summary = summary.join(horovod.rename("horovod_per_worker"), on=["model", "workers"])
    summary["vs_horovod"] = summary["per_worker"] / summary.pop("horovod_per_worker")
    summary = summaries.fold_load(summary, table, table["framework"] == BASELINE)  # vs_horovod is ÷ Horovod's
    return with_efficiency_vs_ceiling(summary, ceilings, ["model"])


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    models = sorted(summary["model"].unique())
    figure, axes = plotting.new_figure(len(models) + 1, TITLE)
    drawn = plotting.drawn_references(references, "per_worker", "workers", scale)
    for axis, model in zip(axes, models, strict=False):
        rows = summary[summary["model"] == model]
        plotting.errorbar_lines(axis, rows, "per_worker", "confidence", hue="variant")
        for series, rows_drawn in drawn.groupby("series"):
            axis.plot(rows_drawn["workers"], rows_drawn["value"], label=series, **plotting.REFERENCE_STYLE)
        plotting.panel_title(axis, model)
        axis.set_ylabel("throughput per worker (images/s)")
        axis.set_ylim(bottom=0)
        plotting.workers_axis(axis, rows["workers"])
        plotting.legend(axis, title="framework/strategy")
        plotting.note_disturbed(axis, rows, ["model", "variant", "workers"])
    ratio_panel(axes[-1], summary)
    return figure


def ratio_panel(axis: Any, summary: pd.DataFrame) -> None:
    """At the largest worker count: each variant's per-worker rate ÷ Horovod's, per model."""
    largest = summary[summary["workers"] == summary["workers"].max()].dropna(subset=["vs_horovod"])
    if largest.empty:
        axis.text(0.5, 0.5, "no Horovod point configured", ha="center", transform=axis.transAxes)
        axis.set_xticks([])
        axis.set_yticks([])
        return
    from ddlrepro.host import plotting

    plotting.grouped_bars(axis, largest, x="variant", y="vs_horovod", hue="model")
    axis.axhline(1.0, color="black", linewidth=0.8)
    plotting.panel_title(axis, f"{int(summary['workers'].max())} workers")
    axis.set_ylabel("throughput per worker ÷ Horovod's (ratio)")
    axis.set_xlabel("framework/strategy")
    axis.tick_params(axis="x", rotation=30)
    plotting.legend(axis, title="model")
