"""IBM DLaaS scaling-efficiency table ("IBM Deep Learning Service", IBM J. Res. Dev. 2017): images/s and
efficiency vs workers, one model and batch, on each network mode.

Points: one throughput run per (network, number of workers). Networks (`networks`): `host`, the ranks on this
machine as every other figure's; `bridge`, one testbed host per rank talking over the testbed's bridge (the
cluster's physical network); `overlay`, the same hosts talking over a VXLAN overlay on that bridge, the stand-in for
DLaaS's Calico overlay (launchers/testbed_ranks.py). `link_rate` limits the testbed modes' links. A point gets a
`network` param only when it is not `host`, so host points keep their ids. Testbed points need root and the local
launcher; elsewhere they are skipped, with the reason, in the table, the figure and the checks.

Plot: total images/s against the ideal, and efficiency rate_N / (N × rate_1) per network beside the DLaaS
measurements; the summary table is the DLaaS-style table, one block per network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import check_rate, throughput_point
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "dlaas-scaling"
TITLE = "DLaaS scaling efficiency: images/s and efficiency vs workers"
DEFAULT_NETWORK = "host"
NETWORK_LABELS = {
    "host": "host network",
    "bridge": "testbed bridge",
    "overlay": "VXLAN overlay on the testbed (emulates Calico)",
}


def network_params(section: dict[str, Any], network: str, workers: int) -> dict[str, Any]:
    """What a network mode adds to a point: nothing for `host`; one testbed host per rank otherwise."""
    if network == DEFAULT_NETWORK:
        return {}
    rate = {"link_rate": section["link_rate"]} if "link_rate" in section else {}
    return {"network": network, "testbed_hosts": workers, **rate}


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_rate(ID, section)
    return [
        throughput_point(ID, section, section["model"], workers, launcher, **network_params(section, network, workers))
        for network in section["networks"]
        for workers in section["workers"]
    ]


def with_network(table: pd.DataFrame) -> pd.DataFrame:
    """The table with a `network` on every row (host points carry none: it is the default)."""
    if "network" not in table:
        return table.assign(network=DEFAULT_NETWORK)
    return table.assign(network=table["network"].fillna(DEFAULT_NETWORK))


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """The DLaaS-style table per (model, batch, network, workers), with a row per skipped point and its reason."""
    import pandas as pd

    from ddlrepro.host import plotting

    table = with_network(table)
    by = ["model", "batch_size", "network"]
    measured = table[table["status"] == "ok"]
    summary = plotting.throughput_summary(measured, by=by).assign(status="ok", reason="")
    columns = [*by, "workers", "total", "per_worker", "confidence", "efficiency", "status", "reason"]
    summary = summary[columns + plotting.HOST_LOAD_COLUMNS].rename(columns={"total": "images_per_sec"})
    skipped = plotting.skipped_points(table, by)
    summary = pd.concat([summary, skipped], ignore_index=True) if not skipped.empty else summary
    return with_efficiency_vs_bridge(summary)


def with_efficiency_vs_bridge(summary: pd.DataFrame) -> pd.DataFrame:
    """`efficiency_vs_bridge`: each row's efficiency minus the bridge's at the same model, batch and workers (what
    the overlay's encapsulation costs; NaN without a bridge row)."""
    keys = ["model", "batch_size", "workers"]
    bridge = summary[summary["network"] == "bridge"].set_index(keys)["efficiency"].rename("bridge_efficiency")
    joined = summary.join(bridge, on=keys)
    return summary.assign(efficiency_vs_bridge=joined["efficiency"] - joined["bridge_efficiency"])


def plot(table: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> tuple[Figure, pd.DataFrame]:
    from ddlrepro.host import plotting

    summary = summarize(table)
    measured = summary[summary["status"] == "ok"]
    figure, (rate, efficiency) = plotting.new_figure(2, TITLE, panel_size=(6.0, 4.2))
    present = [network for network in NETWORK_LABELS if network in set(measured["network"])]  # host first
    for order, network in enumerate(present):
        rows, label = measured[measured["network"] == network], NETWORK_LABELS[network]
        rate.plot(rows["workers"], rows["images_per_sec"], "o-", label=f"measured, {label}")
        efficiency.plot(rows["workers"], rows["efficiency"], "o-", label=f"measured, {label}")
        if order == 0:
            ideal = rows["workers"] / rows["workers"].iloc[0] * rows["images_per_sec"].iloc[0]
            rate.plot(rows["workers"], ideal, "k--", label=f"ideal (N × rate₁), {label}")
    plotting.ring_disturbed(rate, measured["workers"], measured["images_per_sec"], measured["disturbed"])
    plotting.ring_disturbed(efficiency, measured["workers"], measured["efficiency"], measured["disturbed"])
    plotting.note_disturbed(efficiency, measured, ["network", "workers"])
    plotting.note_skipped(efficiency, plotting.skipped_points(with_network(table), ["network"]), ["network"])
    for axis, column in ((rate, "images_per_sec"), (efficiency, "efficiency")):
        drawn = plotting.drawn_references(references, column, "workers", scale)
        for series, rows in drawn.groupby("series", sort=True):
            axis.plot(rows["workers"], rows["value"], marker="s", linestyle=":", alpha=0.7, label=series)
        plotting.workers_axis(axis, [*measured["workers"], *drawn["workers"]])
        plotting.legend(axis)
    rate.set_ylabel("throughput, all workers (images/s)")
    efficiency.set_ylabel("scaling efficiency (fraction of N × rate₁)")
    efficiency.set_ylim(0, 1.1)
    return figure, summary
