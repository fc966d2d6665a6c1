"""KungFu's adaptive provisioning (Fig 6): the policy's exact decisions on scripted throughputs, a real
policy-driven in-place elastic run, the BERT-base-shaped encoder, bad input, and `snakemake kungfu_fig6`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import snakemake

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import ReferenceError as CheckReferenceError
from ddlrepro.host.checks import check_figure, figure_references
from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.configserver import ClusterConfig, ConfigServer
from ddlrepro.host.figures import figure_points, kungfu_fig6
from ddlrepro.host.launch import launch_of
from ddlrepro.host.ledger import verify
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import run_rows
from ddlrepro.host.testing import live_records, local_launcher
from ddlrepro.points import Point
from ddlrepro.rank.adaptation.provisioning import ProvisioningPolicy, throughput_source

CONFIG = Path(__file__).parents[1] / "config" / "config.yaml"


def provisioning_sequence(totals: dict[int, float], windows: int, window_steps: int = 4, max_workers: int = 4) -> list:
    """The sizes a policy runs at, window after window, when T(n) = totals[n] (every step at n measures T(n)/n)."""
    policy = ProvisioningPolicy(window_steps, alpha=0.33, max_workers=max_workers)
    size, sizes = 1, []
    for _ in range(windows):
        sizes.append(size)
        for _ in range(window_steps):
            end = policy.observe(size, totals[size] / size)
        size = end.target if end.target is not None else size
    return sizes


def test_policy_grows_while_workers_pay_and_gives_back_the_last() -> None:
    # T(2) = 190 ≥ (1 + 0.33/2)·100 = 116.5: grow; T(3) = 250 ≥ 1.11·190 = 211.1: grow;
    # T(4) = 270 < (1 + 0.33/4)·250 = 270.6: back to 3, and stay there.
    assert provisioning_sequence({1: 100, 2: 190, 3: 250, 4: 270}, windows=7) == [1, 2, 3, 4, 3, 3, 3]


def test_policy_stops_at_max_workers_and_at_two_on_two_cores() -> None:
    assert provisioning_sequence({1: 100, 2: 200, 3: 300, 4: 400}, windows=6) == [1, 2, 3, 4, 4, 4]
    assert provisioning_sequence({1: 100, 2: 170, 3: 160, 4: 150}, windows=5) == [1, 2, 3, 2, 2]
    assert provisioning_sequence({1: 100, 2: 116, 3: 300, 4: 400}, windows=4) == [1, 2, 1, 1]


def test_policy_measures_the_second_half_of_each_window() -> None:
    policy = ProvisioningPolicy(window_steps=4, alpha=0.33, max_workers=3)
    # The first half (a slow first step after a resize) does not count: T(1) = mean(10, 10) × 1.
    ends = [policy.observe(1, value) for value in (1.0, 2.0, 10.0, 10.0)]
    assert ends[:3] == [None, None, None] and ends[3].total == 10.0 and ends[3].target == 2
    # A resize restarts the window: two steps at size 2, then four at size 3 are one window at 3, not two.
    assert [policy.observe(2, 9.0) for _ in range(2)] == [None, None]
    ends = [policy.observe(3, 4.0) for _ in range(4)]
    assert ends[3].total == 12.0 and ends[3].target is None  # no T(2) to compare with, and at max_workers: stay


def test_joiner_receives_the_survivors_policy_state() -> None:
    survivor = ProvisioningPolicy(window_steps=4, alpha=0.33, max_workers=3)
    for _ in range(4):
        survivor.observe(1, 100.0)
    for _ in range(4):
        survivor.observe(2, 60.0)
    joiner = ProvisioningPolicy(window_steps=4, alpha=0.33, max_workers=3)
    joiner.load(survivor.state())
    assert joiner.totals == survivor.totals == {1: 100.0, 2: 120.0}
    assert [joiner.observe(3, 38.0) for _ in range(4)][-1].target == survivor.decide(3, 114.0) == 2


@pytest.mark.parametrize(
    ("window_steps", "alpha", "max_workers", "key"),
    [(3, 0.33, 3, "window_steps"), (2, 0.33, 3, "window_steps"), (4, 0.0, 3, "alpha"), (4, 0.33, 1, "max_workers")],
)
def test_policy_refuses_each_bad_argument_by_name(window_steps: int, alpha: float, max_workers: int, key: str) -> None:
    with pytest.raises(ValueError, match=rf"^{key} must be"):
        ProvisioningPolicy(window_steps, alpha, max_workers)


def test_the_policy_is_fed_measured_throughput_unless_a_test_scripts_it() -> None:
    assert throughput_source({"max_workers": 2})(size=2, batch_size=8, step_time=0.5) == 16.0
    scripted = throughput_source({"max_workers": 2, "scripted_throughput": {"1": 100.0, "2": 90.0}})
    assert scripted(size=2, batch_size=8, step_time=0.5) == 90.0
    for bad in ({"1": 100.0}, {"1": 100.0, "2": 0.0}):
        with pytest.raises(ValueError, match="scripted_throughput must give a positive throughput for each size"):
            throughput_source({"max_workers": 2, "scripted_throughput": bad})


def test_bert_base_has_bert_base_parameters() -> None:
    from ddlrepro.rank.models import build_model

    # BertForQuestionAnswering (bert-base-uncased): 108,893,186 parameters.
    assert sum(parameter.numel() for parameter in build_model("bert_base").parameters()) == 108_893_186


def adaptive_point(scripted: dict[int, float], steps: int = 28) -> Point:
    params = {
        "model": "bert_tiny",
        "batch_size": 2,
        "dataset_size": 64,
        "initial_workers": 1,
        "schedule": f"{steps}:0",
        "mode": "adaptive",
        "elastic": "inplace",
        "standby": 2,
        "collective_timeout_s": 30,
        "policy": "provisioning",
        "window_steps": 4,
        "alpha": 0.33,
        "max_workers": 3,
        "scripted_throughput": {str(size): value for size, value in scripted.items()},
    }
    return Point("kungfu-fig6", "elastic", 3, 1, params)


def test_policy_driven_run_grows_then_gives_back_a_worker(tmp_path: Path) -> None:
    """A real in-place run whose ranks feed the policy scripted throughputs: 1 → 2 → 3 → back to 2, from the warm
    pool, the same processes throughout, no sample lost or repeated."""
    point = adaptive_point({1: 100.0, 2: 90.0, 3: 50.0})  # T: 100, 180, 150
    result = run_point(point, tmp_path / "run", local_launcher(240))
    rows = run_rows(tmp_path / "run")
    sizes = rows[rows["metric"] == "cluster_size"].set_index("step")["value"].astype(int)
    assert sizes.to_dict() == {step: 1 if step < 4 else 2 if step < 8 else 3 if step < 12 else 2 for step in range(28)}
    targets = rows[rows["metric"] == "policy_target"].set_index("step")["value"].astype(int).to_dict()
    assert targets == {3: 2, 7: 3, 11: 2, 15: 2, 19: 2, 23: 2, 27: 2}
    verify(
        [json.loads(line) for line in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()],
        result["summary"]["samples"],
    )
    workers = [record for record in live_records(tmp_path / "run") if record["kind"] == "worker"]
    assert sorted(worker["rank"] for worker in workers) == [0, 1, 2]  # each process announced once: none restarted


def test_the_policy_removes_the_last_worker_and_adds_by_resizing() -> None:
    """KungFu's provisioning gives back the last worker with `/remove`; it grows with `/resize`."""
    from ddlrepro.rank.elastic.client import ConfigClient
    from ddlrepro.rank.elastic.inplace_worker import InPlaceWorker

    config = ClusterConfig([0, 1, 2], lambda count, members: [3 + index for index in range(count)], max_size=3)
    with ConfigServer(config, "token") as server:
        worker = InPlaceWorker(adaptive_point({1: 1.0}), 0, ConfigClient(server.address, "token"), store=None)
        worker.cluster, worker.group = config.latest, SimpleNamespace(rank=0, size=3)
        worker.propose(2)
        assert (config.latest.members, config.latest.reason) == ([0, 1], "worker 2 removed")
        worker.cluster, worker.group = config.latest, SimpleNamespace(rank=0, size=2)
        worker.propose(3)
        assert (config.latest.members, config.latest.reason) == ([0, 1, 3], "resize to 3")


def test_a_policy_point_counts_its_pool_once() -> None:
    """1 worker and 2 warm standbys that become workers 2 and 3: 3 processes at most, not 3 + 2."""
    assert launch_of(adaptive_point({1: 1.0, 2: 1.0, 3: 1.0})).peak_workers == 3


def test_a_missing_fixed_run_at_the_settled_size_is_a_declared_gap() -> None:
    """The recorded table's adaptive run settled at 1 worker; with fixed-1 skipped, the share is NaN with the reason,
    its check is skipped for that reason, the other check still runs, and the figure marks the empty slot."""
    table = pd.read_csv(figure_file("kungfu-fig6", "recorded.csv"))
    fixed_1 = table[table["mode"] == "fixed-1"]
    skipped_row = fixed_1.iloc[[0]].assign(metric="skipped", value=float("nan"), status="skipped", reason="skipped: x")
    table = pd.concat([table[table["mode"] != "fixed-1"], skipped_row], ignore_index=True)
    summary = kungfu_fig6.summarize(table).set_index("mode")
    assert summary.loc["adaptive", "settled_size"] == 1 and pd.isna(summary.loc["adaptive", "settled_share"])
    assert summary.loc["adaptive", "settled_share_skipped"] == "no fixed-size run at the settled size 1 (skipped: x)"
    assert summary.loc["adaptive", "best_fixed_size"] == 2
    assert (summary.loc["fixed-1", "status"], summary.loc["fixed-1", "size"]) == ("skipped", 1)
    drawn = kungfu_fig6.summarize(table)
    figure = kungfu_fig6.plot(table, drawn, "smoke", [])
    checks = check_figure(kungfu_fig6.ID, drawn, figure_references()[kungfu_fig6.ID], "smoke")
    statuses = checks.set_index("check")["status"].to_dict()
    assert statuses["stops-where-the-next-worker-does-not-pay"] in {"inconclusive", "skipped"}
    assert statuses["adaptive-cheaper-than-all-at-once"] in {"inconclusive", "disturbed"}  # one replicate
    texts = [text.get_text() for axis in figure.axes for text in axis.texts]
    assert "skipped: x" in texts


def test_a_fixed_run_missing_without_a_skip_is_an_error_not_a_skip() -> None:
    """fixed-1 is absent from the table without being declared skipped (a run lost, a table cut short): the share's
    check must fail loudly, never be excused as skipped."""
    table = pd.read_csv(figure_file("kungfu-fig6", "recorded.csv"))
    table = table[table["mode"] != "fixed-1"]
    summary = kungfu_fig6.summarize(table).set_index("mode")
    assert pd.isna(summary.loc["adaptive", "settled_share"]) and summary.loc["adaptive", "settled_share_skipped"] == ""
    with pytest.raises(CheckReferenceError, match="next_worker_gain_share is NaN"):
        check_figure(kungfu_fig6.ID, summary.reset_index(), figure_references()[kungfu_fig6.ID], "smoke")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("alpha", 0, "alpha"),
        ("window_steps", 3, "window_steps"),
        ("max_workers", 1, "max_workers"),
        ("steps", 8, "steps"),
        ("standby", 3, "standby"),
    ],
)
def test_bad_input_names_the_key(tmp_path: Path, key: str, value: float, message: str) -> None:
    overlay = tmp_path / "bad.yaml"
    overlay.write_text(f"figures:\n  kungfu-fig6:\n    {key}: {value}\n")
    with pytest.raises(ConfigError, match=rf"figures\.kungfu-fig6\.{message}"):
        figure_points(load_config(CONFIG, overlay))


@pytest.mark.slow
def test_snakemake_builds_fig6(workflow_copy: Path) -> None:
    """`snakemake kungfu_fig6`: the adaptive run, the fixed-size runs, the table, the figure and the checks."""
    overlay = workflow_copy / "fig6.yaml"
    overlay.write_text("launcher:\n  local: {exclusive: true}\nfigures:\n  kungfu-fig6: {enabled: true}\n")
    built = snakemake(workflow_copy, "kungfu_fig6", "--configfile", "tests/configs/tiny.yaml", str(overlay))
    assert built.returncode == 0, built.stderr[-3000:]
    results = workflow_copy / "results"
    assert (results / "figures" / "kungfu-fig6.png").stat().st_size > 0
    configs = (workflow_copy / "config" / "config.yaml", workflow_copy / "tests" / "configs" / "tiny.yaml", overlay)
    section = load_config(*configs)["figures"]["kungfu-fig6"]
    largest, window, steps = section["max_workers"], section["window_steps"], section["steps"]
    table = pd.read_csv(results / "tables" / "kungfu-fig6.csv")
    sizes = table[table["metric"] == "cluster_size"].pivot_table(index="step", columns="mode", values="value")
    assert set(sizes.columns) == {"adaptive", "all-at-once", *(f"fixed-{n}" for n in range(1, largest))}
    assert len(sizes) == steps and sizes.notna().all().all()  # every run trained every step
    assert sizes.isin(range(1, largest + 1)).all().all()
    adaptive = sizes["adaptive"]
    assert adaptive.iloc[0] == 1 and (adaptive.diff().abs() == 1).sum() >= 1  # grew (the first window always does)
    assert set(adaptive.diff().dropna()) <= {-1, 0, 1}  # one worker at a time
    assert all((sizes[f"fixed-{n}"] == n).all() for n in range(1, largest)) and (sizes["all-at-once"] == largest).all()
    targets = table[(table["metric"] == "policy_target") & (table["mode"] == "adaptive")]
    assert len(targets) == steps // window  # one decision per window
    summary = pd.read_csv(results / "tables" / "kungfu-fig6.summary.csv").set_index("mode")
    assert summary.loc["adaptive", "settled_size"] == adaptive.iloc[-1]
    assert summary.loc["adaptive", "best_fixed_size"] in range(1, largest + 1)
    checks = pd.read_csv(results / "checks" / "kungfu-fig6.tsv", sep="\t").set_index("check")
    # Both checks evaluated on this run (a fail or a disturbed machine is a finding, not a test failure).
    assert set(checks.index) == {"stops-where-the-next-worker-does-not-pay", "adaptive-cheaper-than-all-at-once"}
    # With one replicate (tiny.yaml) a timing claim has no interval: inconclusive, or skipped where the run settled
    # at max_workers (no next worker to judge).
    assert set(checks["status"]) <= {"inconclusive", "disturbed", "skipped"}
