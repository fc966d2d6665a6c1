"""KungFu Fig 6: adaptive provisioning — the cluster grows one worker at a time while each added worker pays for
itself, and gives back the last one that did not ("KungFu: Making Training in Distributed Machine Learning
Adaptive", OSDI 2020, Fig 6: BERT-base fine-tuning on SQuAD; here a BERT-base-shaped encoder in the package with a
span head, trained on synthetic tokens: no SQuAD, no pretrained weights).

Points, all in-place elastic runs of `steps` steps: `adaptive` (1 worker at first, the provisioning policy resizing
through the config server, joiners from a warm standby pool as far as it goes) and fixed-size runs of
1..max_workers workers, the largest being `all-at-once` (max_workers from step 0). Plot: cluster throughput and
worker count over steps; throughput of each fixed size with the adaptive run's settled size marked; samples per
worker-second. Summary, per run: its size (the settled one for `adaptive`), throughput over its last window,
samples per worker-second; on the adaptive row the best fixed size, its throughput and the settled size's share of
it (from the fixed runs).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import require, threads_per_worker
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ID = "kungfu-fig6"
TITLE = "KungFu Fig 6: adaptive provisioning"
DATA = "synthetic tokens and spans: no SQuAD, no pretrained weights"
SECTION_KEYS = ["model", "batch_size", "dataset_size", "collective_timeout_s", "window_steps"]
ADAPTIVE = "adaptive"
ALL_AT_ONCE = "all-at-once"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    steps, window, largest = section["steps"], section["window_steps"], section["max_workers"]
    require(
        steps >= (largest + 1) * window,
        ID,
        "steps",
        f"{steps} steps cannot try every size and settle: at least (max_workers + 1) × window_steps = "
        f"{(largest + 1) * window}",
    )
    require(
        section["standby"] < largest,
        ID,
        "standby",
        f"{section['standby']} warm standbys, but at most max_workers − 1 = {largest - 1} workers can ever join",
    )
    threads = threads_per_worker(launcher, largest)  # the same in every run, so that only the worker count differs
    common = {key: section[key] for key in SECTION_KEYS} | {"elastic": "inplace", "schedule": f"{steps}:0"}
    adaptive = Point(
        figure=ID,
        workload="elastic",
        workers=largest,
        threads_per_worker=threads,
        params={
            **common,
            "mode": ADAPTIVE,
            "initial_workers": 1,
            "standby": section["standby"],
            "policy": "provisioning",
            "alpha": section["alpha"],
            "max_workers": largest,
        },
    )
    fixed = [
        Point(
            figure=ID,
            workload="elastic",
            workers=size,
            threads_per_worker=threads,
            params={**common, "mode": fixed_mode(size, largest), "initial_workers": size, "standby": 0},
        )
        for size in range(1, largest + 1)
    ]
    return [adaptive, *fixed]


def fixed_mode(size: int, largest: int) -> str:
    return ALL_AT_ONCE if size == largest else f"fixed-{size}"


def steps_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run and step: cluster size, cluster throughput, step time and the wall time it was reported."""
    steps = table[table["metric"].isin(["cluster_size", "img_per_sec", "step_time_s"])]
    wide = steps.pivot_table(index=["mode", "step"], columns="metric", values="value").reset_index()
    reported = steps[steps["metric"] == "img_per_sec"].groupby(["mode", "step"])["time"].max()
    return wide.join(reported, on=["mode", "step"]).sort_values(["mode", "step"], ignore_index=True)


def run_summary(rows: pd.DataFrame, window: int, batch: int) -> dict[str, float]:
    """One run's final size, its throughput over its last window (steps at the final size only), and its samples
    per worker-second: samples over the members' wall-clock time between step reports (resizes included; idle
    standbys are not members)."""
    size = rows["cluster_size"].iloc[-1]
    last = rows[rows["cluster_size"] == size].tail(window)
    seconds = rows["time"].diff().fillna(rows["step_time_s"])
    return {
        "size": int(size),
        "throughput": float(last["img_per_sec"].mean()),
        "samples_per_worker_s": float((rows["cluster_size"] * batch).sum() / (rows["cluster_size"] * seconds).sum()),
        "steps": len(rows),
    }


def mode_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run (skipped runs too, with their reason); on the adaptive row the comparison with the fixed
    sizes, NaN where the run it needs is missing, with the reason in `settled_share_skipped`."""
    import pandas as pd

    from ddlrepro.host import summaries

    window, batch = int(table["window_steps"].iloc[0]), int(table["batch_size"].iloc[0])
    skipped = summaries.skipped_points(table, ["mode"]).rename(columns={"workers": "size"})
    per_run = steps_table(table[~table["mode"].isin(skipped["mode"])])
    measured = [
        {"mode": mode, **run_summary(rows, window, batch)} for mode, rows in per_run.groupby("mode", sort=False)
    ]
    summary = pd.concat([pd.DataFrame(measured).assign(status="ok", reason=""), skipped], ignore_index=True)
    adaptive = table[table["mode"] == ADAPTIVE]
    summary = with_settled_comparison(summary, float(adaptive["alpha"].iloc[0]), int(adaptive["max_workers"].iloc[0]))
    summary["data"] = DATA
    order = {ADAPTIVE: -1, ALL_AT_ONCE: len(summary)}
    return summary.sort_values("mode", key=lambda modes: modes.map(lambda m: order.get(m, 0)), kind="stable")


def with_settled_comparison(summary: pd.DataFrame, alpha: float, max_workers: int) -> pd.DataFrame:
    """The adaptive row's settled size, the best fixed size and its throughput, the settled size's share of it, and
    what the policy promises: the next worker's gain measured by the fixed-size runs, T(s+1) ÷ T(s) − 1, as a
    share of the α/(s+1) it had to bring (below 1: rightly given back; rank/adaptation/provisioning.py's rule)."""
    summary = summary.assign(
        settled_size=math.nan,
        best_fixed_size=math.nan,
        best_fixed_throughput=math.nan,
        settled_share=math.nan,
        settled_share_skipped="",
        next_worker_gain_share=math.nan,
        next_worker_gain_share_skipped="",
    )
    adaptive = (summary["mode"] == ADAPTIVE) & (summary["status"] == "ok")
    if not adaptive.any():
        return summary
    ran = summary[(summary["mode"] != ADAPTIVE) & (summary["status"] == "ok")]
    fixed = ran.set_index(ran["size"].astype(int))["throughput"]
    settled = int(summary.loc[adaptive, "size"].iloc[0])
    summary.loc[adaptive, "settled_size"] = settled
    if not fixed.empty:
        summary.loc[adaptive, "best_fixed_size"] = int(fixed.idxmax())
        summary.loc[adaptive, "best_fixed_throughput"] = fixed.max()
    if settled >= max_workers:
        summary.loc[adaptive, "next_worker_gain_share_skipped"] = f"settled at max_workers ({max_workers}): no next"
    elif {settled, settled + 1} <= set(fixed.index):
        gain = fixed[settled + 1] / fixed[settled] - 1
        summary.loc[adaptive, "next_worker_gain_share"] = gain / (alpha / (settled + 1))
    if settled in fixed.index:
        summary.loc[adaptive, "settled_share"] = fixed[settled] / fixed.max()
    # Only a run declared skipped excuses a check; a run that ran and left no rows is an error it must show.
    for column, sizes in (("settled_share", [settled]), ("next_worker_gain_share", [settled, settled + 1])):
        skipped = (summary["mode"] != ADAPTIVE) & summary["size"].isin(sizes) & (summary["status"] == "skipped")
        for size, why in summary.loc[skipped, ["size", "reason"]].itertuples(index=False):
            what = "the settled size" if size == settled else "the size after the settled one,"
            summary.loc[adaptive, f"{column}_skipped"] = f"no fixed-size run at {what} {int(size)} ({why})"
    return summary


def with_share_load(summary: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """`settled_share` and `next_worker_gain_share` compare the fixed-size runs: their own host-load columns cover
    all of them."""
    from ddlrepro.host.summaries import with_host_load

    fixed = with_host_load(summary[summary["mode"] != ADAPTIVE][["mode"]], table, ["mode"])
    load = {"foreign_share": fixed["foreign_share"].max(), "steal_share": fixed["steal_share"].max()}
    load["disturbed"] = bool(fixed["disturbed"].any())
    columns = ("settled_share", "next_worker_gain_share")
    return summary.assign(**{f"{column}_{key}": value for column in columns for key, value in load.items()})


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run with its host load; on the adaptive row the comparison with the fixed sizes (mode_summary)."""
    from ddlrepro.host import summaries

    summary = with_share_load(summaries.with_host_load(mode_summary(table), table, ["mode"]), table)
    return summary.reset_index(drop=True)


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    figure, (timeline, sizes, efficiency) = plotting.new_figure(3, TITLE, panel_size=(5.4, 4.4))
    colours = mode_colours(summary)
    draw_timeline(timeline, steps_table(table), colours)
    draw_fixed_sizes(sizes, summary, colours)
    draw_efficiency(efficiency, summary, colours)
    plotting.add_footer(figure, f"Model: {model_label(table)}; {DATA}.")
    plotting.note_disturbed(efficiency, summary, ["mode"])
    return figure


def model_label(table: pd.DataFrame) -> str:
    model = str(table["model"].iloc[0])
    return "BERT-base's encoder" if model == "bert_base" else f"{model}, an encoder of BERT-base's shape family"


def mode_colours(summary: pd.DataFrame) -> dict[str, Any]:
    from ddlrepro.host import plotting

    return plotting.palette(summary["mode"])


def draw_timeline(axis: Axes, steps: pd.DataFrame, colours: dict[str, Any]) -> None:
    """Cluster throughput over steps, adaptive and all at once (bold) and the other fixed sizes (thin), coloured as
    in (c); the adaptive run's worker count on the right axis."""
    from ddlrepro.host import plotting

    for mode, rows in steps.groupby("mode", sort=False):
        bold = mode in (ADAPTIVE, ALL_AT_ONCE)
        axis.plot(
            rows["step"],
            rows["img_per_sec"].rolling(3, min_periods=1).median(),
            color=colours[mode],
            linewidth=2.0 if bold else 0.8,
        )
    axis.set_xlabel("training step")
    axis.set_ylabel("cluster throughput (samples/s)")
    axis.set_ylim(bottom=0)
    plotting.panel_title(axis, "runs coloured as in (c)")
    workers = axis.twinx()
    adaptive = steps[steps["mode"] == ADAPTIVE]
    workers.step(adaptive["step"], adaptive["cluster_size"], where="post", color="grey", linestyle="--")
    workers.set_ylabel("number of workers (adaptive run, dashed)")
    workers.set_ylim(0, steps["cluster_size"].max() + 1)
    plotting.integer_ticks(workers.yaxis)
    workers.grid(False)


def draw_fixed_sizes(axis: Axes, summary: pd.DataFrame, colours: dict[str, Any]) -> None:
    """Each fixed size's throughput (bars), and where the adaptive run settled (its throughput, a diamond)."""
    from ddlrepro.host import plotting

    fixed = summary[summary["mode"] != ADAPTIVE]
    bars = axis.bar(fixed["size"], fixed["throughput"], color=[colours[mode] for mode in fixed["mode"]])
    plotting.hatch_disturbed(bars, fixed["disturbed"])
    adaptive = summary[summary["mode"] == ADAPTIVE].iloc[0]
    axis.plot(
        [adaptive["size"]],
        [adaptive["throughput"]],
        "D",
        color=colours[ADAPTIVE],
        markersize=9,
        label="adaptive, settled",
    )
    for row in fixed[fixed["status"] == "skipped"].itertuples():
        plotting.note_skipped_slot(axis, row.size, row.reason)
    axis.set_xticks(list(fixed["size"]))
    axis.set_xlabel("workers (fixed from step 0)")
    axis.set_ylabel("throughput, last window (samples/s)")
    plotting.panel_title(axis, "which size is best here")
    plotting.legend(axis)


def draw_efficiency(axis: Axes, summary: pd.DataFrame, colours: dict[str, Any]) -> None:
    """Samples per worker-second of every run (bars; disturbed runs hatched)."""
    from ddlrepro.host import plotting

    bars = axis.bar(summary["mode"], summary["samples_per_worker_s"], color=[colours[m] for m in summary["mode"]])
    plotting.hatch_disturbed(bars, summary["disturbed"])
    for position, row in enumerate(summary.itertuples()):
        if row.status == "skipped":
            plotting.note_skipped_slot(axis, position, row.reason)
    plotting.panel_title(axis, "cost: samples per worker-second")
    axis.set_xlabel("run (fixed-n: n workers from step 0)")
    axis.set_ylabel("efficiency (samples/worker-s)")
    axis.tick_params(axis="x", labelsize="x-small")
