"""Compare one figure across environments (the HPC-vs-cloud question of the BigGAN study).

Each environment is a results folder or a bundle of the same figure, produced under another profile or machine.
Their tidy tables are merged with `environment` as a column (a figure whose table names its own environments,
biggan-profiles, gets `<name>: <its environment>`); runs that differ in anything but the environment are refused,
naming the differing columns. The comparison figure is the figure's own plot of the merged table where its module
sets ENVIRONMENTS_IN_TABLE (biggan-profiles: time series and the table of means beside the seed's numbers), else
per-worker throughput by environment and, for the run with the most workers, every environment's CPU % and memory
over time.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from ddlrepro.host import plotting, summaries
from ddlrepro.host.bundle import read_bundle
from ddlrepro.host.errors import UserError
from ddlrepro.host.tables import HOST_LOAD_COLUMNS, RECORD_COLUMNS, SPEED_COLUMNS, read_table

RESOURCE_METRICS = {"cpu_percent": ("CPU % per worker", 1.0), "rss_bytes": ("memory (RSS) per worker, GiB", 2.0**30)}


def environment_table(source: Path, figure: str) -> pd.DataFrame:
    """A figure's tidy table from a results folder or from a bundle tarball."""
    if source.is_file():
        members = read_bundle(source)
        name = f"results/tables/{figure}.csv"
        if name not in members:
            raise FileNotFoundError(f"{source} has no {name}")
        return read_table(io.BytesIO(members[name]))
    return read_table(source / "tables" / f"{figure}.csv")


# What may differ between environments: where the job ran (and how it was placed there, including what `auto`
# settings resolve to on each machine: threads from its cores, the backend from its GPUs), and what each run recorded.
ENVIRONMENT_COLUMNS = {
    "environment",
    "environment_kind",
    "container",
    "neighbour",
    "source",
    "threads_per_worker",
    "backend",
}
NOT_SETTINGS = {*RECORD_COLUMNS, *HOST_LOAD_COLUMNS, *SPEED_COLUMNS, "point_id", "status", "reason", "backend_used"}


def labelled(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """One environment's table: its `source` name, its environments labelled by it, its point ids made unique."""
    own = table["environment"].astype(str) if "environment" in table else None
    environment = name if own is None else name + ": " + own
    return table.assign(source=name, environment=environment, point_id=name + "/" + table["point_id"].astype(str))


def merged_table(figure: str, environments: dict[str, Path]) -> pd.DataFrame:
    check_names(list(environments))
    tables = [labelled(environment_table(source, figure), name) for name, source in environments.items()]
    merged = pd.concat(tables, ignore_index=True)
    check_like_for_like(merged)
    return merged


def check_names(names: list[str]) -> None:
    empty = [name for name in names if not name.strip()]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if empty or duplicates:
        raise UserError(f"environment names must be non-empty and unique: empty {empty}, named twice {duplicates}")


def check_like_for_like(merged: pd.DataFrame) -> None:
    """ValueError naming every setting (a point's parameter) whose values differ between the environments."""
    settings = [column for column in merged.columns if column not in NOT_SETTINGS | ENVIRONMENT_COLUMNS]
    # map(str), not astype(str): pandas 3 keeps NaN through astype(str), and NaN does not sort with strings.
    values = merged[["source", *settings]].map(str).drop_duplicates()
    differing = [
        column
        for column in settings
        if values.groupby("source")[column].agg(lambda seen: tuple(sorted(set(seen)))).nunique() > 1
    ]
    if differing:
        raise UserError(f"the environments' runs differ in more than the environment: {', '.join(differing)}")


def resource_profiles(merged: pd.DataFrame) -> pd.DataFrame:
    """Per environment, the resource samples of its run with the most workers, time relative to the run start
    (every worker's samples; the plot averages them per second)."""
    resources = merged[merged["metric"].isin(list(RESOURCE_METRICS))]
    largest = resources.loc[resources.groupby("environment")["workers"].transform("max") == resources["workers"]]
    first_point = largest.groupby("environment")["point_id"].transform("min")
    largest = largest[largest["point_id"] == first_point]
    start = largest.groupby("environment")["time"].transform("min")
    return largest.assign(elapsed_s=largest["time"] - start)


def compare_environments(figure: str, environments: dict[str, Path], out_png: Path, out_csv: Path) -> pd.DataFrame:
    from ddlrepro.host.figures import figure_module

    merged = merged_table(figure, environments)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    merged.to_csv(out_csv, index=False)
    module = figure_module(figure)
    if getattr(module, "ENVIRONMENTS_IN_TABLE", False):
        summary = module.summarize(merged)
        drawing = module.plot(merged, summary, "compared", [])
        summary.to_csv(out_csv.with_suffix(".summary.csv"), index=False)
        plotting.save(drawing, str(out_png), str(out_png.with_suffix(".pdf")))
        return merged
    drawing, axes = plotting.new_figure(3, f"{figure} across environments: {', '.join(environments)}")
    throughput, cpu, memory = axes
    if (merged["metric"] == "img_per_sec").any():
        label = merged["environment"] + " · " + merged["model"]
        if "framework" in merged:
            label += " · " + merged["framework"].fillna("torch") + "/" + merged["strategy"].fillna("RING")
        summary = summaries.throughput_summary(merged.assign(label=label), by=["label"])
        plotting.errorbar_lines(throughput, summary, "per_worker", "confidence", hue="label")
        plotting.workers_axis(throughput, summary["workers"])
        throughput.set_ylabel("images/s per worker (mean ± 1.96·std)")
        throughput.legend(fontsize="small")
    profiles = resource_profiles(merged)
    for axis, (metric, (label, unit)) in zip((cpu, memory), RESOURCE_METRICS.items(), strict=True):
        rows = profiles[profiles["metric"] == metric]
        per_second = rows.assign(elapsed_s=rows["elapsed_s"].round())
        mean = per_second.groupby(["environment", "elapsed_s"], as_index=False)["value"].mean()
        for environment, series in mean.groupby("environment", sort=False):
            axis.plot(series["elapsed_s"], series["value"] / unit, label=environment)
        axis.set_xlabel("seconds since the run started")
        axis.set_ylabel(label)
        axis.legend(fontsize="small")
    plotting.save(drawing, str(out_png), str(out_png.with_suffix(".pdf")))
    return merged
