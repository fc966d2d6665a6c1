"""EasyScale Figs 14–15 (simulated): profile runs into the simulator's profile table, the summary and checks of a
simulation recorded from real profile runs, its labels, bad settings named before any job, and the workflow end
to end."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from conftest import REPO, as_replicates, copy_workflow, only_figures, snakemake

from ddlrepro.host.bundle import read_bundle, verify_bundle
from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import check_figure, figure_references
from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.figures import draw_figure, figure_points
from ddlrepro.host.figures.easyscale_fig14 import (
    POLICIES,
    REFERENCE_MEDIAN_STEP_S,
    in_reference_time,
    profile_table,
    simulation_table,
    summarize,
)
from ddlrepro.host.simulator.step_profiles import TIDY_COLUMNS, ProfileError, from_table
from ddlrepro.host.simulator.traces import ARTIFACT_COLUMNS
from ddlrepro.host.tables import read_table

PROFILE_RUNS = REPO / "tests" / "data" / "easyscale-fig14-profile-runs.csv"  # resnet20's runs of the smoke config
RECORDED = figure_file("easyscale-fig14", "recorded.csv")  # the smoke config's simulation
LABELS = ["profiles_host", "cluster", "trace", "restart", "application_map", "round_s"]  # on the profile rows
ORDER_CHECKS = [
    "jct-heter-below-homo",
    "jct-homo-below-yarn-cs",
    "makespan-heter-below-homo",
    "makespan-homo-below-yarn-cs",
    "heter-allocates-more",
]


def references() -> list[dict]:
    return figure_references()["easyscale-fig14"]


def test_profile_table_is_one_ests_step_per_run() -> None:
    runs = read_table(PROFILE_RUNS)
    profiles = profile_table(runs, "here")
    assert list(profiles.columns[: len(TIDY_COLUMNS)]) == TIDY_COLUMNS and len(profiles) == 4
    row = profiles[(profiles["device_type"] == "slow") & (profiles["ests_per_device"] == 2)].iloc[0]
    point = runs[(runs["profile_type"] == "slow") & (runs["ests_per_device"] == 2)]
    assert point["logical_workers"].iloc[0] == 4 and set(point["rank"]) == {0, 1}  # 2 devices, 2 ESTs each
    steps = point[(point["metric"] == "step_time_s") & (point["step"] >= 2)]
    slowest = steps.groupby("step")["value"].max()  # a step ends when its slower device does
    assert row["step_time_s"] == pytest.approx(slowest.median() / 2)
    assert row["checkpoint_restore_s"] == point.loc[point["metric"] == "checkpoint_restore_s", "value"].iloc[0]
    loaded = from_table(profiles)
    assert loaded.step_time("resnet20", "slow", 8, 2) == pytest.approx(row["step_time_s"])
    assert loaded.hosts == ("here",)


def test_a_bad_profile_run_is_named_by_its_point_id() -> None:
    runs = read_table(PROFILE_RUNS)
    profiles = profile_table(runs, "here")
    slow = profiles.index[(profiles["device_type"] == "slow") & (profiles["ests_per_device"] == 2)][0]
    profiles.loc[slow, "step_time_s"] = -1.0
    point_id = profiles.loc[slow, "point_id"]
    with pytest.raises(ProfileError, match=rf"profile runs run {point_id}, column step_time_s"):
        from_table(profiles, "profile runs")


def test_the_simulation_is_the_same_on_a_faster_or_slower_machine() -> None:
    """The recorded profiles as a machine twice as fast and one 1.5x slower would measure them: in the simulation's
    unit (in_reference_time) every job's start, finish and JCT and every allocation are the same; in raw seconds
    the fast machine's cluster is less contended and the policies' numbers move."""
    recorded = read_table(RECORDED)
    measured = recorded[recorded["kind"] == "profile"][[*TIDY_COLUMNS, "checkpoint_restore_s"]].reset_index(drop=True)
    assert measured["step_time_s"].median() == pytest.approx(REFERENCE_MEDIAN_STEP_S, rel=0.01)  # the reference day
    section = load_config(REPO / "config" / "config.yaml")["figures"]["easyscale-fig14"]
    section["simulation"] |= {"restart": "measured"}  # the checkpoint times scale too

    def simulated(rows: pd.DataFrame) -> pd.DataFrame:
        table = simulation_table(rows, from_table(rows), section)
        return table[table["kind"] != "profile"].drop(columns=["host"], errors="ignore").reset_index(drop=True)

    def at_speed(speedup: float) -> pd.DataFrame:
        times = {"step_time_s": measured["step_time_s"] / speedup}
        return measured.assign(**times, checkpoint_restore_s=measured["checkpoint_restore_s"] / speedup)

    reference = simulated(in_reference_time(measured))
    for speedup in (2.0, 1 / 1.5):
        pd.testing.assert_frame_equal(simulated(in_reference_time(at_speed(speedup))), reference, rtol=1e-9)
    raw_fast, raw = (jobs[jobs["kind"] == "job"]["jct_s"] for jobs in (simulated(at_speed(2.0)), simulated(measured)))
    assert len(raw) == 4 * 68 and not np.allclose(raw_fast * 2, raw)  # twice as fast, not in half the time


def test_the_recorded_simulation_is_what_the_engine_makes_of_its_profiles_today() -> None:
    """The recorded table's own profile rows, simulated again with the smoke config's settings, give its jobs and
    allocations bit for bit, and its labels: engine or config drift shows here. (After an intended change,
    re-record: run the smoke config's fig14 and copy results/tables/easyscale-fig14.simulated.csv to RECORDED.)"""
    recorded = read_table(RECORDED)
    profile_rows = recorded[recorded["kind"] == "profile"].dropna(axis=1, how="all")
    section = load_config(REPO / "config" / "config.yaml")["figures"]["easyscale-fig14"]
    again = simulation_table(profile_rows.drop(columns=["kind", *LABELS]), from_table(profile_rows), section)
    for kind in ("job", "allocation"):
        before = recorded[recorded["kind"] == kind].dropna(axis=1, how="all").reset_index(drop=True)
        after = again[again["kind"] == kind].reset_index(drop=True)
        pd.testing.assert_frame_equal(before, after[before.columns], check_dtype=False)
    labels = again[again["kind"] == "profile"][LABELS].drop_duplicates()
    assert labels.to_dict("records") == profile_rows[LABELS].drop_duplicates().to_dict("records")


def test_recorded_simulation_passes_its_checks() -> None:
    summary = summarize(read_table(RECORDED))
    assert list(summary["policy"]) == POLICIES and (summary["jobs"] == 68).all()
    one = check_figure("easyscale-fig14", summary, references(), "smoke").set_index("check")
    assert set(one.loc[ORDER_CHECKS, "status"]) == {"inconclusive"}  # timing claims: one simulation, no interval
    checks = check_figure("easyscale-fig14", as_replicates(summary), references(), "smoke").set_index("check")
    assert (checks.loc[ORDER_CHECKS, "status"] == "pass").all(), checks.loc[ORDER_CHECKS, ["measured", "reference"]]
    assert set(checks.loc[checks["scale"] == "paper", "status"]) == {"skipped"}
    paper = check_figure("easyscale-fig14", summary, references(), "paper").set_index("check")
    assert set(paper.loc[paper["scale"] == "paper", "reason"]) == {summary["jct_ratio_yarn_cs_skipped"].iloc[0]}


@pytest.mark.parametrize(
    ("column", "check"),
    [
        ("mean_jct_s", "jct-heter-below-homo"),
        ("makespan_s", "makespan-homo-below-yarn-cs"),
        ("mean_devices_allocated", "heter-allocates-more"),
    ],
)
def test_each_order_check_fails_on_a_tie(column: str, check: str) -> None:
    summary = summarize(read_table(RECORDED)).set_index("policy")
    first, second = ("easyscale-homo", "yarn-cs") if "yarn" in check else ("easyscale-heter", "easyscale-homo")
    summary.loc[first, column] = summary.loc[second, column]
    tied = as_replicates(summary.reset_index())
    checks = check_figure("easyscale-fig14", tied, references(), "smoke").set_index("check")
    assert checks.loc[check, "status"] == "fail"


def test_figure_and_summary_say_simulated_and_emulated() -> None:
    table = read_table(RECORDED)
    drawing, summary = draw_figure("easyscale-fig14", table, "smoke", references(), "test machine")
    footer = drawing.get_supxlabel().replace("\n", " ")
    plt.close(drawing)
    assert "EasyScale Figs 14–15 (simulated)" in drawing.get_suptitle()
    assert "simulated, profiles from" in footer and "device types emulated on CPU" in footer
    assert "bert → bert_tiny" in footer and "bert → bert_tiny" in summary["application_map"].iloc[0]
    assert "device types emulated on CPU" in summary["profiles_host"].iloc[0] and summary["simulated"].all()
    caption = figure_file("easyscale-fig14", "caption.rst").read_text()
    assert "Simulated" in caption and "emulated on CPU" in caption


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"device_types": ["fast", "gpu"]}, "figures.easyscale-fig14.device_types[1]: unknown device type 'gpu'"),
        ({"simulation": {"cluster": {"fast": 4, "v100": 4}}}, "figures.easyscale-fig14.simulation.cluster.v100"),
        ({"simulation": {"trace": "no/such/trace.csv"}}, "figures.easyscale-fig14.simulation.trace: no/such"),
        ({"profiles_dir": "no/such/folder"}, "figures.easyscale-fig14.profiles_dir: no/such/folder is not a folder"),
        ({"warmup_steps": 6}, "figures.easyscale-fig14.warmup_steps: 6 leaves none of the 6 steps timed"),
        ({"ests_per_device": [2]}, "figures.easyscale-fig14.ests_per_device: must include 1"),
        ({"simulation": {"cluster": {"fast": 0, "slow": 0}}}, "figures.easyscale-fig14.simulation.cluster: no devices"),
    ],
)
def test_bad_settings_name_their_key(change: dict, message: str) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    section = config["figures"]["easyscale-fig14"]
    for key, value in change.items():
        section[key] = {**section[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        figure_points(config)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_profile_run_holds_devices_per_profile_processes_of_its_type(devices: int) -> None:
    """Each profile run: `devices` processes of one type, each holding the profiled ESTs."""
    config = load_config(REPO / "config" / "config.yaml")
    config["figures"]["easyscale-fig14"]["devices_per_profile"] = devices
    points = list(figure_points(config)["easyscale-fig14"].values())
    for point in points:
        ests = point.params["ests_per_device"]
        assert point.workers == devices and point.params["placement"] == [ests] * devices
        assert point.params["logical_workers"] == ests * devices
    slow = [point for point in points if point.params["profile_type"] == "slow"]  # the default type needs no params
    assert slow and all([spec["name"] for spec in p.params["device_types"]] == ["slow"] * devices for p in slow)


def test_a_cluster_type_without_devices_needs_no_profile() -> None:
    """Config files merge key by key: the artifact's cluster beside the emulated types set to 0 devices."""
    config = load_config(REPO / "config" / "config.yaml")
    config["figures"]["easyscale-fig14"]["simulation"]["cluster"] = {"fast": 4, "slow": 0, "v100": 0}
    assert len(figure_points(config)["easyscale-fig14"]) == 8


@pytest.mark.serial  # judges its timing claims over undisturbed replicates
@pytest.mark.slow
def test_snakemake_easyscale_fig14_end_to_end(workflow_copy: Path) -> None:
    """One model on both types, 1 and 2 ESTs per device, 2 steps, two replicates: runs, one simulation per
    replicate (in the machine-speed-free unit), plot and checks (timing claims judged over both)."""
    overlay = workflow_copy / "fig14.yaml"
    figure = {"enabled": True, "models": ["resnet20"], "steps": 2, "warmup_steps": 1}
    overlay.write_text(json.dumps({"figures": {"easyscale-fig14": figure}, "checks": {"replicates": 2}}))
    built = snakemake(workflow_copy, "easyscale_fig14", "--configfile", "tests/configs/tiny.yaml", str(overlay))
    assert built.returncode == 0, built.stderr[-3000:]
    results = workflow_copy / "results"
    assert (results / "figures" / "easyscale-fig14.png").stat().st_size > 0
    simulated = read_table(results / "tables" / "easyscale-fig14.simulated.csv")
    assert set(simulated["kind"]) == {"profile", "job", "allocation"}
    profiles = simulated[simulated["kind"] == "profile"]
    assert len(profiles) == 2 * 4 and set(simulated["replicate"]) == {0, 1}
    for _, rows in profiles.groupby("replicate"):  # each replicate's profiles in the unit: its median EST step
        assert rows["step_time_s"].median() == pytest.approx(REFERENCE_MEDIAN_STEP_S)
    checks = pd.read_csv(results / "checks" / "easyscale-fig14.tsv", sep="\t").set_index("check")
    assert checks.loc[ORDER_CHECKS, "measured"].notna().all() and (checks.loc[ORDER_CHECKS, "n"] == 2).all()
    assert (checks.loc[ORDER_CHECKS, "tier"] == "timing").all()
    host = profiles["profiles_host"].iloc[0]
    assert "device types emulated on CPU" in host and "CPU quota " in host and "times x" in host
    assert set(checks.loc[checks["scale"] == "paper", "status"]) == {"skipped"}


# A user's trace in the artifact's format (its ninth, unnamed column included); applications mapped onto resnet20.
USER_TRACE = ",".join([*ARTIFACT_COLUMNS, "\n"]) + "job0,0,resnet50,4,8,1,1,fast,\njob1,30,bert,2,8,1,0,slow,\n"


@pytest.mark.slow
def test_a_bundle_carries_the_users_trace_and_verifies_without_it(tmp_path: Path) -> None:
    """The simulation read a file outside results/: the bundle holds it, and re-derives the figure from its copy
    after the original is gone."""
    workdir = copy_workflow(tmp_path / "workflow", commit=True)
    trace = tmp_path / "my-trace.csv"
    trace.write_text(USER_TRACE)
    figure = {"models": ["resnet20"], "steps": 2, "warmup_steps": 1, "simulation": {"trace": str(trace)}}
    figures = only_figures({"easyscale-fig14": figure})
    (workdir / "fig14.yaml").write_text(json.dumps({"figures": figures}))
    built = snakemake(workdir, "bundle", "--configfile", "tests/configs/tiny.yaml", "fig14.yaml")
    assert built.returncode == 0, built.stderr[-3000:]
    (bundle,) = (workdir / "results" / "bundle").glob("ddlrepro-*.tar.gz")
    assert read_bundle(bundle)["inputs/easyscale-fig14/trace/my-trace.csv"] == USER_TRACE.encode()
    simulated = read_table(workdir / "results" / "tables" / "easyscale-fig14.simulated.csv")
    assert set(simulated.loc[simulated["kind"] == "job", "id"]) == {"job0", "job1"}
    trace.unlink()
    assert verify_bundle(bundle) == []
