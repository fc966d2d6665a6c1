"""KungFu Fig 8: the cost of online training monitors ("KungFu: Making Training in Distributed Machine Learning
Adaptive", OSDI 2020, Fig 8; artifact lsds/KungFu).

Points: one throughput run per monitor setting (`none`, `noise-scale@k`, `variance@k`: monitor on every k-th
step), same model, batch and workers. Plot: per-worker img/s (mean ± 1.96·std) with the overhead against `none`
and the paper's ratios drawn in; the monitored values over steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import throughput_point
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "kungfu-fig8"
TITLE = "KungFu Fig 8: throughput cost of online monitoring"

MONITORED_METRICS = {"noise-scale": "noise_scale", "variance": "gradient_variance"}
# The gradient noise scale B_simple = tr(Σ)/|G|² is a batch size; the variance is of the gradient's elements.
MONITORED_UNITS = {"noise_scale": "samples", "gradient_variance": "Σ‖Var g‖, grad²"}


def parse_setting(setting: str) -> dict[str, Any]:
    """`variance@8` → {monitor: variance, monitor_interval: 8}; `none` → {monitor: none}."""
    if setting == "none":
        return {"monitor": "none"}
    monitor, interval = setting.split("@")
    return {"monitor": monitor, "monitor_interval": int(interval)}


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    return [
        throughput_point(
            ID,
            section,
            section["model"],
            section["workers"],
            launcher,
            noise_scale_alpha=section["noise_scale_alpha"],
            **parse_setting(setting),
        )
        for setting in section["monitors"]
    ]


def setting_labels(table: pd.DataFrame) -> pd.Series:
    interval = table["monitor_interval"].astype("Int64").astype(str)
    return table["monitor"].where(table["monitor"] == "none", table["monitor"] + "@" + interval)


def plot(table: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> tuple[Figure, pd.DataFrame]:
    from ddlrepro.host import plotting

    table = table.assign(setting=setting_labels(table))
    order = [
        s for s in ("none", "noise-scale@1", "noise-scale@8", "variance@1", "variance@8") if s in set(table["setting"])
    ]
    order += sorted(set(table["setting"]) - set(order))
    summary = plotting.throughput_summary(table, by=["setting"]).set_index("setting").loc[order].reset_index()
    summary = plotting.fold_load(summary, table, table["setting"] == "none")  # every ratio is ÷ none
    baseline = summary.set_index("setting")["per_worker"].get("none")
    summary["overhead_percent"] = 100 * (1 - summary["per_worker"] / baseline) if baseline else float("nan")
    summary["measured_ratio"] = summary["per_worker"] / baseline if baseline else float("nan")
    paper_ratios = plotting.drawn_references(references, "measured_ratio", "setting", scale)
    summary["paper_ratio"] = summary["setting"].map(paper_ratios.set_index("setting")["value"])

    figure, (rates, noise, variance) = plotting.new_figure(3, TITLE, panel_size=(5.0, 4.4))
    positions = range(len(summary))
    bars = rates.bar(
        positions, summary["per_worker"], yerr=summary["confidence"], capsize=4, alpha=0.8, label="measured"
    )
    plotting.hatch_disturbed(bars, summary["disturbed"])
    plotting.note_disturbed(rates, summary, ["setting"])
    for position, row in zip(positions, summary.itertuples(), strict=True):
        if row.setting != "none" and baseline:
            rates.annotate(
                f"{row.overhead_percent:+.1f} %",
                (position, row.per_worker),
                ha="center",
                va="bottom",
                xytext=(0, 14),
                textcoords="offset points",
            )
    if baseline:
        with_reference = summary.dropna(subset=["paper_ratio"])
        rates.plot(
            with_reference.index,
            baseline * with_reference["paper_ratio"],
            label="paper ratio × none",
            **plotting.REFERENCE_STYLE,
        )
    rates.set_xticks(list(positions), summary["setting"].str.replace("@", "\n@"))
    rates.set_xlabel("monitor (@k: on every k-th step)")
    rates.set_ylabel("throughput per worker (images/s)")
    rates.margins(y=0.15)  # room above the bars for the overheads
    plotting.legend(rates)

    for axis, (monitor, metric) in zip((noise, variance), MONITORED_METRICS.items(), strict=True):
        values = table[(table["metric"] == metric) & (table["rank"] == 0)]
        for setting, rows in values.groupby("setting", sort=True):
            axis.plot(rows["step"], rows["value"], marker=".", label=setting)
        plotting.panel_title(axis, metric.replace("_", " "))
        axis.set_xlabel("training step")
        axis.set_ylabel(f"{metric.replace('_', ' ')} (rank 0, {MONITORED_UNITS[metric]})")
        if values.empty:
            axis.text(0.5, 0.5, f"no {monitor} point configured", ha="center", transform=axis.transAxes)
        else:
            plotting.legend(axis)
    columns = ["setting", "workers", "per_worker", "confidence", "overhead_percent", "measured_ratio", "paper_ratio"]
    columns += plotting.HOST_LOAD_COLUMNS
    return figure, summary[columns]
