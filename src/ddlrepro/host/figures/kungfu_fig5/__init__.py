"""KungFu Fig 5: adaptive communication strategy under network interference ("KungFu: Making Training in
Distributed Machine Learning Adaptive", OSDI 2020, Fig 5; artifact lsds/KungFu).

Points: three runs of the adaptive strategy workload (rank/workloads/adaptive_strategy.py) on testbed hosts, one
rank per host, STAR all-reduce, rate-limited links: `adaptive` (the policy may move the root once), `no adaptation`
(same traffic, the root stays), `quiet` (the policy on, no traffic: it must not switch). The traffic is real TCP
from an extra host into rank 0's host, started when rank 0 reaches `interference_step` (launchers/testbed_ranks.py).

Plot: (a) img/s per worker over steps, the traffic's first byte and the switch marked; (b) each run's all-reduce
throughput (MiB/s, mean over workers) over steps, with the adaptive run's vote threshold; (c) what each rank's host
received while the traffic ran (from its interface counters), which shows the traffic landing on rank 0's host.
Summary, per run: img/s per worker before the traffic (from `reference_step`), during it (every step from the
first one run fully under it), after the switch, recovery (after ÷ before), the switch step and how many steps and
seconds after the first fully interfered step it came.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import check_rate, require, threads_per_worker
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "kungfu-fig5"
TITLE = "KungFu Fig 5: adaptive communication strategy under network interference"
PLOTS_ONE_REPLICATE = True  # a timeline of three runs: replicates would overlay; the checks judge them all
SECTION_KEYS = [
    *["model", "image_size", "batch_size", "steps", "reference_step", "threshold", "patience"],
    *["interference_step", "strategy", "link_rate"],
]
RUNS = {"adaptive": (True, True), "no adaptation": (False, True), "quiet": (True, False)}  # adapt, traffic


def check_section(section: dict[str, Any]) -> None:
    """What the schema cannot say, each naming its key."""
    require(
        section["strategy"] == "STAR",
        ID,
        "strategy",
        f"{section['strategy']!r}: KungFu's policy moves the root of a STAR all-reduce; only STAR is adaptive here",
    )
    check_rate(ID, section, "link_rate")
    check_rate(ID, section, "traffic_rate")
    require(
        section["interference_step"] < section["steps"],
        ID,
        "interference_step",
        f"{section['interference_step']} is not before the run's end (steps: {section['steps']})",
    )
    require(
        section["reference_step"] < section["interference_step"],
        ID,
        "reference_step",
        f"{section['reference_step']} must come before interference_step {section['interference_step']}: the "
        "reference is measured without traffic",
    )


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_section(section)
    workers = section["workers"]
    traffic = {"connections": section["traffic_connections"], "rate": section["traffic_rate"]}
    common = {key: section[key] for key in SECTION_KEYS if key in section}
    common |= {"testbed_hosts": workers + 1, "backend": "gloo", "sample_interval_s": launcher["sample_interval_s"]}
    return [
        Point(
            figure=ID,
            workload="adaptive_strategy",
            workers=workers,
            threads_per_worker=threads_per_worker(launcher, workers),
            params={
                **common,
                "run": run,
                "adapt": adapt,
                "traffic": {**traffic, "seconds": section["traffic_seconds"]} if with_traffic else None,
            },
        )
        for run, (adapt, with_traffic) in RUNS.items()
    ]


def step_rows(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per (run, step): the metric's mean over the workers, and the step's start and end (rank 0's clock)."""
    rows = table[(table["metric"] == metric) & table["step"].notna()]
    return rows.groupby(["run", "step"], as_index=False).agg(value=("value", "mean"), end=("time", "max"))


def step_windows(table: pd.DataFrame) -> pd.DataFrame:
    """Per run and step: when it started (rank 0's `step_start`) and ended (rank 0's img/s record, after the
    votes' all-reduce)."""
    rank_0 = table[table["rank"] == 0]
    starts = rank_0[rank_0["metric"] == "step_start"][["run", "step", "value"]].rename(columns={"value": "start"})
    ends = rank_0[rank_0["metric"] == "img_per_sec"][["run", "step", "time"]].rename(columns={"time": "end"})
    return starts.merge(ends, on=["run", "step"], validate="one_to_one")


def run_summary(table: pd.DataFrame, run: str) -> dict[str, Any]:
    """One run's row (see the module's docstring). Without a switch the delays are infinite (never) and recovery is
    what the run kept under interference."""
    import numpy as np
    import pandas as pd

    rows = table[table["run"] == run]
    rates = step_rows(rows, "img_per_sec").set_index("step")["value"]
    windows = step_windows(rows).set_index("step")
    reference_step = int(rows["reference_step"].iloc[0])
    interference_step = int(rows["interference_step"].iloc[0])
    traffic = rows.loc[rows["metric"] == "traffic_start", "value"]
    switches = rows[(rows["metric"] == "root_switch") & (rows["rank"] == 0)]["step"].astype(int).tolist()
    before = rates[(rates.index >= reference_step) & (rates.index < interference_step)].mean()
    traffic_step = first_full = during = np.nan
    if not traffic.empty:
        began = float(traffic.iloc[0])
        traffic_step = windows.index[windows["end"] > began].min()
        first_full = windows.index[windows["start"] >= began].min()
        during = rates[rates.index >= first_full].mean()
    switch = switches[0] if switches else np.inf
    after = rates[rates.index > switch].mean() if switches else during
    delay_s = np.inf
    if switches and pd.notna(first_full):
        delay_s = windows.loc[switch, "end"] - windows.loc[first_full, "start"]
    return {
        "run": run,
        "status": "ok",
        "reason": "",
        "before": before,
        "during": during,
        "after_switch": after,
        "recovery": after / before,
        "switches": len(switches),
        "traffic_step": traffic_step,
        "first_full_step": first_full,
        "switch_step": switch,
        "switched_after_traffic": int(bool(switches) and switch >= traffic_step),
        "switch_margin_steps": switch - traffic_step,
        "switch_delay_steps": switch - first_full,
        "switch_delay_s": delay_s,
    }


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run; a run this machine skipped keeps its reason (its checks are then skipped, not failed)."""
    import pandas as pd

    from ddlrepro.host import summaries

    rows = []
    for run in [run for run in RUNS if run in set(table["run"])]:
        ran = table[(table["run"] == run) & (table["metric"] != "skipped")]
        if ran.empty:
            reason = table.loc[table["run"] == run, "reason"].iloc[0]
            rows.append({"run": run, "status": "skipped", "reason": reason})
        else:
            rows.append(run_summary(ran, run))
    return summaries.with_host_load(pd.DataFrame(rows), table, ["run"])


def received_while_traffic(table: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per run and rank: MB its host's interfaces received from the interference step to the run's end."""
    import pandas as pd

    rows = table[table["metric"] == "node_rx_bytes"]
    if rows.empty or not {"interference", "end"} <= set(rows["phase"]):
        return pd.DataFrame(columns=["run", "rank", "received_mb", "disturbed"])
    counts = rows.pivot_table(index=["run", "rank"], columns="phase", values="value", aggfunc="sum").reset_index()
    counts["received_mb"] = (counts["end"] - counts["interference"]) / 1e6
    counts = counts.join(summary.set_index("run")["disturbed"], on="run")
    return counts[["run", "rank", "received_mb", "disturbed"]]


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting, summaries

    figure, axes = plotting.new_figure(3, TITLE)
    skipped = summaries.skipped_points(table, ["run"])
    ran = table[table["metric"] != "skipped"]
    over_steps(axes[0], ran, summary, "img_per_sec", "per worker (images/s)")
    plotting.panel_title(axes[0], "training throughput")
    threshold_line(axes[1], ran)
    over_steps(axes[1], ran, summary, "allreduce_mib_per_s", "all-reduce per worker (MiB/s)")
    plotting.panel_title(axes[1], "all-reduce throughput")
    received_panel(axes[2], ran, summary)
    for axis in axes[:2]:
        plotting.note_skipped(axis, skipped, ["run"])
    plotting.note_disturbed(axes[0], summary, ["run"])
    return figure


def over_steps(axis: Any, table: pd.DataFrame, summary: pd.DataFrame, metric: str, label: str) -> None:
    """One line per run over steps; the traffic's first byte (dashed) and the switch (dotted) marked."""
    import numpy as np

    from ddlrepro.host import plotting

    rows = step_rows(table, metric)
    disturbed = dict(zip(summary["run"], summary["disturbed"], strict=True))
    for run in [run for run in RUNS if run in set(rows["run"])]:
        line = rows[rows["run"] == run]
        axis.plot(line["step"], line["value"], marker=".", label=run)
        plotting.ring_disturbed(axis, line["step"], line["value"], [disturbed.get(run, False)] * len(line))
    for _, row in summary.iterrows():
        if np.isfinite(row.get("traffic_step", np.nan)):
            axis.axvline(row["traffic_step"], color="grey", linestyle="--", linewidth=1)
        if np.isfinite(row.get("switch_step", np.nan)):
            axis.axvline(row["switch_step"], color="black", linestyle=":", linewidth=1.5)
    axis.plot([], [], color="grey", linestyle="--", label="traffic starts")
    axis.plot([], [], color="black", linestyle=":", label="root moves 0 → 1")
    axis.set_xlabel("training step")
    axis.set_ylabel(label)
    axis.set_ylim(bottom=0)
    plotting.legend(axis, title="run")


def threshold_line(axis: Any, table: pd.DataFrame) -> None:
    """The adaptive run's vote threshold: threshold × the mean of the workers' references."""
    rows = table[(table["run"] == "adaptive") & (table["metric"] == "allreduce_mib_per_s")]
    if rows.empty:
        return
    reference = rows[rows["step"] == rows["reference_step"]]["value"].mean()
    level = reference * float(rows["threshold"].iloc[0])
    axis.axhline(level, color="black", linewidth=0.8, label="vote below (adaptive)")


def received_panel(axis: Any, table: pd.DataFrame, summary: pd.DataFrame) -> None:
    from ddlrepro.host import plotting

    received = received_while_traffic(table, summary)
    plotting.panel_title(axis, "received while the traffic ran")
    if received.empty:
        axis.text(0.5, 0.5, "no interface counters recorded", ha="center", transform=axis.transAxes)
        return
    received = received.assign(host=[f"rank {int(rank)}'s host" for rank in received["rank"]])
    plotting.grouped_bars(axis, received, x="run", y="received_mb", hue="host")
    axis.set_xlabel("run")
    axis.set_ylabel("bytes received by the host (MB)")
    plotting.legend(axis, title="host")
