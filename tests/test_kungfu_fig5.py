"""KungFu Fig 5 end to end: bad input refused before any job, skipped without root, and `snakemake kungfu_fig5`
on real testbed hosts (as root) whose checks hold."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, assert_refused, snakemake

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import figure_points, kungfu_fig5
from ddlrepro.host.launchers import check_points, configured_launcher
from ddlrepro.host.launchers.base import RunFailed
from ddlrepro.host.run import run_point, unmet_requirement
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.testbed import remove_leftovers
from ddlrepro.host.testbed.limits import unavailable_reason
from ddlrepro.host.testbed.network import NETNS_RUN
from ddlrepro.host.testing import local_launcher

REASON = unavailable_reason()
FIGURE = "kungfu-fig5"


@pytest.fixture(scope="module")
def smoke() -> dict:
    return load_config(REPO / "config" / "config.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"link_rate": "0mbit"}, r"figures\.kungfu-fig5\.link_rate: link rate '0mbit' must be above 0"),
        ({"traffic_rate": "fast"}, r"figures\.kungfu-fig5\.traffic_rate: link rate 'fast' is not a rate"),
        ({"interference_step": 22}, r"figures\.kungfu-fig5\.interference_step: 22 is not before the run's end"),
        ({"strategy": "RING"}, r"figures\.kungfu-fig5\.strategy: 'RING': KungFu's policy moves the root of a STAR"),
        ({"workers": 1}, r"figures\.kungfu-fig5\.workers: 1 is less than the minimum of 2"),
        ({"reference_step": 9}, r"figures\.kungfu-fig5\.reference_step: 9 must come before interference_step 9"),
        ({"model": "bert_tiny"}, r"figures\.kungfu-fig5\.model: 'bert_tiny' is not valid"),
    ],
)
def test_bad_input_names_the_key(smoke: dict, change: dict, message: str) -> None:
    assert_refused(smoke, FIGURE, change, message)


def test_bad_input_stops_the_workflow_before_any_job(workflow_copy: Path) -> None:
    bad = workflow_copy / "bad.yaml"
    bad.write_text(yaml.safe_dump({"figures": {FIGURE: {"interference_step": 40}}}))
    done = snakemake(workflow_copy, "-n", "kungfu_fig5", "--configfile", "config/config.yaml", str(bad), timeout=120)
    assert done.returncode != 0
    assert (
        "figures.kungfu-fig5.interference_step: 40 is not before the run's end (steps: 22)" in done.stdout + done.stderr
    )
    assert not (workflow_copy / "results").exists()


def test_points_are_skipped_without_root(smoke: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ddlrepro.host.run.testbed_unavailable_reason", lambda: "needs root for network namespaces")
    points = figure_points(smoke)[FIGURE]
    assert sorted(point.params["run"] for point in points.values()) == ["adaptive", "no adaptation", "quiet"]
    for point in points.values():
        record = run_point(point, tmp_path / point.id)
        assert (record["status"], record["reason"]) == ("skipped", "skipped: needs root for network namespaces")


def test_points_are_skipped_under_another_launcher(smoke: dict) -> None:
    point = next(iter(figure_points(smoke)[FIGURE].values()))
    reason = unmet_requirement(point, "slurm")
    assert reason == "skipped: runs on testbed hosts, which the local launcher makes, not the slurm launcher"


def test_points_in_images_are_skipped_and_the_plan_still_passes(smoke: dict, tmp_path: Path) -> None:
    """With images.build set the other figures run in the image; fig5's ranks belong on testbed hosts: skipped."""
    in_image = configured_launcher({"launcher": {"name": "local"}, "images": {"build": "podman"}})
    points = figure_points(smoke)[FIGURE]
    check_points({FIGURE: points}, in_image)
    point = next(iter(points.values()))
    assert unmet_requirement(point, "local", in_image=True) == (
        "skipped: runs its ranks on testbed hosts, not in the training image (images.build)"
    )
    image = {"reference": "localhost/ddlrepro-cpu", "digest": "sha256:" + "0" * 64}
    record = run_point(point, tmp_path / "run", in_image, image)
    assert record["status"] == "skipped" and not (tmp_path / "run" / "jobspec.json").exists()


def test_a_step_that_began_before_the_traffic_is_not_the_first_full_one() -> None:
    """Steps of 1 s whose last 0.5 s is the votes' all-reduce (outside img/s): the traffic's first byte at 7.3 s
    lands in step 7, so step 8 is the first one run fully under it, not step 7 (whose img/s alone says 7.5 s)."""
    params = {"run": "adaptive", "batch_size": 16, "reference_step": 2, "interference_step": 5}
    rows = []
    for step in range(10):
        rows.append({**params, "rank": 0, "step": step, "metric": "step_start", "value": float(step), "time": step})
        rows.append({**params, "rank": 0, "step": step, "metric": "img_per_sec", "value": 32.0, "time": step + 1.0})
    rows.append({**params, "rank": None, "step": None, "metric": "traffic_start", "value": 7.3, "time": 7.3})
    rows.append({**params, "rank": 0, "step": 9, "metric": "root_switch", "value": 1, "time": 10.0})
    summary = kungfu_fig5.run_summary(pd.DataFrame(rows), "adaptive")
    assert (summary["traffic_step"], summary["first_full_step"], summary["switch_delay_steps"]) == (7, 8, 1)
    assert summary["switch_delay_s"] == pytest.approx(10.0 - 8.0)


def our_namespaces() -> set[str]:
    return set(os.listdir(NETNS_RUN)) if NETNS_RUN.exists() else set()


@pytest.mark.serial  # reads every network namespace
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_failed_run_leaves_no_testbed(smoke: dict, tmp_path: Path) -> None:
    """Rank 1 fails on its host: the run fails naming it, and its testbed is gone (hosts, state) all the same."""
    point = next(point for point in figure_points(smoke)[FIGURE].values() if point.params["run"] == "adaptive")
    broken = replace(point, params={**point.params, "strategy": "RING"})  # the workload refuses it on every rank
    before = our_namespaces()
    with pytest.raises(RunFailed, match="STAR and at least 2 workers"):
        run_point(broken, tmp_path / "run", local_launcher(120))
    assert our_namespaces() <= before
    testbed = json.loads((tmp_path / "run" / "jobspec.json").read_text())["testbed"]
    assert testbed["flows_file"] == "flows.jsonl"  # relative to the run folder: the folder may move
    assert not remove_leftovers(testbed["owner"])


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_traffic_that_fails_to_start_fails_the_run_and_keeps_rank_0s_records(
    smoke: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting the traffic raises: rank 0's output is still drained to its end, and the run fails with that error
    (no result.json) instead of finishing as a run whose policy did not switch."""

    def broken_start(*args: object) -> None:
        raise OSError("the flow peer could not start")

    monkeypatch.setattr("ddlrepro.host.testbed.traffic.start", broken_start)
    point = next(point for point in figure_points(smoke)[FIGURE].values() if point.params["run"] == "adaptive")
    short = replace(point, params={**point.params, "steps": point.params["interference_step"] + 2})
    with pytest.raises(OSError, match="the flow peer could not start"):
        run_point(short, tmp_path / "run", local_launcher(120))
    assert not (tmp_path / "run" / "result.json").exists()
    records = metric_records(tmp_path / "run")
    last_step = short.params["steps"] - 1
    assert any(r.get("rank") == 0 and r.get("step") == last_step and r["metric"] == "vote" for r in records)
    assert any(r.get("rank") == 0 and r["metric"] == "parameter_sum" for r in records)


@pytest.mark.serial  # throughput drops over shaped links; every netns
@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_snakemake_kungfu_fig5_on_testbed_hosts(workflow_copy: Path) -> None:
    """The three runs on 5 testbed hosts each, two replicates (replicate 1 starts after replicate 0 of every run);
    every testbed gone afterwards; the paper's relations hold on every replicate; the timing claims are judged
    over both."""
    before = our_namespaces()
    two = workflow_copy / "two-replicates.yaml"
    two.write_text("checks: {replicates: 2, tier: thorough}\n")  # fig5's timing claims are thorough
    done = snakemake(workflow_copy, "kungfu_fig5", "--configfile", "config/config.yaml", str(two), timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert our_namespaces() <= before  # each run destroyed its testbed
    results = workflow_copy / "results"
    results_of = [json.loads(path.read_text()) for path in (results / "runs" / FIGURE).glob("*/result.json")]
    by_replicate = {r: [run for run in results_of if run["point"].get("replicate", 0) == r] for r in (0, 1)}
    assert [len(runs) for runs in by_replicate.values()] == [3, 3]
    assert max(run["finished"] for run in by_replicate[0]) <= min(run["started"] for run in by_replicate[1])
    summary = pd.read_csv(results / "tables" / f"{FIGURE}.summary.csv").set_index(["replicate", "run"])
    for replicate in (0, 1):
        assert summary.loc[(replicate, "adaptive"), "switches"] == 1
        assert summary.loc[(replicate, "quiet"), "switches"] == 0
        assert summary.loc[(replicate, "no adaptation"), "switches"] == 0
    checks = pd.read_csv(results / "checks" / f"{FIGURE}.tsv", sep="\t").set_index("check")
    relations = ["one-switch", "at-most-one-switch", "switch-after-traffic", "quiet-run-never-switches"]
    assert (checks.loc[relations, "status"] == "pass").all(), checks.loc[relations]
    assert (checks.loc[relations, "n"] == 2).all()
    for timing in ["adaptive-beats-fixed-under-interference", "recovers-after-switch"]:
        row = checks.loc[timing]
        assert row["status"] in ("pass", "inconclusive", "disturbed"), row.to_dict()
        assert row["status"] == "disturbed" or (row["n"] == 2 and row["low"] <= row["measured"] <= row["high"])
    for run_dir in (results / "runs" / FIGURE).iterdir():
        jobspec = yaml.safe_load((run_dir / "jobspec.json").read_text())
        assert not remove_leftovers(jobspec["testbed"]["owner"])  # nothing of it was left to remove
