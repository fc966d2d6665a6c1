"""Compare one figure across environments (the HPC-vs-cloud question of the BigGAN study).

Each environment is a results folder or a bundle of the same figure, produced under another profile or machine.
Their tidy tables are merged with `environment` as a column; the comparison figure shows per-worker throughput
by environment and, for the run with the most workers, every environment's CPU % and memory over time.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from ddlrepro.host import plotting
from ddlrepro.host.bundle import read_bundle
from ddlrepro.host.tables import read_table

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


def merged_table(figure: str, environments: dict[str, Path]) -> pd.DataFrame:
    tables = [environment_table(source, figure).assign(environment=name) for name, source in environments.items()]
    return pd.concat(tables, ignore_index=True)


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
    merged = merged_table(figure, environments)
    merged.to_csv(out_csv, index=False)
    drawing, axes = plotting.new_figure(3, f"{figure} across environments: {', '.join(environments)}")
    throughput, cpu, memory = axes
    if (merged["metric"] == "img_per_sec").any():
        label = merged["environment"] + " · " + merged["model"]
        if "framework" in merged:
            label += " · " + merged["framework"].fillna("torch") + "/" + merged["strategy"].fillna("RING")
        summary = plotting.throughput_summary(merged.assign(label=label), by=["label"])
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
