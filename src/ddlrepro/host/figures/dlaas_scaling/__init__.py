"""IBM DLaaS scaling-efficiency table ("IBM Deep Learning Service", IBM J. Res. Dev. 2017): images/s and
efficiency vs workers, one model and batch, on each network mode.

Points: one throughput run per (network, data source, number of workers); the two axes are not crossed. Data
sources (`data_sources`) run on the host network: synthetic, or shards read from local disk, an S3 object store
(SeaweedFS at smoke scale, not IBM COS) or its s3fs FUSE mount (a store started for the run listens on this host's
loopback, which testbed hosts cannot reach). Networks (`networks`) run on synthetic data: `host`, the ranks on this
machine as every other figure's; `bridge`, one testbed host per rank talking over the testbed's bridge (the
cluster's physical network); `overlay`, the same hosts talking over a VXLAN overlay on that bridge, the stand-in
for DLaaS's Calico overlay (launchers/testbed_ranks.py). `link_rate` limits the testbed modes' links (host points
talk over this machine's loopback, not shaped). A point gets a `network` or `data_source` param only when it is not
the default (host, synthetic), so those points keep their ids. Testbed points need root and the local launcher;
elsewhere they are skipped, with the reason, in the table, the figure and the checks. `overlay` needs `bridge`
beside it (the overlay's check compares the two); a missing bridge or overlay run makes that check skipped with
what is missing.

Paired runs: a data source's run trains on synthetic data too, in turns, when `data_sources` has synthetic, and an
overlay run trains a model over the bridge too: `rate_vs_synthetic` (what reading costs) and `rate_vs_bridge`
(what encapsulation costs) are ratios measured in the same processes, which the checks judge.

Plot: total images/s against the ideal, and efficiency rate_N / (N × rate_1) per series (network or data source)
beside the DLaaS measurements; the summary table is the DLaaS-style table, one block per series, with
`efficiency_vs_ceiling`: the per-worker rate ÷ that of as many independent processes at once on the host network
(a run per worker count above 1, not drawn: the host's parallel ceiling, which a small VM's busy cores cap before
any communication; ours, not DLaaS's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import (
    check_rate,
    host_ceiling_point,
    is_ceiling,
    require,
    throughput_point,
    with_efficiency_vs_ceiling,
)
from ddlrepro.host.objectstore import LABEL, store_inputs
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
    """What a network mode adds to a point: nothing for `host`; one testbed host per rank otherwise, and on the
    overlay a model over the bridge too (`PARTNERS`)."""
    if network == DEFAULT_NETWORK:
        return {}
    rate = {"link_rate": section["link_rate"]} if "link_rate" in section else {}
    paired = {"settings": paired_settings("network", network)} if network == "overlay" else {}
    return {"network": network, "testbed_hosts": workers, **rate, **paired}


def check_networks(section: dict[str, Any]) -> None:
    """Refuse, before anything runs, an overlay without the bridge it is judged against, and data sources without
    the host network they run on."""
    networks = section["networks"]
    require(
        "overlay" not in networks or "bridge" in networks,
        ID,
        "networks",
        f"{networks} has overlay but not bridge; the overlay's efficiency is compared with the bridge's: add bridge",
    )
    require(
        DEFAULT_NETWORK in networks or section["data_sources"] == ["synthetic"],
        ID,
        "data_sources",
        f"{section['data_sources']}: the data sources run on the host network; add host to networks",
    )


SHARDS_DIR = f"results/data/{ID}/shards"
# What a run also trains on, per series key, taking turns with its own series in the same processes (the throughput
# workload's `settings`): a data source's run trains on synthetic data too (each reader reads only in its own
# turn), an overlay run a model over the bridge too. The ratio of the two rates (`rate_vs_<partner>`) is paired:
# the machine's drift and the noise between fresh processes hit both sides alike.
PARTNERS = {"data_source": "synthetic", "network": "bridge"}
PAIRED_VALUES = {"data_source": ("local", "s3", "s3fs"), "network": ("overlay",)}  # the series that have a partner
LACKING_PARTNER = {
    "data_source": f"no synthetic data beside it: figures.{ID}.data_sources has no synthetic",
    "network": "its run trained no model over the bridge beside the overlay's (a run from before runs were paired)",
}


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_rate(ID, section)
    check_networks(section)
    on_host = DEFAULT_NETWORK in section["networks"]
    model, workers = section["model"], section["workers"]
    by_source = [
        with_data_source(throughput_point(ID, section, model, count, launcher), source, section)
        for source in section["data_sources"]
        if on_host
        for count in workers
    ]
    by_network = [
        throughput_point(ID, section, model, count, launcher, **network_params(section, network, count))
        for network in section["networks"]
        if network != DEFAULT_NETWORK
        for count in workers
    ]
    ceilings = [host_ceiling_point(ID, section, model, count, launcher) for count in workers if count > 1]
    return by_source + by_network + (ceilings if on_host and section.get("host_ceiling") else [])


def with_data_source(point: Point, source: str, section: dict[str, Any]) -> Point:
    """The point reading `source`: synthetic keeps today's point (and id); the others read the packed shards
    (`SHARDS_DIR`, relative to the checkout), from the configured store or one started for the run, and, where
    `data_sources` has synthetic, train on synthetic data too in the same processes, taking turns (`PARTNERS`)."""
    if source == "synthetic":
        return point
    params = {**point.params, "data_source": source, "shards": section["shards"]}
    if source in ("s3", "s3fs"):  # which store: one started per run, or the configured one (its endpoint: provenance)
        params["store"] = "configured" if section.get("store", {}).get("endpoint") else "seaweedfs"
    if PARTNERS["data_source"] in section["data_sources"]:
        params["settings"] = paired_settings("data_source", source)
    inputs = {"shards_dir": SHARDS_DIR, **store_inputs(section.get("store", {}))}
    return replace(point, params=params, inputs=inputs)


def paired_settings(key: str, value: str) -> list[dict[str, str]]:
    """The run's own setting and its partner's (`PARTNERS`), trained in turns."""
    return [{key: value}, {key: PARTNERS[key]}]


def shard_settings(section: dict[str, Any]) -> dict[str, Any]:
    """What the packed shards hold (the `pack_shards` rule's params)."""
    return {
        "model": section["model"],
        "batch_size": section["batch_size"],
        "count": section["shards"],
        "image_size": section.get("image_size"),
    }


SOURCE_LABELS = {"synthetic": "synthetic data", "local": "local disk", "s3": "S3", "s3fs": "s3fs (FUSE)"}
STORES = {"seaweedfs": LABEL, "configured": "the configured S3 store"}


def with_default_data_source(table: pd.DataFrame) -> pd.DataFrame:
    """Runs without a `data_source` param read synthetic data (the param is left out at its default)."""
    column = table.get("data_source")
    table = table.assign(data_source="synthetic" if column is None else column.fillna("synthetic"))
    stores = table["store"] if "store" in table else [None] * len(table)
    pairs = zip(table["data_source"], stores, strict=True)
    return table.assign(storage=[storage(source, store) for source, store in pairs])


def storage(source: str, store: Any) -> str:
    """Where a run's data came from, labelled (the object store at smoke scale is SeaweedFS, not IBM COS)."""
    if source in ("s3", "s3fs"):
        return STORES[store]
    return "none (generated)" if source == "synthetic" else "local disk"


def with_defaults(table: pd.DataFrame) -> pd.DataFrame:
    """The table with a `network` and a `data_source` on every row (left out of a point at their defaults), and
    each row's `storage`."""
    table = with_default_data_source(table)
    if "network" not in table:
        return table.assign(network=DEFAULT_NETWORK)
    return table.assign(network=table["network"].fillna(DEFAULT_NETWORK))


SERIES = ["network", "data_source", "storage"]


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """The DLaaS-style table per (model, batch, series, workers), with a row per skipped point and its reason."""
    import pandas as pd

    from ddlrepro.host import summaries

    table = with_defaults(table)
    ceilings, table = table[is_ceiling(table)], table[~is_ceiling(table)]
    partners = {key: is_partner(table, key) for key in PARTNERS}
    besides = {key: table[rows] for key, rows in partners.items()}
    table = table[~(partners["data_source"] | partners["network"])]
    by = ["model", "batch_size", *SERIES]
    measured = table[table["status"] == "ok"]
    summary = summaries.throughput_summary(measured, by=by).assign(status="ok", reason="")
    columns = [*by, "workers", "total", "per_worker", "confidence", "efficiency", "status", "reason"]
    summary = summary[columns + summaries.HOST_LOAD_COLUMNS].rename(columns={"total": "images_per_sec"})
    skipped = summaries.skipped_points(table, by)
    summary = pd.concat([summary, skipped], ignore_index=True) if not skipped.empty else summary
    for key, beside in besides.items():
        summary = with_rate_vs_partner(summary, beside, by, key)
    return with_efficiency_vs_ceiling(with_efficiency_vs_bridge(summary), ceilings, ["model", "batch_size"])


def is_partner(table: pd.DataFrame, key: str) -> pd.Series:
    """The records of what a run of another `key` trained on beside its own (`PARTNERS`)."""
    import pandas as pd

    if "setting" not in table:
        return pd.Series(False, index=table.index)
    return (table["setting"] == PARTNERS[key]) & (table[key] != PARTNERS[key])


def with_rate_vs_partner(summary: pd.DataFrame, beside: pd.DataFrame, by: list[str], key: str) -> pd.DataFrame:
    """`rate_vs_<partner>`: a row's per-worker rate ÷ that of the partner its own run trained on in turns (paired:
    the same processes, the same moments), and, where a run that has a partner lacks it, why (`..._skipped`)."""
    from ddlrepro.host import summaries

    column, keys = f"rate_vs_{PARTNERS[key]}", [*by, "workers"]
    measured = beside[beside["status"] == "ok"]
    if measured.empty:
        paired = summary[keys].assign(partner_rate=float("nan"))
    else:
        paired = summaries.throughput_summary(measured, by=by)[[*keys, "per_worker"]]
        paired = paired.rename(columns={"per_worker": "partner_rate"})
    joined = summary.merge(paired, on=keys, how="left")
    lacking = (joined["status"] == "ok") & joined[key].isin(PAIRED_VALUES[key]) & joined["partner_rate"].isna()
    reason = LACKING_PARTNER[key]
    return summary.assign(
        **{column: (joined["per_worker"] / joined["partner_rate"]).to_numpy()},
        **{f"{column}_skipped": lacking.map({True: reason, False: ""}).to_numpy()},
    )


def with_efficiency_vs_bridge(summary: pd.DataFrame) -> pd.DataFrame:
    """`efficiency_vs_bridge`: each row's efficiency minus the bridge's at the same model, batch, data source and
    workers (what the overlay's encapsulation costs), its host load over both runs (`efficiency_vs_bridge_disturbed`,
    ...) and, where it is NaN, why (`efficiency_vs_bridge_skipped`); a skipped overlay row per workers when none
    ran."""
    from ddlrepro.host.tables import HOST_LOAD_COLUMNS, as_flags

    summary = with_overlay_rows(summary)
    keys = ["model", "batch_size", "data_source", "workers"]
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
    skipped = missing.assign(network="overlay", data_source="synthetic", storage=storage("synthetic", None))
    return pd.concat([summary, skipped.assign(status="skipped", reason=reason)], ignore_index=True)


def series_label(network: str, source: str, storage: str) -> str:
    """A series' legend: its network when not the host's, else its data source (and store)."""
    if network != DEFAULT_NETWORK:
        return NETWORK_LABELS[network]
    return SOURCE_LABELS[source] + (f": {storage}" if source in ("s3", "s3fs") else "")


def draw_series(rate: Any, efficiency: Any, measured: pd.DataFrame) -> None:
    """Total images/s and efficiency per series (host network first, synthetic data first), the ideal of the first."""
    networks, sources = list(NETWORK_LABELS), list(SOURCE_LABELS)
    groups = dict(list(measured.groupby(SERIES)))
    keys = sorted(groups, key=lambda key: (networks.index(key[0]), sources.index(key[1])))
    for index, key in enumerate(keys):
        rows, label = groups[key], "" if len(keys) == 1 else f", {series_label(*key)}"
        rate.plot(rows["workers"], rows["images_per_sec"], "o-", label=f"measured{label}")
        efficiency.plot(rows["workers"], rows["efficiency"], "o-", label=f"measured{label}")
        if index == 0:
            ideal = rows["workers"] / rows["workers"].iloc[0] * rows["images_per_sec"].iloc[0]
            rate.plot(rows["workers"], ideal, "k--", label=f"ideal (N × rate₁){label}")


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting, summaries

    measured = summary[summary["status"] == "ok"]
    figure, (rate, efficiency) = plotting.new_figure(2, TITLE, panel_size=(6.0, 4.2))
    draw_series(rate, efficiency, measured)
    plotting.ring_disturbed(rate, measured["workers"], measured["images_per_sec"], measured["disturbed"])
    plotting.ring_disturbed(efficiency, measured["workers"], measured["efficiency"], measured["disturbed"])
    varying = [column for column in ("network", "data_source") if measured[column].nunique() > 1]
    plotting.note_disturbed(efficiency, measured, [*varying, "workers"])
    skipped = summaries.skipped_points(with_defaults(table), ["network", "data_source"])
    plotting.note_skipped(efficiency, skipped, ["network", "data_source"])
    for axis, column in ((rate, "images_per_sec"), (efficiency, "efficiency")):
        drawn = plotting.drawn_references(references, column, "workers", scale)
        for series, rows in drawn.groupby("series", sort=True):
            axis.plot(rows["workers"], rows["value"], marker="s", linestyle=":", alpha=0.7, label=series)
        plotting.workers_axis(axis, [*measured["workers"], *drawn["workers"]])
        plotting.legend(axis)
    rate.set_ylabel("throughput, all workers (images/s)")
    efficiency.set_ylabel("scaling efficiency (fraction of N × rate₁)")
    efficiency.set_ylim(0, 1.1)
    return figure
