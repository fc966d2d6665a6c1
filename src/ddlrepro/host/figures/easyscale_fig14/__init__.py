"""EasyScale Figs 14–15, simulated: mean JCT and makespan per scheduling policy (Fig 14) and devices allocated over
time (Fig 15), from one simulation of a trace (host/simulator): 68 generated jobs (the artifact trace's rows; the
paper says 67), or a user's file.

Points (profiles): one consistent-training (D1) run per model × device type (emulated on CPU) × per-EST batch × ESTs
per device: `devices_per_profile` processes of that type, each holding k ESTs (placement [k] × devices_per_profile),
`steps` steps of which the first `warmup_steps` are not timed, and a timed checkpoint save + restore at the end. A
profile value: seconds of one EST's step with k ESTs on the device = median step time (of the slowest process) ÷ k.
With `profiles_dir` (the artifact's logs.json) no point runs and the cluster's types are the artifact's.

Measured profiles enter the simulation in a machine-speed-free unit (REFERENCE_MEDIAN_STEP_S below): the trace's
submit times are fixed seconds, so in raw seconds the cluster's contention would follow the day's machine speed.
With replicates, each replicate's profile runs are simulated on their own (figures.simulate_replicates).

The simulation is its own workflow job (`simulate_table`): from the points' tidy table to the simulation's tidy
table (`kind` profile, job or allocation rows, every row labelled with the profiles' host, the cluster, the trace,
the restart rule and the application mapping), which is what `plot` draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures import device_types
from ddlrepro.host.figures.common import require
from ddlrepro.host.simulator.step_profiles import ARTIFACT_HOST, ARTIFACT_TYPES
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from ddlrepro.host.simulator.step_profiles import Profiles
    from ddlrepro.host.simulator.traces import Job

ID = "easyscale-fig14"
TITLE = "EasyScale Figs 14–15 (simulated)"
EMULATED = "device types emulated on CPU"
POLICIES = ["yarn-cs", "fifo-gang", "easyscale-homo", "easyscale-heter"]
PLOTS_ONE_REPLICATE = True  # one simulation's jobs and allocations: replicates' would overlay; the checks judge all
SIMULATION_KEYS = ("profiles_dir", "simulation")  # what simulate_table reads of the section (the rule's params)
LABEL_COLUMNS = ["profiles_host", "cluster", "trace", "restart", "application_map"]
# The simulation's clock on measured profiles (issue 35): every profile time (EST steps, checkpoint + restore) scaled
# so that the median EST step is this many seconds, the median of the recorded profile runs in
# recorded.csv beside this module, a day on which the 68 jobs contend for the 32 devices. A trace's submit
# times are fixed seconds while a job's run time follows the machine's speed (2.7-4x from day to day here): in raw
# seconds a fast day leaves the cluster idle between jobs and the policies tie. In this unit the contention, and
# so every policy comparison, depends only on the profiles' ratios (models, device types, ESTs per device).
REFERENCE_MEDIAN_STEP_S = 0.223
PAPER_SKIP = "the paper's ratios need the artifact's profiles (profiles_dir, not public) and its trace (trace)"


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    check_section(section, launcher)
    if section["profiles_dir"]:
        return []
    result = []
    for model in section["models"]:
        for type_name in section["device_types"]:
            for batch in section["batches_per_est"]:
                for ests in section["ests_per_device"]:
                    result.append(profile_point(section, launcher, model, type_name, batch, ests))
    return result


def profile_point(
    section: dict[str, Any], launcher: dict[str, Any], model: str, type_name: str, batch: int, ests: int
) -> Point:
    """The profile run of `model` on `type_name`: devices_per_profile processes of it, each holding `ests` ESTs."""
    devices = section["devices_per_profile"]
    return device_types.typed_point(
        ID,
        {**section, "model": model, "batch_size": batch},
        launcher,
        [type_name] * devices,
        logical_workers=ests * devices,
        placement=[ests] * devices,
        mode="D1",
        steps=section["steps"],
        profile_type=type_name,
        ests_per_device=ests,
        checkpoint_timing=True,
    )


def check_section(section: dict[str, Any], launcher: dict[str, Any]) -> None:
    """What the schema cannot say, each error naming its key: types, the cluster's types, the files named."""
    require(
        section["warmup_steps"] < section["steps"],
        ID,
        "warmup_steps",
        f"{section['warmup_steps']} leaves none of the {section['steps']} steps timed",
    )
    require(
        1 in section["ests_per_device"],
        ID,
        "ests_per_device",
        "must include 1: gang policies (yarn-cs, fifo-gang) run one EST per device",
    )
    defined = ", ".join(sorted(launcher["device_types"]))
    for index, name in enumerate(section["device_types"]):
        require(
            name in launcher["device_types"],
            ID,
            f"device_types[{index}]",
            f"unknown device type {name!r}; launcher.device_types defines {defined}",
        )
    profiles_dir, simulation = section["profiles_dir"], section["simulation"]
    if profiles_dir:
        require(Path(profiles_dir).is_dir(), ID, "profiles_dir", f"{profiles_dir} is not a folder")
    profiled = ARTIFACT_TYPES if profiles_dir else section["device_types"]
    require(sum(simulation["cluster"].values()) > 0, ID, "simulation.cluster", "no devices")
    for name in (name for name, count in simulation["cluster"].items() if count > 0):
        require(
            name in profiled,
            ID,
            f"simulation.cluster.{name}",
            f"device type {name!r} has no profile; profiled: {', '.join(profiled)}",
        )
    trace = simulation["trace"]
    require(trace is None or Path(trace).is_file(), ID, "simulation.trace", f"{trace} does not exist")
    require(
        not (profiles_dir and simulation["restart"] == "measured"),
        ID,
        "simulation.restart",
        "measured needs checkpoint times from profile runs; with profiles_dir none run (use artifact)",
    )


def simulation_inputs(section: dict[str, Any]) -> dict[str, Path]:
    """The files the simulation reads besides the runs (a user's trace, the artifact's profiles), each by the name a
    bundle keeps it under (the trace's own file name: the figure's label names it)."""
    trace, profiles = section["simulation"]["trace"], section["profiles_dir"]
    files = {f"trace/{Path(trace).name}": Path(trace)} if trace else {}
    if profiles:
        files |= {f"profiles/{path.parent.name}/logs.json": path for path in sorted(Path(profiles).glob("*/logs.json"))}
    return files


def with_inputs_in(section: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The section reading its input files from `folder`, where a bundle's copies (simulation_inputs) lie."""
    trace, profiles = section["simulation"]["trace"], section["profiles_dir"]
    return {
        **section,
        "simulation": {**section["simulation"], "trace": str(folder / "trace" / Path(trace).name) if trace else None},
        "profiles_dir": str(folder / "profiles") if profiles else None,
    }


def profile_values(table: pd.DataFrame) -> pd.DataFrame:
    """Per profile run (point_id): model, type, batch, ESTs per device, one EST's step (the slowest process's median
    step ÷ k), checkpoint + restore."""
    from ddlrepro.host.figures.step_timing import median_step_time, timed_steps
    from ddlrepro.host.tables import HOST_LOAD_COLUMNS

    warmup = int(table["warmup_steps"].iloc[0])
    step = median_step_time(timed_steps(table, warmup), by="point_id").set_index("point_id")["step_time_s"]
    checkpoint = table[table["metric"] == "checkpoint_restore_s"].groupby("point_id")["value"].median()
    runs = table.drop_duplicates("point_id").set_index("point_id")
    values = runs[["model", "profile_type", "batch_size", "ests_per_device", *HOST_LOAD_COLUMNS]].copy()
    values["step_time_s"] = step / values["ests_per_device"]
    values["checkpoint_restore_s"] = checkpoint
    return values.reset_index()


def profile_table(table: pd.DataFrame, host: str) -> pd.DataFrame:
    """The simulator's profile table (simulator.profiles.TIDY_COLUMNS) from the profile runs' tidy table, with each
    run's checkpoint + restore seconds and host load."""
    from ddlrepro.host.simulator.step_profiles import TIDY_COLUMNS
    from ddlrepro.host.tables import HOST_LOAD_COLUMNS

    values = profile_values(table).rename(
        columns={
            "model": "application",
            "profile_type": "device_type",
            "batch_size": "batch_per_est",
        }
    )
    return values.assign(host=host)[[*TIDY_COLUMNS, "checkpoint_restore_s", *HOST_LOAD_COLUMNS, "point_id"]]


def artifact_profile_rows(profiles: Profiles) -> pd.DataFrame:
    """The rows of profiles read from the artifact's logs.json, as a tidy profile table."""
    import pandas as pd

    from ddlrepro.host.simulator.step_profiles import TIDY_COLUMNS

    rows = [
        (application, device_type, batch, ests, seconds, profiles.hosts[0])
        for (application, device_type), by_batch in sorted(profiles.times.items())
        for batch, by_ests in sorted(by_batch.items())
        for ests, seconds in sorted(by_ests.items())
    ]
    return pd.DataFrame(rows, columns=TIDY_COLUMNS)


def simulate_table(table: pd.DataFrame, section: dict[str, Any], machine: str) -> pd.DataFrame:
    """The simulation's tidy table from the profile runs' table (or the artifact's profiles in `profiles_dir`)."""
    from ddlrepro.host.simulator.step_profiles import from_table, read_artifact_dir

    if section["profiles_dir"]:
        profiles = read_artifact_dir(Path(section["profiles_dir"]))
        profile_rows = artifact_profile_rows(profiles)
    else:
        quota = f"CPU quota {device_types.quota_status(table)}"  # not applied without cgroup permission: said so
        profile_rows = in_reference_time(profile_table(table, f"{machine}; {EMULATED}, {quota}"))
        profiles = from_table(profile_rows, f"{ID} profile runs")
    return simulation_table(profile_rows, profiles, section)


def in_reference_time(profile_rows: pd.DataFrame) -> pd.DataFrame:
    """Measured profile rows in the simulation's machine-speed-free unit (REFERENCE_MEDIAN_STEP_S): step and
    checkpoint times scaled alike, the measured step kept as `measured_step_time_s`, the factor in the host label."""
    factor = REFERENCE_MEDIAN_STEP_S / float(profile_rows["step_time_s"].median())
    unit = f" (times x {factor:.3g}: a median EST step of {REFERENCE_MEDIAN_STEP_S:g} s, the reference day's)"
    return profile_rows.assign(
        measured_step_time_s=profile_rows["step_time_s"],
        step_time_s=profile_rows["step_time_s"] * factor,
        checkpoint_restore_s=profile_rows["checkpoint_restore_s"] * factor,
        host=profile_rows["host"] + unit,
    )


def simulation_table(profile_rows: pd.DataFrame, profiles: Profiles, section: dict[str, Any]) -> pd.DataFrame:
    """Every policy's simulation of the trace on `profiles`: the profile rows with the labels, then the jobs and
    allocations."""
    import pandas as pd

    from ddlrepro.host.simulator.cluster import Cluster
    from ddlrepro.host.simulator.engine import Timing, simulate

    settings = section["simulation"]
    cluster = Cluster.of(settings["cluster"])
    jobs, trace = trace_jobs(settings, profiles, cluster, artifact=bool(section["profiles_dir"]))
    restart_s, restart = restart_cost(settings, profile_rows)
    timing = Timing(settings["round_s"], settings["restart"], restart_s, settings["max_sim_time_s"])
    simulations = [simulate(jobs, cluster, profiles, policy, timing) for policy in POLICIES]
    mapped = sorted(
        {(job.trace_application, job.application) for job in jobs if job.trace_application != job.application}
    )
    labels = {
        "profiles_host": ", ".join(profiles.hosts),
        "cluster": cluster.label(),
        "trace": trace,
        "restart": restart,
        "application_map": ", ".join(f"{a} → {b}" for a, b in mapped) or "none",
        "round_s": settings["round_s"],
    }
    # The labels ride on the profile rows only (every simulation has some): the table stays small.
    parts = [
        profile_rows.assign(kind="profile", **labels),
        *(simulation.jobs.assign(kind="job") for simulation in simulations),
        *(simulation.allocations.assign(kind="allocation") for simulation in simulations),
    ]
    return pd.concat(parts, ignore_index=True)


def trace_jobs(settings: dict[str, Any], profiles: Profiles, cluster: Any, artifact: bool) -> tuple[list[Job], str]:
    """The trace's jobs (a user's file, or generated from the seed) and its label; applications without a profile
    mapped onto profiled ones. With the artifact's profiles, its trace is read by its simulator's rules (rows out of
    order kept, a repeated name replacing the earlier job)."""
    from ddlrepro.host.simulator.traces import (
        ARTIFACT_APPLICATION_COUNTS,
        generate_trace,
        map_applications,
        read_trace,
    )

    mapping = map_applications(list(ARTIFACT_APPLICATION_COUNTS), sorted(profiles.applications()))
    if settings["trace"] is None:
        jobs = generate_trace(settings["seed"], profiles, cluster, mapping)
        return jobs, f"generated with the artifact trace's statistics, seed {settings['seed']}"
    path = Path(settings["trace"])
    jobs = read_trace(path, profiles, cluster, mapping, allow_unsorted=artifact, artifact_duplicates=artifact)
    return jobs, f"{path.name} ({len(jobs)} jobs)"


def restart_cost(settings: dict[str, Any], profile_rows: pd.DataFrame) -> tuple[float, str]:
    """Seconds a (re)start costs and its label: the configured one-off start, or the measured median checkpoint."""
    if settings["restart"] == "artifact":
        seconds = float(settings["restart_s"])
        return seconds, f"artifact: {seconds:g} s once per job, reallocations free"
    seconds = float(profile_rows["checkpoint_restore_s"].median())
    return seconds, f"measured: {seconds:.3g} s (median checkpoint save + restore) at every start and reallocation"


def devices_while_busy(table: pd.DataFrame) -> pd.Series:
    """Per policy: devices allocated, averaged over the rounds in which some job had been submitted and not yet
    finished (waiting or running)."""
    jobs, allocations = table[table["kind"] == "job"], table[table["kind"] == "allocation"]
    per_round = allocations.groupby(["policy", "time_s"], as_index=False)["allocated"].sum()

    def busy(row: pd.Series) -> bool:
        own = jobs[jobs["policy"] == row["policy"]]
        return bool(((own["submit_s"] <= row["time_s"]) & (own["finish_s"] > row["time_s"])).any())

    per_round = per_round[per_round.apply(busy, axis=1)]
    return per_round.groupby("policy")["allocated"].mean()


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per policy: mean JCT, makespan (last finish; and as the artifact rounds it), devices allocated while busy,
    YARN-CS's mean JCT and makespan ÷ the policy's (NaN with the reason unless artifact profiles and trace), and
    the labels."""
    import numpy as np
    import pandas as pd

    from ddlrepro.host import summaries
    from ddlrepro.host.simulator.engine import Simulation

    jobs, round_s = table[table["kind"] == "job"], float(label(table, "round_s"))
    rows = []
    for policy in POLICIES:
        own = jobs[jobs["policy"] == policy]
        rows.append({"policy": policy, "jobs": len(own), **Simulation(policy, round_s, own, own.iloc[0:0]).summary()})
    summary = pd.DataFrame(rows)
    summary["mean_devices_allocated"] = summary["policy"].map(devices_while_busy(table))
    yarn = summary.set_index("policy").loc["yarn-cs"]
    comparable = label(table, "profiles_host") == ARTIFACT_HOST and not label(table, "trace").startswith("generated")
    # The paper's numbers compare only with a simulation of the artifact's profiles and trace: else NaN, and why.
    # Its makespans are what the artifact printed: the start of the round in which the last job finished.
    for column, source, ratio in (
        ("mean_jct_s", "mean_jct_s", "jct_ratio_yarn_cs"),
        ("makespan_s", "makespan_artifact_s", "makespan_ratio_yarn_cs"),
    ):
        summary[ratio] = yarn[source] / summary[source] if comparable else np.nan
        summary[f"{column}_vs_paper"] = summary[source] if comparable else np.nan
        for name in (ratio, f"{column}_vs_paper"):
            summary[f"{name}_skipped"] = "" if comparable else PAPER_SKIP
    for column in LABEL_COLUMNS:
        summary[column] = label(table, column)
    # Every policy's numbers rest on every profile: a disturbed profile run marks them all.
    load = summaries.run_host_load(table[table["kind"] == "profile"])
    summary["foreign_share"], summary["steal_share"] = load["foreign_share"].max(), load["steal_share"].max()
    summary["disturbed"] = bool(load["disturbed"].any())
    summary["simulated"] = True
    return summary


def label(table: pd.DataFrame, column: str) -> Any:
    """One of the simulation's labels (carried by its profile rows)."""
    return table.loc[table["kind"] == "profile", column].iloc[0]


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    import numpy as np

    from ddlrepro.host import plotting

    figure, (jct, makespan, allocated) = plotting.new_figure(3, TITLE, panel_size=(5.6, 4.6))
    x = np.arange(len(POLICIES))
    paper = paper_values(references)
    for axis, column, label in ((jct, "mean_jct_s", "mean JCT"), (makespan, "makespan_s", "makespan")):
        bars = axis.bar(x - 0.2, summary[column], 0.4, alpha=0.8, label="simulated here")
        plotting.hatch_disturbed(bars, summary["disturbed"])
        values = [paper["value"].get((policy, column), np.nan) for policy in POLICIES]
        axis.bar(x + 0.2, values, 0.4, color="0.6", hatch="//", label=paper["series"])
        axis.set_xticks(x, [policy.removeprefix("easyscale-") for policy in POLICIES], rotation=20)
        axis.set_yscale("log")
        axis.set_xlabel("policy (homo, heter: EasyScale's)")
        axis.set_ylabel(f"{label} (s, log scale)")
        plotting.panel_title(axis, f"Fig 14: {label}")
        plotting.legend(axis)
    allocations = table[table["kind"] == "allocation"].groupby(["policy", "time_s"], as_index=False)["allocated"].sum()
    for policy in POLICIES:
        rows = allocations[allocations["policy"] == policy]
        allocated.step(rows["time_s"], rows["allocated"], where="post", label=policy)
    allocated.set_xlabel("simulated time (s)")
    allocated.set_ylabel(f"devices allocated (of {summary['cluster'].iloc[0]})")
    plotting.panel_title(allocated, "Fig 15: devices allocated")
    plotting.legend(allocated)
    plotting.note_disturbed(jct, summary, ["policy"])
    plotting.add_footer(figure, labels_line(summary))
    return figure


def labels_line(summary: pd.DataFrame) -> str:
    """What the simulation was run from, for the figure: profiles' host, trace, restart rule, application mapping."""
    first = summary.iloc[0]
    mapped = f"; applications mapped {first['application_map']}" if first["application_map"] != "none" else ""
    return (
        f"simulated, profiles from {first['profiles_host']}; trace {first['trace']}; restart {first['restart']}{mapped}"
    )


def paper_values(references: list[dict[str, Any]]) -> dict[str, Any]:
    """EasyScale's simulated mean JCT and makespan by (policy, column), and their legend label."""
    drawn = [r for r in references if "series" in r]
    values = {
        (r["measured"]["where"]["policy"], r["measured"]["column"].removesuffix("_vs_paper")): r["value"] for r in drawn
    }
    return {"value": values, "series": drawn[0]["series"] if drawn else "_nolegend_"}
