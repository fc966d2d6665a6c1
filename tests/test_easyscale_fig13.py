"""EasyScale Fig 13: every EST's pieces of a step are timed, add up to the step and carry their EST and piece; the
figure's summary (slowest process, ÷ plain DDP) and checks on a table recorded from real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import REPO, as_replicates, snakemake

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import check_figure, figure_references
from ddlrepro.host.config import ConfigError, load_config, validate_config
from ddlrepro.host.figures import figure_points
from ddlrepro.host.figures.easyscale_fig13 import FIRST, LAST, group_times
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.tables import read_table
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point
from ddlrepro.rank.easyscale import ConsistentTrainer, SyntheticTokens
from ddlrepro.rank.models import build_model

RECORDED = figure_file("easyscale-fig13", "recorded.csv")
TURN = {"switch", "data", "forward_backward", "gradient_copy"}
AFTER_TURN = {"sync", "optimizer", "loss"}
# The laps cover train_step from its first statement to its last: what the step time measures besides them is a
# call, two assignments and a return (microseconds). 5 ms leaves room for one descheduling of the rank in that window
# on a loaded 2-core host (a CFS slice is at most a few ms), and still catches a missed piece (the cheapest, the
# switch, is ~0.1 ms per EST, but a missed forward/backward is tens of ms).
UNTIMED_S = 0.005


def records(run_dir: Path, metric: str) -> list[dict]:
    return [record for record in metric_records(run_dir) if record["metric"] == metric]


@pytest.fixture(scope="module")
def timed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-process D1 job of 4 ESTs (2 per process), its EST pieces recorded."""
    params = {"model": "smallnet", "logical_workers": 4, "placement": [2, 2], "mode": "D1", "batch_size": 4}
    params |= {"steps": 3, "learning_rate": 0.05, "backend": "gloo", "sample_interval_s": 1.0, "est_timings": True}
    run_dir = tmp_path_factory.mktemp("fig13") / "timed"
    run_point(Point("easyscale-fig13", "consistent", 2, 1, params), run_dir, local_launcher(300))
    return run_dir


@pytest.mark.serial  # a preempted step breaks the 5 ms sum
def test_est_pieces_add_up_to_the_step(timed_run: Path) -> None:
    pieces: dict[tuple[int, int], float] = {}
    for record in records(timed_run, "est_time_s"):
        pieces[record["rank"], record["step"]] = pieces.get((record["rank"], record["step"]), 0.0) + record["value"]
    steps = {(record["rank"], record["step"]): record["value"] for record in records(timed_run, "step_time_s")}
    assert steps.keys() == pieces.keys() and len(steps) == 6
    for key, step in steps.items():
        assert 0 <= step - pieces[key] <= UNTIMED_S, (key, step, pieces[key])


def test_est_pieces_name_their_est_and_piece(timed_run: Path) -> None:
    seen: dict[tuple[int, int, int], set[str]] = {}
    for record in records(timed_run, "est_time_s"):
        seen.setdefault((record["rank"], record["step"], record["est"]), set()).add(record["phase"])
    assert {(rank, est) for rank, _, est in seen} == {(0, 0), (0, 1), (1, 2), (1, 3)}
    for (_, _, est), phases in seen.items():
        assert phases == (TURN | AFTER_TURN if est in (1, 3) else TURN), est  # each process's last EST syncs


def test_no_est_pieces_unless_asked() -> None:
    params = {"model": "smallnet", "logical_workers": 2, "mode": "D1", "batch_size": 2, "learning_rate": 0.05}
    quiet, timed = ConsistentTrainer(params, 0, [2]), ConsistentTrainer({**params, "est_timings": True}, 0, [2])
    quiet.train_step()
    timed.train_step()
    assert quiet.laps.seconds == {} and {part for _, part in timed.laps.seconds} == TURN | AFTER_TURN


def test_points_pair_ddp_with_d1_at_the_same_per_worker_batch() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    section = config["figures"]["easyscale-fig13"]
    points = list(figure_points(config)["easyscale-fig13"].values())
    assert len(points) == 2 * len(section["models"])
    for point in points:
        assert point.params["batch_size"] == section["batch_size"] and point.workers == section["workers"]
        ests = 1 if point.params["mode"] == "ddp" else section["ests_per_worker"]
        assert point.params["placement"] == [ests] * section["workers"]
        assert point.params.get("est_timings", False) == (point.params["mode"] == "D1")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ests_per_worker": 1}, "figures.easyscale-fig13.ests_per_worker: 1 is less than the minimum of 2"),
        ({"models": ["smallnet"]}, "figures.easyscale-fig13.models[0]: 'smallnet' is not valid"),
        ({"model": "resnet20"}, "figures.easyscale-fig13: unknown key(s) 'model'"),
    ],
)
def test_bad_settings_name_their_key(change: dict, message: str) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    config["figures"]["easyscale-fig13"].update(change)
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    assert message in str(error.value)


def test_summary_takes_the_slowest_process_and_divides_by_ddp() -> None:
    """Known pieces in the recorded table: every EST 0.10 s of forward/backward and 0.01 s of copy; the sync 0.03 s
    on process 0's last EST, 0.05 s on process 1's; a DDP step 0.20 s."""
    table = read_table(RECORDED)
    pieces = table["metric"] == "est_time_s"
    known = {"forward_backward": 0.10, "gradient_copy": 0.01}
    table.loc[pieces, "value"] = table.loc[pieces, "phase"].map(known).fillna(0.0)
    sync = pieces & (table["phase"] == "sync")
    table.loc[sync, "value"] = table.loc[sync, "rank"].map({0: 0.03, 1: 0.05})
    table.loc[(table["mode"] == "ddp") & (table["metric"] == "step_time_s"), "value"] = 0.20
    summary = group_times(table, 2).set_index(["model", "group"])
    for model in ("resnet20", "bert_tiny"):
        assert summary.loc[(model, FIRST), "normalised_to_ddp"] == pytest.approx(0.11 / 0.20)
        assert summary.loc[(model, LAST), "normalised_to_ddp"] == pytest.approx(0.16 / 0.20)
        assert summary.loc[(model, FIRST), "share_of_last"] == pytest.approx(0.11 / 0.16)
        assert summary.loc[(model, LAST), "sync_s"] == pytest.approx(0.05)


def test_checks_on_the_recorded_table() -> None:
    table = read_table(RECORDED)
    quiet = {"foreign_share": 0.0, "steal_share": 0.0, "disturbed": False}  # judged as on a quiet host
    summary = group_times(table, int(table["warmup_steps"].iloc[0])).assign(**quiet)
    assert list(summary["group"]) == [FIRST, LAST, FIRST, LAST]
    assert set(summary["paper_model"]) == {"ResNet-50", "BERT"}
    references = figure_references()["easyscale-fig13"]
    three = as_replicates(summary)  # the recorded run as three replicates
    checks = check_figure("easyscale-fig13", three, references, "smoke").set_index("check")
    assert checks.loc["first-ests-cheaper-than-last", "status"] == "pass"
    assert (checks.loc[checks["scale"] == "paper", "status"] == "skipped").sum() == 5  # last-est-within-10-percent
    (paper,) = check_figure("easyscale-fig13", three, references[:1], "paper").itertuples()
    assert paper.check == "last-est-within-10-percent" and paper.status != "skipped"  # judged at paper scale
    slower = summary.assign(est_time_s=summary["est_time_s"].where(summary["group"] == LAST, 2.0))
    slower["share_of_last"] = slower["est_time_s"] / slower["model"].map(
        slower[slower["group"] == LAST].set_index("model")["est_time_s"]
    )
    slower = as_replicates(slower)
    failed = check_figure("easyscale-fig13", slower, references, "smoke").set_index("check")
    assert failed.loc["first-ests-cheaper-than-last", "status"] == "fail"


def test_token_samples_depend_only_on_their_index() -> None:
    data = SyntheticTokens("bert_tiny", size=32, seed=3)
    tokens, (start, end) = data.sample(5)
    again, span = SyntheticTokens("bert_tiny", size=32, seed=3).sample(5)
    assert torch.equal(tokens, again) and span == (start, end) and 0 <= start <= end < tokens.numel()
    logits = build_model("bert_tiny")(tokens.unsqueeze(0))
    assert logits.shape == (1, tokens.numel(), 2)


@pytest.mark.slow
def test_snakemake_easyscale_fig13_end_to_end(workflow_copy: Path) -> None:
    """One model, short runs: the target runs both points, tabulates, plots and checks."""
    overlay = workflow_copy / "fig13.yaml"
    figure = {"enabled": True, "models": ["resnet20"], "steps": 4, "warmup_steps": 1}
    overlay.write_text(json.dumps({"figures": {"easyscale-fig13": figure}}))
    built = snakemake(workflow_copy, "easyscale_fig13", "--configfile", "tests/configs/tiny.yaml", str(overlay))
    assert built.returncode == 0, built.stderr[-3000:]
    results = workflow_copy / "results"
    assert (results / "figures" / "easyscale-fig13.png").stat().st_size > 0
    summary = pd.read_csv(results / "tables" / "easyscale-fig13.summary.csv")
    assert list(summary["group"]) == [FIRST, LAST] and (summary["normalised_to_ddp"] > 0).all()
    checks = pd.read_csv(results / "checks" / "easyscale-fig13.tsv", sep="\t").set_index("check")
    timed = checks[checks["scale"] == "any"]  # timings of 4 steps: a fail on a loaded machine is honest
    assert timed["measured"].notna().all() and set(timed["status"]) <= {"inconclusive", "disturbed"}  # 1 replicate
    assert set(checks.loc[checks["scale"] == "paper", "status"]) == {"skipped"}
