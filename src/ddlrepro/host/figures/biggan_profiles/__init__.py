"""BigGAN resource profiles (seed: BigGAN under DDP on an HPC cluster and on OpenShift, resource use read off
dashboards): the same GAN job (rank/workloads/gan.py) in each configured environment (host/environments.py), its
resource samples (rank/runtime.py's ResourceSampler) as time series and as mean, p5, p95 per environment.

Points: one per environment, every other parameter equal (like for like: same workers, batch, steps; the seed ran
2 GPUs on a shared HPC node against 1 GPU in a container on another node, and read percentages of different nodes).
`container` environments are this machine's podman containers, labelled as the stand-in for OpenShift.

Summary, one row per environment: per series (job CPU cores, job CPU % of node and of allocation, node CPU %,
foreign CPU % of node = node − job, job memory GiB and % of node and of allocation, node memory %, GPU utilisation
and memory %) its mean, p5 and p95 over the run's sample ticks (job series summed over the ranks at each tick,
node series averaged), the ticks and the seconds the CPU samples cover (`cpu_sampled_s`), the mean step time,
and the spread of job memory across environments. Plot: CPU, memory and GPU over time, and a table of the means
beside the seed's dashboard numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import require
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "biggan-profiles"
ENVIRONMENTS_IN_TABLE = True  # `ddlrepro compare` merges results folders into one table and draws it with `plot`
TITLE = "BigGAN resource profiles: one GAN job (DDP) per environment; 'container' = podman stand-in for OpenShift"
GAN_KEYS = [
    "steps",
    "batch_size",
    "resolution",
    "channels",
    "z_dim",
    "attention_resolution",
    "d_steps",
    "lr_g",
    "lr_d",
    "betas",
    "seed",
]
# The seed's dashboard readings (issue 19), as it reported them: percentages of two different nodes.
SEED_NUMBERS = {
    "hpc (seed, 2 GPUs, Slurm)": {
        "node_cpu_percent": "< 20",
        "node_memory_percent": "8.3 (95/1145 GB)",
        "gpu_utilization_percent": "≈ 100",
        "gpu_memory_percent": "≈ 80",
    },
    "cloud (seed, 1 GPU, OpenShift)": {
        "node_cpu_percent": "≈ 2",
        "node_memory_percent": "15 (84/541 GB)",
        "gpu_utilization_percent": "≈ 40",
        "gpu_memory_percent": "5–10",
    },
}
GIB = 2.0**30
# Series summed over the ranks at each tick (the job's) and averaged over them (the node's, seen by every rank).
JOB_SERIES = {
    "job_cpu_cores": ("cpu_percent", 0.01),
    "job_cpu_percent_of_node": ("cpu_percent_of_node", 1.0),
    "job_memory_gib": ("rss_bytes", 1 / GIB),
    "job_memory_percent_of_node": ("memory_percent_of_node", 1.0),
}
NODE_SERIES = {
    "node_cpu_percent": "node_cpu_percent",
    "node_memory_percent": "node_memory_percent",
    "gpu_utilization_percent": "gpu_utilization_percent",
    "gpu_memory_percent": "gpu_memory_percent",
}
NEEDS_CUDA = "skipped: needs CUDA"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_environments(section["environments"])
    inputs = data_inputs(section)
    common = {
        **{key: section[key] for key in GAN_KEYS},
        "dataset": section["dataset"],
        "backend": launcher["backend"],
        "sample_interval_s": launcher["sample_interval_s"],
    }
    return [environment_point(section, environment, common, inputs) for environment in section["environments"]]


def missing_data(section: dict[str, Any], download: bool) -> str | None:
    """What this figure waits for: the user's own images (dataset folder; never downloaded)."""
    from ddlrepro.rank.datasets import IMAGE_FOLDER_FILES

    folder = section["data_dir"]
    if section["dataset"] != "folder" or (folder and all((Path(folder) / f).is_file() for f in IMAGE_FOLDER_FILES)):
        return None
    return (
        f"set figures.{ID}.data_dir to a folder holding {' and '.join(IMAGE_FOLDER_FILES)} (your own images, "
        f"uint8 N×3×{section['resolution']}×{section['resolution']}; never downloaded)"
    )


def data_inputs(section: dict[str, Any]) -> dict[str, str]:
    """The images folder (dataset folder), checked before any job; absolute, and out of the points' ids."""
    if section["dataset"] != "folder":
        return {}
    from ddlrepro.rank.datasets import check_image_folder

    require(section["data_dir"] is not None, ID, "data_dir", "dataset folder requires data_dir (never downloaded)")
    try:
        check_image_folder(section["data_dir"], section["resolution"])
    except (OSError, ValueError) as error:
        require(False, ID, "data_dir", str(error))
    return {"data_dir": str(Path(section["data_dir"]).expanduser().resolve())}


def environment_point(
    section: dict[str, Any], environment: dict[str, Any], common: dict[str, Any], inputs: dict[str, str]
) -> Point:
    placement: dict[str, Any] = {key: environment[key] for key in ("container", "neighbour") if key in environment}
    params = {**common, "environment": environment["name"], "environment_kind": environment["kind"], **placement}
    return Point(ID, "gan", section["workers"], section["threads_per_worker"], params, inputs)


def check_environments(environments: list[dict[str, Any]]) -> None:
    """Names unique (the schema refuses empty ones); a container's limits and a neighbour only with a container
    engine."""
    names = [environment["name"] for environment in environments]
    for index, environment in enumerate(environments):
        key = f"environments[{index}]"
        earlier = environment["name"] in names[:index]
        require(not earlier, ID, f"{key}.name", f"{environment['name']!r} named twice")
        container = environment["kind"] == "container"
        require(
            "neighbour" not in environment or container,
            ID,
            f"{key}.neighbour",
            f"a neighbour runs in a container: kind {environment['kind']!r} has no container engine",
        )
        require(container == ("container" in environment), ID, f"{key}.container", "limits for kind container only")


def tick_series(rows: pd.DataFrame, interval_s: float, workers: int) -> pd.DataFrame:
    """One row per sample tick of a run: every job series (summed over ranks) and node series (their mean), with
    the seconds since the run's first tick. Ticks some rank did not sample (start, end) are left out; the first
    tick has no CPU (rank/runtime.py's ResourceSampler reads CPU over whole intervals only)."""
    import pandas as pd

    samples = rows[rows["metric"].isin([m for m, _ in JOB_SERIES.values()] + list(NODE_SERIES.values()))]
    samples = samples.assign(tick=(samples["time"] / interval_s).round() * interval_s)
    complete = samples.groupby("tick")["rank"].transform("nunique") == workers
    by_tick = samples[complete].pivot_table(index="tick", columns=["metric", "rank"], values="value", aggfunc="mean")
    series = pd.DataFrame(index=by_tick.index)
    for name, (metric, unit) in JOB_SERIES.items():  # NaN where a rank has no such sample (CPU on the first tick)
        series[name] = by_tick[metric].sum(axis=1, min_count=workers) * unit
    for name, metric in NODE_SERIES.items():
        if metric in by_tick.columns.get_level_values(0):
            series[name] = by_tick[metric].mean(axis=1)
    series["foreign_cpu_percent_of_node"] = (series["node_cpu_percent"] - series["job_cpu_percent_of_node"]).clip(0)
    limits = allocation(rows)
    for name, limit in limits.items():
        if limit:
            base = "job_cpu_cores" if name == "cpu" else "job_memory_gib"
            series[f"job_{name if name == 'cpu' else 'memory'}_percent_of_allocation"] = 100 * series[base] / limit
    return series.reset_index().assign(elapsed_s=lambda frame: frame["tick"] - frame["tick"].min())


def allocation(rows: pd.DataFrame) -> dict[str, float | None]:
    """The job's allocation (cores, GiB): every rank's own container's limit added up where ranks ran in their own
    containers, else the one allocation they share on the node (Slurm's, a cgroup around the whole job)."""
    own = rows["environment_kind"].iloc[0] == "container"
    limits = {}
    for name, metric, unit in (("cpu", "allocation_cpu_cores", 1.0), ("memory", "allocation_memory_bytes", 1 / GIB)):
        values = rows.loc[rows["metric"] == metric, "value"]
        limits[name] = (values.sum() if own else values.max()) * unit if not values.empty else None
    return limits


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per environment (see the module's docstring); a skipped environment keeps its reason."""
    import pandas as pd

    from ddlrepro.host import summaries

    rows = []
    for point_id, point_rows in table.groupby("point_id", sort=False):
        first = point_rows.iloc[0]
        row = {"environment": first["environment"], "kind": first["environment_kind"], "point_id": point_id}
        if (point_rows["metric"] == "skipped").all():
            rows.append(row | {"status": "skipped", "reason": first.get("reason", "")})
            continue
        series = tick_series(point_rows, float(first["sample_interval_s"]), int(first["workers"]))
        steps = point_rows.loc[(point_rows["metric"] == "step_time_s") & (point_rows["step"] > 0), "value"]
        limits = allocation(point_rows)
        row |= {
            "status": "ok",
            "reason": "",
            "neighbour": isinstance(first.get("neighbour"), str) and first["neighbour"] != "",
            "ticks": len(series),
            "cpu_sampled_s": series["job_cpu_cores"].notna().sum() * float(first["sample_interval_s"]),
            "step_time_s": float(steps.mean()),
            "allocation_cpu_cores": limits["cpu"],
            "allocation_memory_gib": limits["memory"],
        }
        for name in [c for c in series.columns if c not in ("tick", "elapsed_s")]:
            values = series[name].dropna()
            row |= {f"{name}_mean": values.mean(), f"{name}_p5": values.quantile(0.05)}
            row[f"{name}_p95"] = values.quantile(0.95)
        if "gpu_utilization_percent" not in series:
            row |= {f"gpu_{what}_percent_mean_skipped": NEEDS_CUDA for what in ("utilization", "memory")}
        rows.append(row)
    summary = summaries.with_host_load(pd.DataFrame(rows), table, ["point_id"])
    return with_memory_spread(summary).drop(columns=["point_id"])


def with_memory_spread(summary: pd.DataFrame) -> pd.DataFrame:
    """Every row gets the job memory's spread across the environments that ran: (largest − smallest) ÷ smallest."""
    ran = summary[summary["status"] == "ok"]
    if "job_memory_gib_mean" in ran and len(ran) > 1:
        memory = ran["job_memory_gib_mean"]
        return summary.assign(job_memory_spread=(memory.max() - memory.min()) / memory.min())
    return summary.assign(job_memory_spread=float("nan"), job_memory_spread_skipped="skipped: fewer than 2 ran")


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting, summaries
    from ddlrepro.host.tables import as_flags

    figure, axes = plotting.new_figure(4, TITLE, panel_size=(6.0, 4.6), table_below=True)
    cpu, memory, gpu, means = axes
    ran = table[table["metric"] != "skipped"]
    for _, point_rows in ran.groupby("point_id", sort=False):
        first = point_rows.iloc[0]
        series = tick_series(point_rows, float(first["sample_interval_s"]), int(first["workers"]))
        label = str(first["environment"])
        pair(cpu, series, "node_cpu_percent", "job_cpu_percent_of_node", (f"{label}: node", f"{label}: job"))
        disturbed = [bool(as_flags(point_rows["disturbed"]).any())] * len(series)
        plotting.ring_disturbed(cpu, series["elapsed_s"], series["node_cpu_percent"], disturbed)
        pair(memory, series, "node_memory_percent", "job_memory_percent_of_node", (f"{label}: node", f"{label}: job"))
        if "gpu_utilization_percent" in series:
            gpu_labels = (f"{label}: utilisation", f"{label}: memory")
            pair(gpu, series, "gpu_utilization_percent", "gpu_memory_percent", gpu_labels)
    for axis, title, ylabel in (
        (cpu, "CPU (solid: node, dashed: job)", "node's CPUs (%)"),
        (memory, "memory (solid: node, dashed: job RSS)", "node's memory (%)"),
        (gpu, "GPU (NVML)", "utilisation, device memory (%)"),
    ):
        plotting.panel_title(axis, title)
        axis.set_xlabel("time since the run's first sample (s)")
        axis.set_ylabel(ylabel)
        if axis.lines:
            plotting.legend(axis)
    if not gpu.lines:
        gpu.set_xticks([])
        gpu.set_yticks([])
        gpu.text(0.5, 0.5, NEEDS_CUDA, ha="center", transform=gpu.transAxes)
    means_table(means, summary)
    plotting.note_skipped(gpu, summaries.skipped_points(table, ["environment"]), ["environment"])
    plotting.note_disturbed(cpu, summary, ["environment"])
    return figure


def pair(axis: Any, series: pd.DataFrame, solid: str, dashed: str, labels: tuple[str, str]) -> None:
    """Two series of one environment over time, in one colour: `solid` and `dashed`."""
    line = axis.plot(series["elapsed_s"], series[solid], label=labels[0])[0]
    axis.plot(series["elapsed_s"], series[dashed], "--", color=line.get_color(), label=labels[1])


def means_table(axis: Any, summary: pd.DataFrame) -> None:
    """Mean [p5–p95] of the node series per environment that ran, beside the seed's dashboard numbers."""
    from ddlrepro.host import plotting

    series = list(SEED_NUMBERS[next(iter(SEED_NUMBERS))])
    ran = summary[summary["status"] == "ok"]
    rows, labels = [], []
    for _, row in ran.iterrows():
        labels.append(str(row["environment"]))
        rows.append([describe(row, name) for name in series])
    for name, numbers in SEED_NUMBERS.items():
        labels.append(name)
        rows.append([numbers[column] for column in series])
    axis.axis("off")
    axis.set_xticks([])
    axis.set_yticks([])
    columns = ["node CPU %", "node mem. %", "GPU util. %", "GPU mem. %"]
    cells = [[label, *row] for label, row in zip(labels, rows, strict=True)]
    widths = [0.28, 0.18, 0.18, 0.18, 0.18]
    drawn = axis.table(cellText=cells, colLabels=["environment", *columns], colWidths=widths, bbox=[0, 0, 1, 0.9])
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(9)
    plotting.panel_title(axis, "mean [p5–p95]; seed")


def describe(row: pd.Series, name: str) -> str:
    mean = row.get(f"{name}_mean")
    if mean is None or mean != mean:
        return "needs CUDA" if name.startswith("gpu") else "not measured"
    return f"{mean:.1f} [{row[f'{name}_p5']:.0f}–{row[f'{name}_p95']:.0f}]"
