"""KungFu Fig 7: dynamic scaling — resize latency of in-place elastic training vs torchrun's restart
("KungFu: Making Training in Distributed Machine Learning Adaptive", OSDI 2020, Fig 7; artifact lsds/KungFu).

Points: the same resize schedule (`step:size,...`) run each way of `modes`: in place with cold joiners (no standby:
forked from the job's fork server), in place with a warm standby pool, and torchrun elastic (checkpoint, stop every
worker, restart) with torch's default keep-alive and with a tuned one. The speed-ups (`speedup_vs_torchrun`) are
against the faster torchrun mode for each kind of event (`torchrun_baseline`). Plot: cluster size and throughput
over steps; resize latency per event (grow, shrink) with KungFu's 20.39 s / 40 ms drawn in; where the
time goes, phase by phase. Summary: per mode and kind of event, the median latency and phases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import require, threads_per_worker
from ddlrepro.points import Point
from ddlrepro.rank.elastic.schedule import largest_size, parse_schedule

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ID = "kungfu-fig7"
TITLE = "KungFu Fig 7: resize latency, in place vs torchrun restart"
# The elastic runtime each mode needs (launchers/hosting.py); the configured launcher hosts it, or the workflow
# refuses the figure at start.
MODES = {"inplace-cold": "inplace", "inplace-warm": "inplace", "torchrun": "torchrun", "torchrun-tuned": "torchrun"}
# torchrun with torch's default keep-alive, and with the tuned one that notices a departed agent sooner
# (launchers/torchrun.py); the speed-ups are against whichever of the two is faster for each kind of event.
TORCHRUN_KEEP_ALIVE = {"torchrun": "default", "torchrun-tuned": "tuned"}
PHASE_ORDER = ["detect", "agree", "checkpoint", "restart", "spawn_join", "group_init", "state_sync", "first_step"]
SECTION_KEYS = ["model", "image_size", "batch_size", "dataset_size", "initial_workers", "schedule"]


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    try:
        schedule = parse_schedule(section["schedule"])
    except ValueError as error:
        require(False, ID, "schedule", str(error))
    workers = largest_size(schedule, section["initial_workers"])
    return [
        Point(
            figure=ID,
            workload="elastic",
            workers=workers,
            threads_per_worker=threads_per_worker(launcher, workers),
            params={
                **{key: section[key] for key in SECTION_KEYS if key in section},
                "mode": mode,
                "elastic": MODES[mode],
                "standby": section["standby"] if mode == "inplace-warm" else 0,
                "collective_timeout_s": section["collective_timeout_s"],
                **({"torchrun_keep_alive": "tuned"} if mode == "torchrun-tuned" else {}),
            },
        )
        for mode in section["modes"]
    ]


def events(table: pd.DataFrame) -> pd.DataFrame:
    """One row per resize event: mode, step, from → to, kind (grow, shrink, fault), latency and its phases."""
    resize = table[table["metric"].str.startswith("resize_")].copy()
    resize["metric"] = resize["metric"].str.removeprefix("resize_").str.removesuffix("_s")
    wide = resize.pivot_table(index=["mode", "step"], columns="metric", values="value").reset_index()
    wide["kind"] = "shrink"
    wide.loc[wide["to_size"] > wide["from_size"], "kind"] = "grow"
    wide.loc[wide["fault"] > 0, "kind"] = "fault"
    wide["event"] = wide["from_size"].astype(int).astype(str) + "→" + wide["to_size"].astype(int).astype(str)
    return wide


def latency_summary(wide: pd.DataFrame) -> pd.DataFrame:
    phases = [column for column in PHASE_ORDER if column in wide.columns]
    summary = (
        wide.groupby(["mode", "kind"], as_index=False)
        .agg(events=("step", "count"), latency_s=("latency", "median"), to_sync_s=("to_sync", "median"))
        .merge(wide.groupby(["mode", "kind"], as_index=False)[phases].median(), on=["mode", "kind"])
    )
    baselines = summary[summary["mode"].isin(TORCHRUN_KEEP_ALIVE)]
    fastest = baselines.loc[baselines.groupby("kind")["latency_s"].idxmin()].set_index("kind")
    summary["torchrun_baseline"] = fastest["mode"].reindex(summary["kind"]).to_numpy()
    summary["speedup_vs_torchrun"] = fastest["latency_s"].reindex(summary["kind"]).to_numpy() / summary["latency_s"]
    return summary


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per mode and resize kind: events, median latency and phases (latency_summary), with the host load."""
    from ddlrepro.host import summaries

    wide = events(table)
    summary = with_speedup_load(summaries.with_host_load(latency_summary(wide), table, ["mode"]), table)
    return summary


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting, summaries

    wide = events(table)
    figure, (timeline, latency, phases) = plotting.new_figure(3, TITLE, panel_size=(5.6, 4.6))
    colours = mode_colours(table)
    draw_timeline(timeline, table, colours)
    draw_latency(latency, wide, summaries.with_host_load(summary[["mode"]].drop_duplicates(), table, ["mode"]), colours)
    kungfu = kungfu_latencies(references)
    for kind, style in (("grow", "--"), ("shrink", ":")):
        if kind in kungfu:
            latency.axhline(kungfu[kind], color="black", linestyle=style, label=f"KungFu {kind}: {kungfu[kind]:g} s")
    plotting.legend(latency)
    plotting.panel_title(timeline, "modes coloured as in (b)")
    plotting.note_disturbed(latency, summary, ["mode", "kind"])
    draw_phases(phases, summary)
    return figure


def mode_colours(table: pd.DataFrame) -> dict[str, Any]:
    """One colour per mode, the same in the timeline and the latency bars (whose legend explains them)."""
    from ddlrepro.host import plotting

    return plotting.palette(sorted(table["mode"].unique()))


def draw_latency(axis: Axes, wide: pd.DataFrame, load: pd.DataFrame, colours: dict[str, Any]) -> None:
    """Each kind of resize event's mean latency per mode (log scale); the bars of disturbed modes hatched."""
    from ddlrepro.host import plotting

    latencies = wide.groupby(["event", "mode"], as_index=False)["latency"].mean().merge(load, on="mode")
    order = {event: index for index, event in enumerate(event_order(wide))}
    latencies = latencies.sort_values("event", key=lambda events: events.map(order), kind="stable")
    plotting.grouped_bars(axis, latencies, x="event", y="latency", hue="mode", colours=colours)
    axis.set_yscale("log")
    axis.set_xlabel("resize event (workers before → after)")
    axis.set_ylabel("resize latency (s)")


def with_speedup_load(summary: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Give `speedup_vs_torchrun` its own host-load columns (checks read them for it): the row's run and the run of
    the torchrun mode chosen as its kind's baseline; the row's own columns (its latencies) keep its run's only."""
    import pandas as pd

    from ddlrepro.host.summaries import HOST_LOAD_COLUMNS, with_host_load

    modes = pd.DataFrame({"mode": table["mode"].unique()})
    per_mode = with_host_load(modes, table, ["mode"]).set_index("mode")
    baseline = per_mode.reindex(summary["torchrun_baseline"]).reset_index(drop=True)
    own = summary[HOST_LOAD_COLUMNS].reset_index(drop=True)
    load = {
        "foreign_share": own["foreign_share"].combine(baseline["foreign_share"], max),
        "steal_share": own["steal_share"].combine(baseline["steal_share"], max),
        "disturbed": own["disturbed"] | baseline["disturbed"].fillna(False).astype(bool),
    }
    return summary.assign(**{f"speedup_vs_torchrun_{name}": column.to_numpy() for name, column in load.items()})


def kungfu_latencies(references: list[dict[str, Any]]) -> dict[str, float]:
    """KungFu's resize latencies by kind of event: the references that compare a latency (unit s) with a constant
    (the papers' numbers live in references.yaml only)."""
    return {
        reference["measured"]["where"]["kind"]: float(reference["against"])
        for reference in references
        if reference.get("unit") == "s" and isinstance(reference.get("against"), int | float)
    }


def event_order(wide: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(wide.sort_values("step")["event"]))


def draw_timeline(axis: Axes, table: pd.DataFrame, colours: dict[str, Any]) -> None:
    from ddlrepro.host import plotting

    steps = table[table["metric"].isin(["img_per_sec", "cluster_size"])]
    wide = steps.pivot_table(index=["mode", "step"], columns="metric", values="value").reset_index()
    for mode, rows in wide.groupby("mode"):
        axis.plot(rows["step"], rows["img_per_sec"].rolling(3, min_periods=1).median(), color=colours[mode])
    axis.set_xlabel("training step")
    axis.set_ylabel("cluster throughput (images/s)")
    axis.set_ylim(bottom=0)
    size = axis.twinx()
    first = wide[wide["mode"] == wide["mode"].iloc[0]]
    size.step(first["step"], first["cluster_size"], where="post", color="grey", linestyle="--")
    size.set_ylabel("cluster size, dashed (workers)")
    size.set_ylim(0, first["cluster_size"].max() + 1)
    plotting.integer_ticks(size.yaxis)
    size.grid(False)


def draw_phases(axis: Axes, summary: pd.DataFrame) -> None:
    """Each phase's share of the median latency, per mode and kind of event, as horizontal stacked bars; the
    latency written beside each bar."""
    from ddlrepro.host import plotting

    phases = [column for column in PHASE_ORDER if column in summary.columns]
    labels = summary["mode"] + " " + summary["kind"]
    shares = summary[phases].fillna(0.0).div(summary[phases].fillna(0.0).sum(axis=1), axis=0) * 100
    left = 0.0
    # A sequential colour-blind-safe map: phases in order, never confused with the modes' colours.
    for phase, colour in zip(phases, plotting.sequential("cividis", len(phases)), strict=True):
        axis.barh(labels, shares[phase], left=left, label=phase, color=colour)
        left = left + shares[phase]
    for y, latency in enumerate(summary["latency_s"]):
        axis.annotate(f"{latency:.3g} s", (101, y), va="center", fontsize="x-small")
    axis.set_xlim(0, 125)
    axis.set_xticks(range(0, 101, 25))
    axis.invert_yaxis()
    axis.set_xlabel("share of the median latency (%)")
    axis.tick_params(axis="y", labelsize="x-small")
    plotting.legend(axis, title="phase")
