"""The benchmarks' results: each script's JSON record, its targets checked like the papers' references,
results/benchmarks.tsv and docs/performance.md's generated table, from real records of each script at its smallest
settings (tests/data/benchmarks/)."""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddlrepro.host.config import ConfigError
from ddlrepro.host.hostload import HostLoad

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "data" / "benchmarks"
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import (  # noqa: E402
    BenchmarkRecord,
    allreduce_times,
    check_benchmark,
    load_targets,
    meaningful,
    paired_round,
    portable,
)
from readme_table import BEGIN, END, table, with_table  # noqa: E402
from report import read_results, targets_table  # noqa: E402

QUIET = HostLoad(wall_s=10.0, cpus=2, host_busy_s=5.2, own_s=5.0, steal_s=0.0)  # 1 % foreign
BUSY = HostLoad(wall_s=10.0, cpus=2, host_busy_s=10.0, own_s=5.0, steal_s=0.4)  # 25 % foreign, 2 % steal


def recorded(name: str, quiet: bool = True) -> dict[str, Any]:
    """A recorded benchmark's JSON, its figures' load set to a quiet host unless `quiet` is False."""
    document = json.loads((RECORDED / f"{name}.json").read_text())
    if quiet:
        for figure in document["figures"]:
            figure |= {"foreign_share": 0.01, "steal_share": 0.0, "disturbed": False}
    return document


def statuses(document: dict[str, Any]) -> dict[str, str]:
    targets = load_targets()[document["benchmark"]]
    checks = check_benchmark(document["benchmark"], document["figures"], targets)
    return dict(zip(checks["check"], checks["status"], strict=True))


def set_value(document: dict[str, Any], figure_id: str, **fields: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    (figure,) = (figure for figure in changed["figures"] if figure["id"] == figure_id)
    figure.update(fields)
    return changed


def test_a_finished_benchmark_writes_its_figures_targets_machine_code_and_command(tmp_path: Path) -> None:
    options = argparse.Namespace(rounds=1, script=Path("x.py"), outside=Path("/opt/elsewhere/bench.py"))
    with BenchmarkRecord("benchmarks/harness_fidelity.py", options, tmp_path) as record:
        record.add("fidelity", "workload ÷ bare", 0.99, "", QUIET, noise=0.004)
    document = json.loads((tmp_path / "harness_fidelity.json").read_text())
    assert document["options"] == {"rounds": 1, "script": "x.py", "outside": "bench.py"}  # no path of this machine
    assert document["figures"] == [
        {"id": "fidelity", "what": "workload ÷ bare", "value": 0.99, "unit": "", "noise": 0.004}
        | {"foreign_share": pytest.approx(0.01), "steal_share": 0.0, "disturbed": False}
    ]
    assert document["targets"] == load_targets()["harness_fidelity"]
    assert {"sha", "dirty"} <= set(document["git"]) and document["host"]["cpu_count"] >= 1
    assert document["argv"] == [portable(argument) for argument in sys.argv] and document["date"] >= document["started"]
    assert not any(argument.startswith("/") for argument in document["argv"])
    assert [path.name for path in tmp_path.iterdir()] == ["harness_fidelity.json"]  # no temporary file left


def test_a_benchmark_that_fails_leaves_the_previous_record(tmp_path: Path) -> None:
    previous = tmp_path / "harness_fidelity.json"
    previous.write_text("{}")
    with pytest.raises(RuntimeError), BenchmarkRecord("harness_fidelity.py", argparse.Namespace(), tmp_path) as record:
        record.add("fidelity", "workload ÷ bare", 0.99, "", QUIET)
        raise RuntimeError("a run failed")
    assert previous.read_text() == "{}"


@pytest.mark.parametrize("path", sorted(RECORDED.glob("*.json")), ids=lambda path: path.stem)
def test_every_target_of_a_recorded_benchmark_names_a_figure_it_measures(path: Path) -> None:
    document = recorded(path.stem)
    assert set(statuses(document).values()) <= {"pass", "fail", "inconclusive"}


def test_a_missed_target_fails_and_a_met_one_passes() -> None:
    """Judged on the paired rounds' mean and its bounds (the recorded run's slowest strategy: 0.848 [0.818, 0.878],
    n=12, a miss; its best, 0.925 [0.898, 0.953], too close to the line to tell)."""
    document = recorded("allreduce_strategies")
    assert statuses(document)["every-strategy"] == "fail"
    assert statuses(document)["best-point-to-point-strategy"] == "inconclusive"

    def rounds_around(centre: float) -> dict[str, Any]:
        ratios = [centre + 0.01 * (index % 3 - 1) for index in range(12)]
        return set_value(document, "slowest-strategy-busbw-ratio", value=centre, round_values=ratios)

    assert statuses(rounds_around(0.95))["every-strategy"] == "pass"
    assert statuses(rounds_around(0.85))["every-strategy"] == "fail"
    assert statuses(rounds_around(0.9))["every-strategy"] == "inconclusive"


def test_a_timing_on_a_busy_host_is_disturbed_but_memory_is_judged() -> None:
    busy = {"foreign_share": 0.25, "steal_share": 0.02, "disturbed": True}
    document = set_value(recorded("easyscale_overheads"), "d1-step-ratio", value=1.0, **busy)
    document = set_value(document, "memory-pss-ratio", value=0.5, **busy)
    assert statuses(document) == {"d1-step-time": "disturbed", "ests-share-memory": "fail"}


def test_fidelity_whose_noise_reaches_the_target_is_inconclusive() -> None:
    document = recorded("harness_fidelity")
    target = "workload-as-fast-as-a-bare-loop"
    assert statuses(set_value(document, "fidelity", value=1.0, noise=0.05))[target] == "inconclusive"
    assert statuses(set_value(document, "fidelity", value=1.0, noise=0.01))[target] == "pass"
    assert statuses(set_value(document, "fidelity", value=0.9, noise=0.01))[target] == "fail"


def test_a_target_whose_figure_the_run_left_out_is_skipped() -> None:
    document = recorded("framework_fidelity")
    document["figures"] = [figure for figure in document["figures"] if not figure["id"].startswith("horovod")]
    checks = check_benchmark(document["benchmark"], document["figures"], load_targets()["framework_fidelity"])
    skipped = checks.set_index("check").loc["horovod-as-fast-as-its-baseline"]
    assert (skipped["status"], skipped["reason"]) == ("skipped", "['horovod-fidelity'] not measured")


def test_the_tsv_has_one_row_per_target_from_the_records_present() -> None:
    targets = load_targets()
    documents = [document for document in read_results(RECORDED) if document["benchmark"] != "elastic_resize"]
    tsv = targets_table(documents, targets).set_index(["benchmark", "check"])
    assert len(tsv) == sum(len(entries) for entries in targets.values())
    not_run = tsv.loc["elastic_resize"]
    assert set(not_run["status"]) == {"skipped"} and set(not_run["reason"]) == {"not run: no elastic_resize.json"}
    harness = tsv.loc[("harness_fidelity", "workload-as-fast-as-a-bare-loop")]
    assert harness["date"] == recorded("harness_fidelity")["date"]
    assert harness["git_sha"] == recorded("harness_fidelity")["git"]["sha"]


def test_a_record_that_is_no_benchmark_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "stray.json").write_text('{"figures": []}')
    with pytest.raises(Exception, match=r"stray\.json: not a benchmark record"):
        read_results(tmp_path)


def test_a_misspelt_target_key_is_an_error_naming_it(tmp_path: Path) -> None:
    entry = dict(load_targets()["harness_fidelity"][0], nois={"column": "noise"})
    path = tmp_path / "targets.yaml"
    path.write_text(json.dumps({"harness_fidelity": [entry]}))
    with pytest.raises(ConfigError, match=r"harness_fidelity\[0\]: unknown key\(s\) 'nois'; allowed: .*noise"):
        load_targets(path)


def test_the_readme_table_shows_every_figure_with_its_verdict_and_run() -> None:
    documents = read_results(RECORDED)
    text = table(documents, load_targets())
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + sum(len(document["figures"]) for document in documents)
    harness = recorded("harness_fidelity", quiet=False)
    first = next(row for row in rows if row.startswith("| bare loop"))
    assert f"`{harness['git']['sha'][:10]}`" in first and "`python benchmarks/harness_fidelity.py --rounds 2" in first
    assert f"{harness['host']['cpu_model']} × {harness['host']['cpu_count']}" in first
    assert "Measured on " in text


def run_readme_table(readme: Path, *options: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "benchmarks" / "readme_table.py"), "--results", str(RECORDED)]
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": str(Path(sys.executable).parent)}
    return subprocess.run([*command, "--readme", str(readme), *options], capture_output=True, text=True, env=env)


def test_the_readme_check_fails_on_a_stale_table_and_passes_once_rewritten(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# Performance\n\n{BEGIN}\n| old | hand-written |\n{END}\n\nprose stays\n")
    stale = run_readme_table(readme, "--check")
    assert stale.returncode == 1 and "stale" in stale.stderr
    assert run_readme_table(readme).returncode == 0
    rewritten = readme.read_text()
    assert rewritten.endswith(f"{END}\n\nprose stays\n") and "hand-written" not in rewritten
    assert run_readme_table(readme, "--check").returncode == 0
    assert run_readme_table(readme).returncode == 0 and readme.read_text() == rewritten  # idempotent


def test_a_readme_without_the_markers_is_an_error_naming_it() -> None:
    with pytest.raises(Exception, match=r"NOTES\.md has no <!-- benchmarks:begin -->"):
        with_table("# no table here\n", "| a |", "NOTES.md")


@pytest.mark.parametrize(
    ("value", "noise", "shown"),
    [(1.0253, 0.0641, "1.025 ± 0.064"), (0.31648, None, "0.316"), (1109.4, None, "1109"), (0.02583, None, "0.0258")],
)
def test_values_are_shown_to_meaningful_digits(value: float, noise: float | None, shown: str) -> None:
    assert meaningful(value, noise) == shown


@pytest.mark.parametrize(
    ("ratios", "status"),
    [
        ([0.99, 1.0, 1.01, 0.995, 1.005, 0.998, 1.002, 0.996], "pass"),
        ([0.93, 0.94, 0.95, 0.935, 0.945, 0.94, 0.95, 0.93], "fail"),
        ([0.90, 1.05, 0.95, 1.02, 0.93, 1.04, 0.97, 0.99], "inconclusive"),
    ],
)
def test_a_target_measured_in_paired_rounds_is_judged_on_their_mean_and_its_bounds(
    ratios: list[float], status: str
) -> None:
    """The workflow's statistics (one-sided 95 % bootstrap bounds of the mean) over the rounds fixed before the run,
    whatever the figure's declared noise says."""
    figure = {"id": "fidelity", "value": sum(ratios) / len(ratios), "noise": 0.0, "round_values": ratios}
    figure |= {"foreign_share": 0.01, "steal_share": 0.0, "disturbed": False}
    targets = load_targets()["harness_fidelity"]
    (check,) = check_benchmark("harness_fidelity", [figure], targets).to_dict("records")
    assert check["status"] == status, check
    assert check["n"] == len(ratios) and check["low"] <= check["measured"] <= check["high"]


def test_a_paired_round_swaps_which_goes_first_and_returns_the_baseline_first() -> None:
    order: list[str] = []

    def measure(name: str, value: float):
        return lambda: order.append(name) or value

    assert [paired_round(index, measure("base", 1.0), measure("other", 2.0)) for index in range(3)] == [(1.0, 2.0)] * 3
    assert order == ["base", "other", "other", "base", "base", "other"]


def test_monitor_settings_take_turns_step_by_step_and_each_is_timed_alone() -> None:
    """The monitor benchmark's round: every setting steps `count` times, one step each in turn, the first to step
    rotating round by round, and each setting's seconds are its own steps' only."""
    from monitor_overhead import interleaved_round

    order: list[str] = []

    def step(name: str, seconds: float):
        return lambda: order.append(name) or time.sleep(seconds)

    steps = {"none": step("none", 0.0), "slow": step("slow", 0.05), "fast": step("fast", 0.0)}
    started = time.perf_counter()
    wall, cpu = interleaved_round(steps, 3, round_index=1)
    elapsed = time.perf_counter() - started
    assert order == ["slow", "fast", "none"] * 3
    # slow's 0.15 s of sleep are in its seconds alone (a setting timed across its neighbours' steps would have them)
    assert wall["slow"] >= 0.15 and wall["fast"] < 0.15 and wall["none"] < 0.15 and sum(wall.values()) <= elapsed
    assert set(cpu) == set(steps) and all(value >= 0 for value in cpu.values())


def test_a_strategy_on_testbed_links_is_read_from_its_own_records_and_set_beside_its_link_bound(
    tmp_path: Path,
) -> None:
    """link_bandwidth.py --strategies: gloo's ring and STAR took turns in one run on 4 hosts; STAR's records alone
    give its busbw, which is judged against the ring's of the same run and against its graph's bound (0.5)."""
    import link_bandwidth

    mib = 2**20
    ring_s = {16 * mib: 0.21, 32 * mib: 0.42}  # 1.5 × size at 1 Gbit/s: busbw ≈ 0.96 of the rate
    slower = {"RING": 1.0, "STAR": 2.5}
    lines = [
        {"metric": "allreduce_time_s", "rank": rank, "size_bytes": size, "setting": strategy, "value": t * factor}
        for strategy, factor in slower.items()
        for size, t in ring_s.items()
        for rank in range(4)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    ring = link_bandwidth.busbw_ratios(tmp_path, 4, 10**9, "RING")
    star = link_bandwidth.busbw_ratios(tmp_path, 4, 10**9, "STAR")
    assert ring[16 * mib] == pytest.approx(16 * mib * 8 / 0.21 * 1.5 / 1e9)
    assert star[32 * mib] == pytest.approx(ring[32 * mib] / 2.5)
    assert len(allreduce_times(tmp_path)[16 * mib]) == 8  # no strategy named: every record

    options = argparse.Namespace(hosts=[4], strategies=["STAR"])
    with BenchmarkRecord("benchmarks/link_bandwidth.py", options, tmp_path / "out") as record:
        link_bandwidth.add_strategy(record, "STAR", 4, "1gbit", "4 hosts", star, ring, QUIET)
    (figure,) = record.figures
    assert figure["id"] == "gloo-star-4hosts-1gbit"
    assert figure["value"] == pytest.approx(0.4) and figure["link_bound"] == 0.5
    assert figure["of_link_bound"] == pytest.approx(0.8)
