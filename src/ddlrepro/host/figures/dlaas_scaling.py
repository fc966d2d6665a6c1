"""IBM DLaaS scaling-efficiency table ("IBM Deep Learning Service", IBM J. Res. Dev. 2017): images/s and
efficiency vs workers, one model and batch, on each network mode.

Points: one throughput run per (network, number of workers). Networks (`networks`): `host`, the ranks on this
machine as every other figure's; `bridge`, one testbed host per rank talking over the testbed's bridge (the
cluster's physical network); `overlay`, the same hosts talking over a VXLAN overlay on that bridge, the stand-in for
DLaaS's Calico overlay (launchers/testbed_ranks.py). `link_rate` limits the testbed modes' links (host points talk
over this machine's loopback, not shaped). A point gets a `network` param only when it is not `host`, so host points
keep their ids. Testbed points need root and the local launcher; elsewhere they are skipped, with the reason, in the
table, the figure and the checks. `overlay` needs `bridge` beside it (the overlay's check compares the two); a
missing bridge or overlay run makes that check skipped with what is missing.

Plot: total images/s against the ideal, and efficiency rate_N / (N × rate_1) per network beside the DLaaS
measurements; the summary table is the DLaaS-style table, one block per network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import require, throughput_point
from ddlrepro.host.testbed.limits import TestbedError, parse_rate
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


def check_link_rate(section: dict[str, Any]) -> None:
    if "link_rate" in section:
        try:
            parse_rate(section["link_rate"])
        except TestbedError as error:
            require(False, ID, "link_rate", str(error))


def check_networks(section: dict[str, Any]) -> None:
    """The overlay is judged against the bridge it runs on: refuse one without the other before anything runs."""
    networks = section["networks"]
    require(
        "overlay" not in networks or "bridge" in networks,
        ID,
        "networks",
        f"{networks} has overlay but not bridge; the overlay's efficiency is compared with the bridge's: add bridge",
    )


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_link_rate(section)
    check_networks(section)
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
    the overlay's encapsulation costs), its host load over both runs (`efficiency_vs_bridge_disturbed`, ...) and,
    where it is NaN, why (`efficiency_vs_bridge_skipped`); a skipped overlay row per workers when none ran."""
    from ddlrepro.host.tables import HOST_LOAD_COLUMNS, as_flags

    summary = with_overlay_rows(summary)
    keys = ["model", "batch_size", "workers"]
    measured_bridge = summary[(summary["network"] == "bridge") & (summary["status"] == "ok")]
    bridge = measured_bridge.set_index(keys)[["efficiency", *HOST_LOAD_COLUMNS]].add_prefix("bridge_")
    joined = summary.join(bridge, on=keys)
    difference = joined["efficiency"] - joined["bridge_efficiency"]
    unmeasured = (summary["status"] == "ok") & difference.isna()
    return summary.assign(
        efficiency_vs_bridge=difference,
        efficiency_vs_bridge_skipped=("no bridge run at " + summary["workers"].astype(str) + " workers").where(
            unmeasured, summary["reason"].where(summary["status"] != "ok", "")
        ),
        efficiency_vs_bridge_disturbed=as_flags(joined["disturbed"]) | as_flags(joined["bridge_disturbed"]),
        efficiency_vs_bridge_foreign_share=joined[["foreign_share", "bridge_foreign_share"]].max(axis=1),
        efficiency_vs_bridge_steal_share=joined[["steal_share", "bridge_steal_share"]].max(axis=1),
    )


def with_overlay_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with a skipped overlay row per model, batch and workers when the config ran no overlay, so the
    overlay's check says so instead of finding no row."""
    import pandas as pd

    if (summary["network"] == "overlay").any():
        return summary
    missing = summary[["model", "batch_size", "workers"]].drop_duplicates()
    reason = "no overlay run: figures.dlaas-scaling.networks has no overlay"
    return pd.concat([summary, missing.assign(network="overlay", status="skipped", reason=reason)], ignore_index=True)


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
