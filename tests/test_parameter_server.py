"""The `ps` workload and `wikimedia-ps`: bad input refused naming the key, a real cluster of a chief, 2 workers and 1
parameter server on testbed hosts (as root), and `snakemake wikimedia_ps` end to end at a tiny size."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, snakemake

from ddlrepro.host.config import ConfigError, load_config, validate_config
from ddlrepro.host.figures import figure_points, wikimedia_ps
from ddlrepro.host.launchers import local_launcher
from ddlrepro.host.run import run_point, unmet_requirement
from ddlrepro.host.tables import RECORD_COLUMNS
from ddlrepro.host.testbed.limits import unavailable_reason

REASON = unavailable_reason()
FIGURE = "wikimedia-ps"
TINY = {"epochs": 2, "probe_steps": 5, "hidden": [32]}


@pytest.fixture(scope="module")
def smoke() -> dict:
    return load_config(REPO / "config" / "config.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ps": 0}, r"figures\.wikimedia-ps\.ps: 0 is less than the minimum of 1"),
        ({"ps_workers": 0}, r"figures\.wikimedia-ps\.ps_workers: 0 is less than the minimum of 1"),
        ({"placements": ["striped"]}, r"figures\.wikimedia-ps\.placements\[0\]: 'striped' is not valid"),
        ({"trainable": "trunk"}, r"figures\.wikimedia-ps\.trainable: 'trunk' is not valid"),
    ],
)
def test_bad_input_names_the_key(smoke: dict, change: dict, message: str) -> None:
    config = copy.deepcopy(smoke)
    config["figures"][FIGURE].update(change)
    with pytest.raises(ConfigError, match=message):
        validate_config(config)


def test_roles_follow_the_ranks(smoke: dict) -> None:
    """Rank 0 the chief, then workers, then parameter servers; one testbed host each, plus the spare one."""
    cluster, _, single = figure_points(smoke)[FIGURE].values()
    assert cluster.workers == 4 and cluster.params["testbed_hosts"] == 5
    assert single.workers == 1 and "testbed_hosts" not in single.params


def test_top_freezes_the_trunk() -> None:
    """`trainable: top` trains the softmax layer's kernel and bias only; `all` every weight."""
    from ddlrepro.rank.workloads.parameter_server import trainable_flags

    assert trainable_flags({"hidden": [8, 8], "trainable": "top"}) == [False] * 4 + [True] * 2
    assert trainable_flags({"hidden": [8, 8], "trainable": "all"}) == [True] * 6


def test_cluster_points_are_skipped_without_root(smoke: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ddlrepro.host.run.testbed_unavailable_reason", lambda: "needs root for network namespaces")
    reasons = [unmet_requirement(point) for point in figure_points(smoke)[FIGURE].values()]
    assert reasons == ["skipped: needs root for network namespaces"] * 2 + [None]


def run_records(run_dir: Path) -> pd.DataFrame:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = pd.DataFrame([json.loads(line) for line in lines]).reindex(columns=RECORD_COLUMNS)
    return records.assign(probe_steps=5, probe_batch_size=32, batch_size=512, mode="cluster")


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_two_workers_one_ps_on_testbed_hosts(smoke: dict, tmp_path: Path) -> None:
    """A real cluster (chief, 2 workers, 1 PS, an evaluator, each on its own testbed host) trains; the evaluator
    finds the chief's accuracy in its final weights; the PS host's counters carry at least the tensors TensorFlow
    moved (variables read, gradients pushed; more: gRPC framing, TCP/IP headers) and are within 5 % of what its
    sockets sent and received (`ss`). A 50k-parameter trunk: with a tiny one, headers of small packets add ~12 %."""
    point = next(iter(figure_points(smoke)[FIGURE].values()))
    roles = {"ps_workers": 2, "ps": 1, "evaluators": 1, "testbed_hosts": 6}
    params = {**point.params, **TINY, "hidden": [256, 128], **roles}
    result = run_point(replace(point, workers=5, params=params), tmp_path / "run", local_launcher(120))
    assert result["status"] == "ok"
    records = run_records(tmp_path / "run")
    ranks = records[records["metric"] == "role_index"].sort_values("rank")["detail"].tolist()
    assert ranks == ["chief", "worker", "worker", "ps", "evaluator"]
    row = wikimedia_ps.cluster_row(records)
    assert row["counters_vs_tensorflow"] >= 1.0, row
    assert row["counters_vs_tcp"] == pytest.approx(1.0, abs=0.05), row
    assert row["ps_bytes_per_sample"] * 8 <= row["ps_bytes_per_sample_probe"], row
    accuracy = wikimedia_ps.last_metric(records, "accuracy")
    assert accuracy > 0.5
    assert wikimedia_ps.last_metric(records, "evaluator_accuracy") == accuracy  # the chief's final weights
    assert row["cluster_ready_s"] > 0


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_snakemake_wikimedia_ps(workflow_copy: Path) -> None:
    """Both placements and the one process at a tiny size; the scale-free checks hold, the paper's speed-up is
    skipped below paper scale."""
    tiny = workflow_copy / "tiny-ps.yaml"
    tiny.write_text(yaml.safe_dump({"figures": {FIGURE: TINY}}))
    done = snakemake(workflow_copy, "wikimedia_ps", "--configfile", "config/config.yaml", str(tiny), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    checks = pd.read_csv(workflow_copy / "results" / "checks" / f"{FIGURE}.tsv", sep="\t").set_index("check")
    relations = ["traffic-falls-with-batch", "round-robin-uneven", "partitioned-even"]
    assert (checks.loc[relations, "status"] == "pass").all(), checks.loc[relations]
    assert checks.loc["cluster-faster", "status"] == "skipped"


def test_a_frozen_trunk_is_labelled() -> None:
    """`trainable: top` says in the figure's title that the trunk was frozen, and at what."""
    import matplotlib.pyplot as plt

    from ddlrepro.host.tables import read_table

    table = read_table(REPO / "tests" / "data" / "tables" / f"{FIGURE}.csv")
    for trainable, labelled in (("all", False), ("top", True)):
        drawing, _ = wikimedia_ps.plot(table.assign(trainable=trainable), "smoke", [])
        assert ("trunk frozen at its random initialisation" in drawing.get_suptitle()) is labelled
        plt.close(drawing)
