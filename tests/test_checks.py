"""References: schema-validated, evaluated into pass / fail / skipped rows with measured and reference values."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from dataclasses import replace
from itertools import accumulate
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_workflow, snakemake

from ddlrepro.host.checks import (
    ReferenceError,
    check_exclude,
    check_figure,
    evaluate,
    figure_references,
    load_references,
    timing_figures,
)
from ddlrepro.host.cli import main
from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.figures import (
    FIGURES,
    draw_figure,
    figure_module,
    is_simulated,
    replicate_summaries,
    simulate_replicates,
)
from ddlrepro.rank.workloads.throughput import setting_label

SUMMARY = pd.DataFrame(
    {
        "setting": ["none", "variance@1", "variance@8"],
        "workers": [2, 2, 2],
        "per_worker": [100.0, 80.0, 97.0],
        "efficiency": [1.0, 0.8, 0.97],
    }
)


def reference(**fields) -> dict:
    return {"id": "r", "claim": "a claim", "scale": "any", "measured": {"column": "per_worker"}, **fields}


def test_shipped_references_are_valid() -> None:
    references = figure_references()
    assert {"kungfu-fig8", "kungfu-fig9", "dlaas-scaling"} <= set(references)
    for entries in references.values():
        assert len({entry["id"] for entry in entries}) == len(entries)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kungfu-fig99": []}, "'kungfu-fig99'"),
        ({"kungfu-fig8": [reference(value=1.0)]}, "kungfu-fig8[0]"),
        ({"kungfu-fig8": [reference(compare="~", against=1)]}, "kungfu-fig8[0]"),
    ],
)
def test_bad_references_are_named(tmp_path: Path, entry: dict, message: str) -> None:
    path = tmp_path / "references.yaml"
    path.write_text(yaml.safe_dump(entry))
    with pytest.raises(ConfigError, match=r"invalid references\.yaml") as caught:
        load_references(path)
    assert message in str(caught.value)


def test_value_with_tolerance() -> None:
    selected = {"column": "per_worker", "where": {"setting": "variance@1"}}
    passing = evaluate(reference(measured=selected, value=84.0, tolerance={"relative": 0.05}), SUMMARY, "smoke")
    failing = evaluate(reference(measured=selected, value=90.0, tolerance={"absolute": 5}), SUMMARY, "smoke")
    assert (passing["status"], passing["measured"], passing["reference"]) == ("pass", 80.0, "84 ± 4.2")
    assert failing["status"] == "fail"


def test_value_with_bounds() -> None:
    selected = {"column": "efficiency", "where": {"setting": "variance@8"}}
    assert evaluate(reference(measured=selected, value=1, bounds={"lower": 0.95}), SUMMARY, "smoke")["status"] == "pass"
    assert evaluate(reference(measured=selected, value=1, bounds={"upper": 0.9}), SUMMARY, "smoke")["status"] == "fail"


def test_relations_against_constants_and_other_measurements() -> None:
    variance = {"column": "per_worker", "where": {"setting": "variance@8"}}
    within_5_percent = {"column": "per_worker", "where": {"setting": "none"}, "factor": 0.95}
    row = evaluate(reference(measured=variance, compare=">=", against=within_5_percent), SUMMARY, "smoke")
    assert (row["status"], row["reference"]) == ("pass", ">= 95")
    lowest = {"column": "efficiency", "aggregate": "min"}
    assert evaluate(reference(measured=lowest, compare=">=", against=0.9), SUMMARY, "smoke")["status"] == "fail"


def test_paper_numbers_are_skipped_below_paper_scale() -> None:
    entry = reference(
        scale="paper",
        value=100.0,
        tolerance={"relative": 0.1},
        measured={"column": "per_worker", "where": {"setting": "none"}},
    )
    skipped = evaluate(entry, SUMMARY, "smoke")
    assert (skipped["status"], skipped["reason"]) == ("skipped", "paper-scale number, this run is at smoke scale")
    assert evaluate(entry, SUMMARY, "paper")["status"] == "pass"


def test_a_selection_without_rows_is_an_error_naming_figure_and_reference() -> None:
    entry = reference(id="big", measured={"column": "per_worker", "where": {"workers": 32}}, compare=">", against=0)
    with pytest.raises(ReferenceError, match=r"reference kungfu-fig8/big: no row with workers=32"):
        evaluate(entry, SUMMARY, "smoke", "kungfu-fig8")
    other_side = reference(
        id="ratio",
        measured={"column": "per_worker", "where": {"setting": "none"}},
        compare=">",
        against={"column": "per_worker", "where": {"setting": "variance@4"}},
    )
    with pytest.raises(ReferenceError, match=r"kungfu-fig8/ratio: no row with setting=variance@4"):
        evaluate(other_side, SUMMARY, "smoke", "kungfu-fig8")


def test_a_nan_measurement_is_an_error_not_a_skip() -> None:
    unmeasured = SUMMARY.assign(per_worker=[100.0, float("nan"), 97.0])
    entry = reference(measured={"column": "per_worker", "where": {"setting": "variance@1"}}, compare=">", against=0)
    with pytest.raises(ReferenceError, match=r"kungfu-fig8/r: per_worker is NaN"):
        evaluate(entry, unmeasured, "smoke", "kungfu-fig8")


def test_only_declared_reasons_skip() -> None:
    needs_cuda = pd.DataFrame(
        {
            "backend": ["nccl", "gloo"],
            "per_worker": [float("nan"), 50.0],
            "status": ["skipped", "ok"],
            "reason": ["skipped: needs CUDA", ""],
        }
    )
    nccl = reference(
        measured={"column": "per_worker", "where": {"backend": "nccl"}},
        compare=">",
        against={"column": "per_worker", "where": {"backend": "gloo"}},
    )
    row = evaluate(nccl, needs_cuda, "smoke", "kungfu-fig10")
    assert (row["status"], row["reason"]) == ("skipped", "skipped: needs CUDA")
    excluded = check_figure(
        "kungfu-fig10", needs_cuda, [nccl | {"id": "x", "measured": {"column": "speed"}}], "smoke", ["kungfu-fig10/x"]
    )
    assert (excluded["status"][0], excluded["reason"][0]) == ("skipped", "excluded by the config (checks.exclude)")
    with pytest.raises(ReferenceError, match=r"checks.exclude names \['kungfu-fig10/typo'\]"):
        check_figure("kungfu-fig10", needs_cuda, [nccl], "smoke", ["kungfu-fig10/typo"])


LOADED = SUMMARY.assign(foreign_share=[0.02, 0.6, 0.01], steal_share=[0.0, 0.0, 0.0], disturbed=[False, True, False])


def test_a_timing_check_behind_a_disturbed_run_is_disturbed_not_judged() -> None:
    """A replicate behind which a run saw foreign load is left out, named in the reason; with every replicate
    disturbed the check is `disturbed`; a deterministic check ignores the load."""
    variance_vs_none = reference(
        timing=True,
        measured={"column": "per_worker", "where": {"setting": "variance@8"}},
        compare=">=",
        against={"column": "per_worker", "where": {"setting": "variance@1"}},
        effect={"relative": 0.05},
    )
    row = evaluate(variance_vs_none, LOADED, "smoke", "kungfu-fig8")
    assert row["status"] == "disturbed" and row["n"] == 0
    assert "foreign CPU load up to 0.60" in row["reason"]
    quiet = LOADED.assign(disturbed=False, foreign_share=0.02)
    replicates = pd.concat([LOADED.assign(replicate=0), *(quiet.assign(replicate=r) for r in (1, 2, 3))])
    judged = evaluate(variance_vs_none, replicates, "smoke", "kungfu-fig8")
    assert (judged["status"], judged["n"]) == ("pass", 3)
    assert "replicate(s) [0] left out, disturbed" in judged["reason"]
    untimed = {key: value for key, value in variance_vs_none.items() if key not in ("timing", "effect")}
    assert evaluate(untimed, LOADED, "smoke", "kungfu-fig8")["status"] == "pass"
    with pytest.raises(ReferenceError, match="timing check but the summary has no"):
        evaluate(variance_vs_none, SUMMARY, "smoke", "kungfu-fig8")


def test_shipped_references_classify_absolute_numbers_as_paper_scale() -> None:
    """Every value the papers measured on their hardware (a value with tolerance, a constant with a unit such as
    KungFu's 20.39 s) applies at paper scale only; what stays `any` is a scale-free relation."""
    references = figure_references()
    for figure, entries in references.items():
        for entry in entries:
            absolute = "value" in entry or ("unit" in entry and not isinstance(entry.get("against"), dict))
            assert not absolute or entry["scale"] == "paper", f"{figure}/{entry['id']}"


def test_broken_references_are_errors() -> None:
    with pytest.raises(ReferenceError, match="no column"):
        evaluate(reference(measured={"column": "speed"}, compare=">", against=0), SUMMARY, "smoke")
    with pytest.raises(ReferenceError, match="3 rows match"):
        evaluate(reference(compare=">", against=0), SUMMARY, "smoke")


def test_a_column_only_skipped_runs_would_have_given_is_a_skip_not_an_error() -> None:
    """Without root every run of a testbed figure is skipped, and its summary lacks the columns they would have
    filled: a check on the rows it selects reads skipped with their reason; a column an ok row lacks stays an error."""
    reason = "skipped: needs root for network namespaces"
    summary = pd.DataFrame(
        {"run": ["one process", "round-robin"], "status": ["ok", "skipped"], "reason": ["", reason], "x": [1.0, None]}
    )
    spread = reference(measured={"column": "ps_bytes", "where": {"run": "round-robin"}}, compare=">", against=0)
    judged = evaluate(spread, summary, "smoke")
    assert (judged["status"], judged["reason"]) == ("skipped", reason)
    with pytest.raises(ReferenceError, match=r"no column \['ps_bytes'\]"):
        evaluate(reference(measured={"column": "ps_bytes", "where": {"run": "one process"}}), summary, "smoke")


def test_check_figure_has_a_row_per_reference() -> None:
    entries = [
        reference(id="a", measured={"column": "efficiency", "aggregate": "max"}, compare="<=", against=1),
        reference(id="b", scale="paper", value=1, tolerance={"absolute": 0}),
    ]
    table = check_figure("kungfu-fig8", SUMMARY, entries, "smoke")
    assert list(table["check"]) == ["a", "b"]
    assert list(table["status"]) == ["pass", "skipped"]
    assert list(table["reason"]) == ["", "paper-scale number, this run is at smoke scale"]
    assert set(table["figure"]) == {"kungfu-fig8"}


def est_pieces(params: dict, steps: range) -> list[dict]:
    """A consistent run's EST laps (with `est_timings`): every EST computes and copies, each process's last syncs."""
    if not params.get("est_timings"):
        return []
    turn, after_turn = {"forward_backward": 0.04, "gradient_copy": 0.001}, {"sync": 0.01, "optimizer": 0.002}
    starts = [0, *accumulate(params["placement"])]
    return [
        {"rank": rank, "step": step, "est": est, "phase": phase, "metric": "est_time_s", "value": seconds}
        for step in steps
        for rank in range(len(params["placement"]))
        for ests in [range(starts[rank], starts[rank + 1])]
        for est in ests
        for phase, seconds in (turn | after_turn if est == ests[-1] else turn).items()
    ]


def synthetic_gan_records(point) -> list[dict]:
    """Made-up samples of a GAN run: 6 ticks per rank at 0.75 cores and 0.4 GiB each; a neighbour fills the node."""
    neighbour = bool(point.params.get("neighbour"))
    ranks, limit = range(point.workers), point.params.get("container", {}).get("cpus")
    per_tick = {
        "cpu_percent": 70.0,
        "cpu_percent_of_node": 35.0,
        "rss_bytes": 0.4 * 2**30,
        "memory_percent_of_node": 2.0,
        "node_cpu_percent": 100.0 if neighbour else 72.0,
        "node_memory_percent": 5.0,
    }
    records = [
        {"rank": rank, "time": 1000.0 + tick, "metric": metric, "value": value}
        for rank in ranks
        for tick in range(6)
        for metric, value in per_tick.items()
    ]
    records += [{"rank": rank, "metric": "allocation_cpu_cores", "value": limit} for rank in ranks if limit]
    step_s = 1.3 if neighbour else 1.0
    return records + [
        {"rank": rank, "step": step, "metric": "step_time_s", "value": step_s} for rank in ranks for step in range(4)
    ]


def synthetic_records(point) -> list[dict]:
    """Metric records shaped as each workload writes them, with made-up values: what a figure's own code needs to
    build its summary, so that every reference is evaluated against real summary columns and rows."""
    params, ranks = point.params, range(point.workers)
    if point.workload == "throughput":
        # made up (-3 img/s off the store): only exercises the check machinery, says nothing of a real store
        reading = 0.0 if params.get("data_source", "synthetic") == "synthetic" else 3.0
        settings = [setting_label(setting) for setting in params.get("settings", [])] or [None]
        return [
            {
                "rank": rank,
                "iteration": iteration,
                "metric": "img_per_sec",
                "value": 100.0 - 7 * point.workers - reading - index,
                "setting": setting,
            }
            for rank in ranks
            for iteration in range(3)
            for index, setting in enumerate(settings)
        ]
    if point.workload == "gan":
        return synthetic_gan_records(point)
    if point.workload == "adaptive_batch":
        epochs, batch = range(1, params["epochs"] + 1), params["batch_size"]
        per_epoch = [("batch_size", batch), ("epoch_time_s", 0.01 * (100 + 1347 / batch))]
        records = [{"rank": 0, "iteration": e, "metric": m, "value": v} for e in epochs for m, v in per_epoch]
        evaluated = [0, *range(params["cycle_epochs"], params["epochs"] + 1, params["cycle_epochs"])]
        return records + [
            {"rank": 0, "iteration": e, "metric": metric, "value": value}
            for e in evaluated
            for metric, value in (("accuracy", 90 + e / 2 - batch / 32), ("eval_train_time_s", e * 0.5))
        ]
    if point.workload == "allreduce":
        sizes = [params["min_bytes"] * 2**k for k in range(64) if params["min_bytes"] * 2**k <= params["max_bytes"]]
        return [
            {"rank": rank, "iteration": 0, "size_bytes": size, "metric": "allreduce_time_s", "value": 1e-5 + size / 1e9}
            for rank in ranks
            for size in sizes
        ]
    if point.workload == "consistent":
        first = params.get("stage", 0) * params["steps"]
        loss = {"D1": 0.0, "D0": 1e-3 * params.get("stage", 0), "ddp": 1e-6}[params["mode"]]
        steps = range(first, first + params["steps"])
        return (
            [
                {"rank": rank, "step": step, "metric": metric, "value": value}
                for step in steps
                for rank in ranks
                for metric, value in (
                    ("step_time_s", 0.1 * (1 + rank)),
                    ("switch_time_s", 1e-4),
                    ("rss_bytes", 2e8),
                    ("pss_bytes", 1.5e8),
                )
            ]
            + [{"rank": 0, "step": step, "metric": "loss", "value": 2.0 + loss * step} for step in steps]
            + [{"rank": 0, "step": step, "metric": "parameters_digest", "value": 7.0 + loss} for step in steps]
            + est_pieces(params, steps)
        )
    if point.workload == "adaptive_strategy":
        return adaptive_strategy_records(params, ranks)
    if point.workload == "ps":
        return parameter_server_records(params)
    if "situation" in params:
        return situation_records(params)
    if params.get("policy") == "provisioning" or params["mode"].startswith(("fixed-", "all-at-once")):
        return provisioning_records(params)
    return elastic_records(params)


def provisioning_records(params: dict) -> list[dict]:
    """Rank 0's step records of a kungfu-fig6 run: fixed size, or (adaptive) one more worker each window up to
    max_workers, then back by one; each step 0.1 s, 40 samples/s per worker."""
    window, steps = params["window_steps"], int(params["schedule"].split(":")[0])
    largest = params.get("max_workers", params["initial_workers"])
    sizes = [*range(1, largest + 1), largest - 1] if "policy" in params else [params["initial_workers"]]
    records = []
    for step in range(steps):
        size = sizes[min(step // window, len(sizes) - 1)]
        for metric, value in (("cluster_size", size), ("img_per_sec", 40.0 * size), ("step_time_s", 0.1)):
            records.append({"rank": 0, "step": step, "time": 1e9 + 0.1 * step, "metric": metric, "value": value})
    return records


def adaptive_strategy_records(params: dict, ranks: range) -> list[dict]:
    """Steps at 50 img/s; the traffic's first byte just after the interference step began; from the next step
    25 img/s, until the step the adaptive run's root moves (that next step), back to 50 after it."""
    interference, records, start = params["interference_step"], [], 1000.0
    switch = interference + 1 if params["traffic"] and params["adapt"] else None
    for step in range(params["steps"]):
        slowed = params["traffic"] and step > interference and (switch is None or step <= switch)
        rate = 25.0 if slowed else 50.0
        end = start + params["batch_size"] / rate
        for metric, value in (("img_per_sec", rate), ("allreduce_mib_per_s", rate / 10)):
            records += [{"rank": rank, "step": step, "time": end, "metric": metric, "value": value} for rank in ranks]
        records.append({"rank": 0, "step": step, "time": end, "metric": "step_start", "value": start})
        if step == switch:
            records.append({"rank": 0, "step": step, "time": end, "metric": "root_switch", "value": 1})
        if step == interference and params["traffic"]:
            records.append({"time": start + 0.01, "metric": "traffic_start", "value": start + 0.01})
        start = end
    phases = {"start": 0.0, "interference": 1e7, "end": 3e7}
    records += [
        {"rank": rank, "metric": "node_rx_bytes", "phase": phase, "interface": "eth0", "value": value * (rank + 1)}
        for rank in ranks
        for phase, value in phases.items()
    ]
    return records


def parameter_server_records(params: dict) -> list[dict]:
    """A `ps` run: the one process, or a cluster whose PS hosts move 1 MB per step (round-robin: 3 of 4 to ps 0)."""
    records = [{"rank": 0, "metric": m, "value": v} for m, v in (("accuracy", 0.9), ("train_time_s", 2.0))]
    if params["mode"] == "single":
        return [*records, {"rank": 0, "metric": "train_steps", "value": 30}]
    records += [{"rank": 0, "metric": m, "value": v} for m, v in (("train_steps", 30), ("cluster_ready_s", 5.0))]
    roles = ["chief", *["worker"] * params["ps_workers"], *["ps"] * params["ps"]]
    shares = [0.75, 0.25] if params["placement"] == "round-robin" else [0.5, 0.5]
    for rank, role in enumerate(roles):
        task = rank - roles.index(role)
        records.append({"rank": rank, "metric": "role_index", "value": task, "detail": role})
        if role != "ps":
            continue
        records.append({"rank": 0, "metric": "ps_read_bytes_per_step", "value": 4e5 * shares[task]})
        records.append({"rank": 0, "metric": "ps_pushed_bytes_per_step", "value": 4e5 * shares[task]})
        for phase, steps in (("train", 30), ("probe", params["probe_steps"])):
            for end, value in ((f"{phase}_start", 0.0), (f"{phase}_end", 1e6 * steps * shares[task])):
                row = {"rank": rank, "phase": end, "interface": "eth0", "value": value}
                records += [{**row, "metric": "node_rx_bytes"}, {**row, "metric": "tcp_bytes"}]
    return records


def situation_records(params: dict) -> list[dict]:
    """A biggan-elasticity cell as the seed tells it: ddp waits, fails on a kill, ignores a joiner; torchrun
    restarts every worker; in place carries on. One step a second from t = 2; the event at t = 5."""
    runtime, situation = params["runtime"], params["situation"]
    event = {"late-start": "late_arrival", "killed": "killed", "joins": "joined"}[situation]
    size = 1 if situation == "late-start" and runtime != "ddp" else 2
    after = {"killed": 1 if runtime == "inplace" else 2, "joins": 2 if runtime == "ddp" else 3}.get(situation, 2)
    steps = [(t, size) for t in range(6 if runtime == "ddp" and situation == "late-start" else 2, 5)]
    steps += [] if (runtime, situation) == ("ddp", "killed") else [(t, after) for t in range(6, 9)]
    starts = [(1, 0), (1, 1)] + ([(5.5, 0), (5.5, 1)] if runtime == "torchrun" else [])
    host = [("job_start", None, 0, 0), (event, None, 5, 5)]
    rows = host + [("worker_start", rank, t, 100 + rank) for t, rank in starts]
    rows += [("cluster_size", 0, t, value) for t, value in steps]
    return [
        {"rank": rank, "step": None, "time": 1e9 + t, "metric": metric, "value": value}
        for metric, rank, t, value in rows
    ]


def elastic_records(params: dict) -> list[dict]:
    """Rank 0's step and resize records of an elastic run following its schedule."""
    size, records = params["initial_workers"], []
    for entry in params["schedule"].split(","):
        step, to_size = (int(part) for part in entry.split(":"))
        if to_size == 0:
            break
        latency = {"torchrun": 5.0, "inplace-cold": 1.5}.get(params["mode"], 0.05)
        resize = {
            "latency_s": latency,
            "to_sync_s": latency / 2,
            "from_size": size,
            "to_size": to_size,
            "fault": 0.0,
            "detect_s": latency / 4,
            "first_step_s": latency / 4,
        }
        records += [
            {"rank": 0, "step": step, "metric": f"resize_{name}", "value": value} for name, value in resize.items()
        ]
        records += [
            {"rank": 0, "step": step, "metric": metric, "value": value}
            for metric, value in (("cluster_size", to_size), ("img_per_sec", 50.0 * to_size))
        ]
        size = to_size
    return records


def synthetic_tidy_table(figure: str, points) -> pd.DataFrame:
    """A tidy table of `points` as tables.run_rows lays it out; NCCL points skipped here as on a CPU machine."""
    from ddlrepro.host.tables import RECORD_COLUMNS, scalar

    frames = []
    for point in points:
        skipped = point.params.get("backend") == "nccl"
        records = [{"metric": "skipped", "value": float("nan")}] if skipped else synthetic_records(point)
        constants = {
            "figure": figure,
            "point_id": point.id,
            "workload": point.workload,
            "workers": point.workers,
            "threads_per_worker": point.threads_per_worker,
            "replicate": point.replicate,
            **{key: scalar(value) for key, value in point.params.items()},
            "backend_used": "gloo",
            "status": "skipped" if skipped else "ok",
            "reason": "skipped: needs CUDA" if skipped else "",
            "foreign_share": 0.01,
            "steal_share": 0.0,
            "disturbed": False,
        }
        frames.append(pd.DataFrame.from_records(records, columns=RECORD_COLUMNS).assign(**constants))
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("figure", sorted(FIGURES))
def test_every_scale_any_check_of_every_smoke_figure_is_evaluated(figure: str) -> None:
    """The smoke config's points of each figure, three replicates with made-up measurements, through the figure's
    own summary code per replicate: every `scale: any` reference selects real rows and columns of every replicate
    and is judged (a deterministic one pass or fail, a timing one with an interval over 3 replicates); only NCCL's
    declared "needs CUDA" may skip here. A reference that selects nothing raises, so this fails on it."""
    import matplotlib.pyplot as plt

    config = load_config(REPO / "config" / "config.yaml")
    assert config["figures"][figure]["enabled"] and not config.get("checks", {}).get("exclude")
    points = figure_module(figure).points(config["figures"][figure], config["launcher"])
    references = figure_references()
    copies = 3 if figure in timing_figures(references, "smoke") else 1  # as the workflow replicates them
    table = synthetic_tidy_table(figure, [replace(point, replicate=r) for r in range(copies) for point in points])
    if is_simulated(figure):  # it plots the simulation of its runs' table
        table = simulate_replicates(figure, table, config["figures"][figure], "synthetic runs")
    drawing, _ = draw_figure(figure, table, "smoke", [], "synthetic runs")  # it draws, and
    plt.close(drawing)
    summary = replicate_summaries(figure, table)  # what the checks read
    summary = pd.read_csv(io.StringIO(summary.to_csv(index=False)))
    checks = check_figure(figure, summary, references.get(figure, []), "smoke")
    scale_free = checks[checks["scale"] == "any"]
    judged = scale_free["status"].isin(["pass", "fail"]) | (scale_free["tier"] == "timing") & (
        scale_free["n"] == copies
    )
    unjudged = scale_free[~judged]
    assert (unjudged["reason"] == "skipped: needs CUDA").all(), unjudged[["check", "status", "reason"]]
    paper = checks[checks["scale"] == "paper"]
    assert (paper["status"] == "skipped").all()


def test_a_disturbed_run_marks_the_summary_rows_that_depend_on_it() -> None:
    """A ratio's row is disturbed when its denominator's run was: efficiency ÷ the 1-worker run, fig8's settings
    (one run), fig7's speed-ups ÷ the torchrun mode chosen as baseline (not the other one), wikimedia-ps's ÷ its
    one process; a run nothing else divides by marks only its own row, and fig7's absolute latencies only by their
    own run."""

    config = load_config(REPO / "config" / "config.yaml")

    def disturbed_summary(figure: str, disturbed_point) -> pd.DataFrame:
        points = figure_module(figure).points(config["figures"][figure], config["launcher"])
        table = synthetic_tidy_table(figure, points)
        table.loc[table["point_id"].isin([p.id for p in points if disturbed_point(p)]), "disturbed"] = True
        return figure_module(figure).summarize(table)

    def disturbed_checks(figure: str, disturbed_point) -> list[str]:
        summary = pd.read_csv(io.StringIO(disturbed_summary(figure, disturbed_point).to_csv(index=False)))
        checks = check_figure(figure, summary, figure_references()[figure], "paper")
        return sorted(checks.loc[checks["status"] == "disturbed", "check"])

    def disturbed_rows(figure: str, disturbed_point, key: str) -> dict:
        summary = disturbed_summary(figure, disturbed_point)
        return dict(zip(summary[key], summary["disturbed"], strict=True))

    assert disturbed_rows("dlaas-scaling", lambda p: p.workers == 2, "workers") == {1: False, 2: True}
    assert disturbed_rows("dlaas-scaling", lambda p: p.workers == 1, "workers") == {1: True, 2: True}
    # Fig 8's settings share one run (paired): a disturbed run disturbs every setting, a quiet one none.
    assert all(disturbed_rows("kungfu-fig8", lambda p: True, "setting").values())
    assert not any(disturbed_rows("kungfu-fig8", lambda p: False, "setting").values())
    torch_base = disturbed_summary("kungfu-fig9", lambda p: p.params["framework"] == "torch" and p.workers == 1)
    assert torch_base.groupby("framework")["disturbed"].all().to_dict() == {
        "horovod": False,
        "tensorflow": False,
        "torch": True,  # torch/STAR at 2 workers too: ÷ torch's 1 worker
    }
    # the made-up latencies make torchrun-tuned the faster baseline for every kind of event
    speedups = ["shrink-10x-torchrun", "warm-grow-10x-torchrun"]
    assert disturbed_checks("kungfu-fig7", lambda p: p.params["mode"] == "torchrun-tuned") == speedups
    assert disturbed_checks("kungfu-fig7", lambda p: p.params["mode"] == "torchrun") == []
    assert disturbed_checks("kungfu-fig7", lambda p: p.params["mode"] == "inplace-cold") == [
        "grow-within-kungfu",
        "shrink-10x-torchrun",
        "shrink-within-kungfu",
    ]
    # wikimedia-ps's speed-up is the one process's time ÷ the cluster's: disturbed by either run
    assert disturbed_checks("wikimedia-ps", lambda p: p.params["mode"] == "single") == ["cluster-faster"]
    assert disturbed_checks("wikimedia-ps", lambda p: p.params.get("placement") == "round-robin") == ["cluster-faster"]
    assert disturbed_checks("wikimedia-ps", lambda p: p.params.get("placement") == "partitioned") == []


def cli_check(folder: Path, *exclude: str) -> str:
    """What `ddlrepro check` exits with for dlaas-scaling on a one-row summary."""
    (folder / "summary.csv").write_text("workers\n1\n")
    command = ["check", "dlaas-scaling", "--summary", str(folder / "summary.csv"), "--scale", "smoke"]
    command += ["--out", str(folder / "checks.tsv")]
    with pytest.raises(SystemExit) as exited:
        main([*command, "--exclude", *exclude])
    return str(exited.value.code)


def test_cli_prints_a_reference_error_without_traceback(tmp_path: Path) -> None:
    assert cli_check(tmp_path, "dlaas-scaling/no-such-check") == (
        "checks.exclude names ['dlaas-scaling/no-such-check'], which dlaas-scaling has no reference for"
    )


def test_cli_keeps_the_traceback_of_a_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*arguments: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr("ddlrepro.host.checks.check_figure", broken)
    message = cli_check(tmp_path)
    assert message.startswith("Traceback") and "KeyError: 'a bug'" in message


def test_every_exclude_entry_must_name_a_reference() -> None:
    references = figure_references()
    check_exclude(["dlaas-scaling/" + references["dlaas-scaling"][0]["id"]], references)
    wrong = ["kungfu-fig7/typo", "nosuchfigure/x", "dlaas-scaling"]
    with pytest.raises(ReferenceError, match=re.escape(f"checks.exclude names {sorted(wrong)}: no such")):
        check_exclude(wrong, references)


def test_a_dry_run_refuses_an_exclude_typo_for_a_disabled_figure(tmp_path: Path) -> None:
    workflow = copy_workflow(tmp_path)
    (workflow / "typo.yaml").write_text("checks: {exclude: [kungfu-fig7/typo]}\n")
    done = snakemake(workflow, "-n", "--configfile", "tests/configs/tiny.yaml", "typo.yaml", timeout=120)
    assert done.returncode != 0
    assert "checks.exclude names ['kungfu-fig7/typo']: no such" in done.stdout + done.stderr, done.stderr[-2000:]


def test_summaries_and_checks_need_no_matplotlib(tmp_path: Path) -> None:
    """The summary the checks read is its own step: every figure's, from its recorded table, and its checks, in a
    process that never imports matplotlib (figures/__init__.py FigureModule.summarize)."""
    excluded = yaml.safe_load((REPO / "tests" / "configs" / "tiny.yaml").read_text())["checks"]["exclude"]
    script = f"""
import sys
from pathlib import Path
from ddlrepro.host.catalog import figure_file
from ddlrepro.host.figures import FIGURES, write_summary
from ddlrepro.host.cli import main
for figure in FIGURES:
    out = Path({str(tmp_path)!r}) / f"{{figure}}.summary.csv"
    write_summary(figure, figure_file(figure, "recorded.csv"), out)
    checked = ["--summary", str(out), "--scale", "smoke", "--out", str(out.with_suffix(".tsv"))]
    try:  # a recorded table older than a claim's column leaves it unjudged: what is asked here is the imports
        main(["check", figure, *checked, "--exclude", *{excluded!r}])
    except SystemExit:
        pass
print(sorted(name for name in sys.modules if name.split(".")[0] == "matplotlib"))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert sorted(path.name for path in tmp_path.glob("*.csv")) == sorted(f"{figure}.summary.csv" for figure in FIGURES)
    assert len(list(tmp_path.glob("*.tsv"))) >= len(FIGURES) - 3
