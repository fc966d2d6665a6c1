"""KungFu Fig 8: the cost of online training monitors ("KungFu: Making Training in Distributed Machine Learning
Adaptive", OSDI 2020, Fig 8; artifact lsds/KungFu).

Points: one throughput run (per replicate) training every monitor setting (`none`, `noise-scale@k`,
`variance@k`: monitor on every k-th step) side by side in the same processes, same model, batch and workers,
taking turns iteration by iteration (the throughput workload's `settings`): each ratio to `none` is paired, so the
machine's drift between runs cancels (as benchmarks/monitor_overhead.py measures it; the paper ran one job per
setting). Plot: per-worker img/s (mean ± 1.96·std) with the overhead against `none`
and the paper's ratios drawn in; the monitored values over steps: the noise scale, beside the smoothed |G|² and S
it is the ratio of, and the gradient variance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import throughput_point
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ID = "kungfu-fig8"
TITLE = "KungFu Fig 8: throughput cost of online monitoring"

# The noise scale's two smoothed estimates, |G|² and S = tr(Σ), both in squared gradient units.
NOISE_PARTS = {"noise_scale_gradient_sq": "|G|² (EMA)", "noise_scale_trace": "S = tr Σ (EMA)"}


def parse_setting(setting: str) -> dict[str, Any]:
    """`variance@8` → {monitor: variance, monitor_interval: 8}; `none` → {monitor: none}."""
    if setting == "none":
        return {"monitor": "none"}
    monitor, interval = setting.split("@")
    return {"monitor": monitor, "monitor_interval": int(interval)}


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    settings = [parse_setting(setting) for setting in section["monitors"]]
    model, workers, alpha = section["model"], section["workers"], section["noise_scale_alpha"]
    aggregation = section["noise_scale_aggregation"]
    return [
        throughput_point(
            ID,
            section,
            model,
            workers,
            launcher,
            noise_scale_alpha=alpha,
            noise_scale_aggregation=aggregation,
            settings=settings,
        )
    ]


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per monitor setting: per-worker img/s, and its overhead and ratio against no monitor (`none`)."""
    from ddlrepro.host import summaries

    settings = set(table["setting"].dropna())
    order = [s for s in ("none", "noise-scale@1", "noise-scale@8", "variance@1", "variance@8") if s in settings]
    order += sorted(settings - set(order))
    summary = summaries.throughput_summary(table, by=["setting"]).set_index("setting").loc[order].reset_index()
    summary = summaries.fold_load(summary, table, table["setting"] == "none")  # every ratio is ÷ none
    baseline = summary.set_index("setting")["per_worker"].get("none")
    summary["overhead_percent"] = 100 * (1 - summary["per_worker"] / baseline) if baseline else float("nan")
    summary["measured_ratio"] = summary["per_worker"] / baseline if baseline else float("nan")
    columns = ["setting", "workers", "per_worker", "confidence", "overhead_percent", "measured_ratio"]
    return summary[columns + summaries.HOST_LOAD_COLUMNS]


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    baseline = summary.set_index("setting")["per_worker"].get("none")
    paper_ratios = plotting.drawn_references(references, "measured_ratio", "setting", scale)
    summary = summary.assign(paper_ratio=summary["setting"].map(paper_ratios.set_index("setting")["value"]))

    figure, (rates, noise, parts, variance) = plotting.new_figure(4, TITLE, panel_size=(5.0, 4.4))
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

    monitored = table[table["rank"] == 0]
    plot_noise_scale(noise, parts, monitored, table)
    plot_variance(variance, monitored)
    return figure


def monitored_lines(axis: Axes, values: pd.DataFrame, label: str = "{setting}", **style: Any) -> None:
    for setting, rows in values.groupby("setting", sort=True):
        axis.plot(rows["step"], rows["value"], marker=".", label=label.format(setting=setting), **style)
    axis.set_xlabel("training step")


def plot_noise_scale(noise: Axes, parts: Axes, monitored: pd.DataFrame, table: pd.DataFrame) -> None:
    """(b) B_simple = S_ema / |G|²_ema; (c) the two EMAs it divides, on a symmetric log scale (|G|² may dip below 0)."""
    from ddlrepro.host import plotting

    values = monitored[monitored["metric"] == "noise_scale"]
    monitored_lines(noise, values)
    noise.set_ylabel("noise scale B_simple (rank 0, samples)")
    plotting.panel_title(noise, f"noise scale, {smoothing(table)}")
    for (metric, label), style in zip(NOISE_PARTS.items(), ("-", "--"), strict=True):
        monitored_lines(parts, monitored[monitored["metric"] == metric], f"{label}, {{setting}}", linestyle=style)
    parts.set_ylabel("estimate (rank 0, grad²)")
    plotting.panel_title(parts, "what (b) divides: S / |G|²")
    if values.empty:
        for axis in (noise, parts):
            axis.text(0.5, 0.5, "no noise-scale point configured", ha="center", transform=axis.transAxes)
        return
    parts.set_yscale(
        "symlog", linthresh=1e-3 * float(monitored[monitored["metric"].isin(NOISE_PARTS)]["value"].abs().max())
    )
    plotting.legend(noise)
    plotting.legend(parts)


def smoothing(table: pd.DataFrame) -> str:
    """The smoothing the noise-scale runs used, e.g. `EMAs α=0.9`."""
    alpha = table.loc[table["setting"].str.startswith("noise-scale", na=False), "noise_scale_alpha"].dropna().unique()
    return f"EMAs α={alpha[0]:g}" if len(alpha) == 1 else "EMAs"


def plot_variance(axis: Axes, monitored: pd.DataFrame) -> None:
    from ddlrepro.host import plotting

    values = monitored[monitored["metric"] == "gradient_variance"]
    monitored_lines(axis, values)
    plotting.panel_title(axis, "gradient variance")
    axis.set_ylabel("gradient variance (rank 0, Σ‖Var g‖, grad²)")
    if values.empty:
        axis.text(0.5, 0.5, "no variance point configured", ha="center", transform=axis.transAxes)
    else:
        plotting.legend(axis)
