"""IBM DLaaS scaling-efficiency table ("IBM Deep Learning Service", IBM J. Res. Dev. 2017): images/s and
efficiency vs workers, one model and batch.

Points: one throughput run per number of workers and data source (`data_sources`: synthetic, or shards read
from local disk, an S3 object store (SeaweedFS at smoke scale, not IBM COS) or its s3fs FUSE mount). Plot: total
images/s against the ideal, and efficiency rate_N / (N × rate_1) per source beside the DLaaS measurements; the
summary table is the DLaaS-style table.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import require, throughput_points
from ddlrepro.host.objectstore import LABEL, store_inputs
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "dlaas-scaling"
TITLE = "DLaaS scaling efficiency: images/s and efficiency vs workers"


SHARDS_DIR = f"results/data/{ID}/shards"
ENVIRONMENT_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    base = throughput_points(ID, section, [section["model"]], launcher)
    return [with_data_source(point, source, section) for source in section["data_sources"] for point in base]


def with_data_source(point: Point, source: str, section: dict[str, Any]) -> Point:
    """The point reading `source`: synthetic keeps today's point (and id); the others read the packed shards
    (`SHARDS_DIR`, relative to the checkout), from the configured store or one started for the run."""
    if source == "synthetic":
        return point
    check_store(section.get("store", {}))
    params = {**point.params, "data_source": source, "shards": section["shards"]}
    if source in ("s3", "s3fs"):  # which store: one started per run, or the configured one (its endpoint: provenance)
        params["store"] = "configured" if section.get("store", {}).get("endpoint") else "seaweedfs"
    inputs = {"shards_dir": SHARDS_DIR, **store_inputs(section.get("store", {}))}
    return replace(point, params=params, inputs=inputs)


def check_store(store: dict[str, Any]) -> None:
    """`credentials_env` names environment variables; a value that is not a name may be a key: never echo it."""
    for role, name in store.get("credentials_env", {}).items():
        require(
            bool(ENVIRONMENT_VARIABLE.match(name)),
            ID,
            f"store.credentials_env.{role}",
            "not a variable name (the value is not shown: it may be a secret); name an environment variable",
        )


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


def draw_sources(rate: Any, efficiency: Any, summary: pd.DataFrame) -> None:
    """Bars of total images/s side by side per data source, efficiency lines per source, the ideal of the first
    (synthetic data where measured)."""
    from ddlrepro.host import plotting

    sources = [source for source in SOURCE_LABELS if source in set(summary["data_source"])]
    single = sources == ["synthetic"]
    for index, source in enumerate(sources):
        rows = summary[summary["data_source"] == source]
        label = "measured" if single else SOURCE_LABELS[source]
        label += f": {rows['storage'].iloc[0]}" if source in ("s3", "s3fs") else ""
        shift = 1.3 ** (index - (len(sources) - 1) / 2)  # side by side on the log-2 axis
        width = rows["workers"] * 0.35 / len(sources)
        bars = rate.bar(rows["workers"] * shift, rows["total"], width=width, label=label, alpha=0.8)
        plotting.hatch_disturbed(bars, rows["disturbed"])
        efficiency.plot(rows["workers"], rows["efficiency"], "o-", label=label)
        plotting.ring_disturbed(efficiency, rows["workers"], rows["efficiency"], rows["disturbed"])
        if index == 0:
            rate.plot(
                rows["workers"], rows["ideal_total"], "k--", label=f"ideal (N × rate₁){'' if single else ', ' + label}"
            )
    plotting.note_disturbed(efficiency, summary, ["data_source", "workers"])


def plot(table: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> tuple[Figure, pd.DataFrame]:
    from ddlrepro.host import plotting

    table = with_default_data_source(table)
    summary = plotting.throughput_summary(table, by=["model", "batch_size", "data_source", "storage"])
    figure, (rate, efficiency) = plotting.new_figure(2, TITLE, panel_size=(6.0, 4.2))

    draw_sources(rate, efficiency, summary)
    for axis, column in ((rate, "images_per_sec"), (efficiency, "efficiency")):
        drawn = plotting.drawn_references(references, column, "workers", scale)
        for series, rows in drawn.groupby("series", sort=True):
            axis.plot(rows["workers"], rows["value"], marker="s", linestyle=":", alpha=0.7, label=series)
        plotting.workers_axis(axis, [*summary["workers"], *drawn["workers"]])
        plotting.legend(axis)
    rate.set_ylabel("throughput, all workers (images/s)")
    efficiency.set_ylabel("scaling efficiency (fraction of N × rate₁)")
    efficiency.set_ylim(0, 1.1)
    columns = [
        "model",
        "batch_size",
        "data_source",
        "storage",
        "workers",
        "total",
        "per_worker",
        "confidence",
        "efficiency",
    ]
    columns += plotting.HOST_LOAD_COLUMNS
    return figure, summary[columns].rename(columns={"total": "images_per_sec"})
