"""The real replay: a policy's decisions as stages (simulator.stages) on a hand-made table of placement changes and
on a simulation's own, and a tiny replay run for real (host.replay): every job's steps once each, in order, from
checkpoint to checkpoint, no device running two stages at once, no stage before its decision."""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import pandas as pd
import pytest

from ddlrepro.host.config import load_config
from ddlrepro.host.launchers.base import RunFailed
from ddlrepro.host.replay import (
    completion_times,
    concurrent_pairs,
    execute,
    order_differences,
    stage_points,
    typed_point,
)
from ddlrepro.host.run import run_point
from ddlrepro.host.simulator.cluster import Cluster, Placement, Share
from ddlrepro.host.simulator.engine import CHANGE_COLUMNS, Timing, simulate
from ddlrepro.host.simulator.stages import ReplayError, Stage, plan, steps_job
from ddlrepro.host.simulator.step_profiles import Profiles, from_table
from ddlrepro.host.simulator.traces import Job
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher

REPO = Path(__file__).resolve().parents[1]
SLOTS = Cluster.of({"fast": 1, "slow": 1})
SETTINGS = {"learning_rate": 0.05, "threads_per_worker": 1}


def job(name: str, submit_s: float, ests: int, steps: int, batch: int = 4, preferred: str = "fast") -> Job:
    return steps_job(name, submit_s, "resnet20", ests, batch, steps, preferred)


HAND_JOBS = [job("a", 0, 2, 10), job("b", 1, 1, 12), job("c", 2, 1, 6)]
FINISH = {"a": 7.0, "b": 10.0, "c": 11.0}


def hand_changes() -> pd.DataFrame:
    """a on fast (2 ESTs), b on slow; at 4 s b gives slow back and a spreads over both (listed first, as the engine
    lists jobs in trace order); a finishes at 7 s; at 8 s b returns on fast and c takes slow."""
    rows = [
        (0, "a", "fast:1x2", 0),
        (2, "b", "slow:1x1", 0),
        (4, "a", "fast:1x1+slow:1x1", 40),
        (4, "b", "", 20),
        (8, "b", "fast:1x1", 20),
        (8, "c", "slow:1x1", 0),
    ]
    return pd.DataFrame([(t, "hand", name, where, done) for t, name, where, done in rows], columns=CHANGE_COLUMNS)


def test_plan_of_hand_made_decisions() -> None:
    stages = {(stage.job, stage.index): stage for stage in plan(hand_changes(), FINISH, HAND_JOBS, SLOTS)}
    assert list(stages) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("c", 0)]
    a0, b0, a1, b1, c0 = stages.values()
    assert (a0.processes, a0.devices, a0.steps, a0.after) == (((2, "fast"),), ("fast-0",), 5, ())
    assert (b0.devices, b0.steps, b0.start_s, b0.end_s) == (("slow-0",), 5, 2.0, 4.0)
    # a keeps fast-0 and takes the slow device b gave back in the same decision
    assert (a1.processes, a1.devices, a1.steps) == (((1, "fast"), (1, "slow")), ("fast-0", "slow-0"), 5)
    assert (a1.start_s, a1.end_s, a1.after) == (4.0, 7.0, (("a", 0), ("b", 0)))
    assert (b1.devices, b1.steps, b1.after) == (("fast-0",), 7, (("a", 1), ("b", 0)))
    assert (c0.devices, c0.steps, c0.after) == (("slow-0",), 6, (("a", 1),))


def test_plan_fills_ests_in_order_and_skips_stages_without_steps() -> None:
    jobs = [job("a", 0, 3, 4)]
    changes = pd.DataFrame(
        [
            (0, "p", "a", "fast:1x2+slow:1x2", 0),
            (1, "p", "a", "fast:1x2+slow:1x1", 0),
            (2, "p", "a", "fast:1x2+slow:1x2", 0),
        ],
        columns=CHANGE_COLUMNS,
    )
    stages = plan(changes, {"a": 5.0}, jobs, Cluster.of({"fast": 1, "slow": 1}))
    assert [(stage.index, stage.processes, stage.steps, stage.start_s) for stage in stages] == [
        (0, ((2, "fast"), (1, "slow")), 4, 2.0)
    ]
    # the throughput model charges the slow device the 1 EST it runs, not the 2 it has room for
    placement = Placement.from_label("fast:1x2+slow:1x2")
    assert resnet20_profiles(4).global_step_s("resnet20", 4, 3, placement) == 0.194


def test_plan_errors_name_what_cannot_be_replayed() -> None:
    with pytest.raises(ReplayError, match="job a: its work, 81 samples, is not a whole number of global steps of 8"):
        plan(hand_changes(), FINISH, [dataclasses.replace(HAND_JOBS[0], work_samples=81), *HAND_JOBS[1:]], SLOTS)
    with pytest.raises(ReplayError, match="row 1, field id: no job 'a'"):
        plan(hand_changes(), FINISH, HAND_JOBS[1:], SLOTS)
    with pytest.raises(ReplayError, match="t=2 s: job b needs 1 slow, only 0 free"):
        plan(hand_changes(), FINISH, HAND_JOBS, Cluster.of({"fast": 1, "slow": 0}))
    bad = {
        "row 2, field placement: 'slow:1' is not a placement label": (1, "placement", "slow:1"),
        "row 1, field time_s: -1 is not a time": (0, "time_s", -1),
        "row 3, field progress_samples: 81 is not within \\[0, 80\\]": (2, "progress_samples", 81),
        "row 6, field time_s: a second change of job b at 8 s": (5, "id", "b"),
    }
    for message, (row, field, value) in bad.items():
        changes = hand_changes()
        changes.loc[row, field] = value
        with pytest.raises(ReplayError, match=message):
            plan(changes, FINISH, HAND_JOBS, SLOTS)
    with pytest.raises(ReplayError, match="placement changes: no rows"):
        plan(hand_changes().iloc[:0], FINISH, HAND_JOBS, SLOTS)
    with pytest.raises(ReplayError, match="the plan has no stages"):
        execute([], {}, Path("unused"), local_launcher(1))


def test_concurrent_pairs_leave_out_pairs_ordered_by_waits_or_time() -> None:
    """a's last stage ends before b's and c's start (and both wait for it); b's and c's overlap on two devices."""
    stages = plan(hand_changes(), FINISH, HAND_JOBS, SLOTS)
    assert concurrent_pairs(stages) == [("b", "c")]
    times = pd.DataFrame(
        {"id": ["a", "b", "c"], "simulated_finish_s": [7.0, 10.0, 11.0], "real_finish_s": [7.5, 12.0, 11.5]}
    )
    assert order_differences(times, [("b", "c")]) == 1
    assert order_differences(times, []) == 0


def resnet20_profiles(batch: int) -> Profiles:
    """Step times of roughly this machine's resnet20 (the tiny replay's timings are not checked)."""
    rows = [
        ("resnet20", device_type, batch, ests, seconds, "h")
        for device_type, by_ests in {"fast": {1: 0.0375, 2: 0.0385}, "slow": {1: 0.194, 2: 0.19}}.items()
        for ests, seconds in by_ests.items()
    ]
    return from_table(
        pd.DataFrame(
            rows, columns=["application", "device_type", "batch_per_est", "ests_per_device", "step_time_s", "host"]
        )
    )


def test_simulation_changes_give_the_plan_every_step() -> None:
    """The engine's own changes: every job's stages sum to its steps, and a job moved by the policy gets two."""
    jobs = [job("a", 0, 2, 150, batch=8), job("b", 3, 1, 100, batch=8), job("c", 6, 1, 40, batch=8, preferred="slow")]
    timing = Timing(round_s=5, restart="measured", restart_s=3)
    simulation = simulate(jobs, SLOTS, resnet20_profiles(8), "easyscale-heter", timing)
    stages = plan(simulation.changes, simulation.jobs.set_index("id")["finish_s"], jobs, SLOTS)
    for spec in jobs:
        own = [stage for stage in stages if stage.job == spec.id]
        assert sum(stage.steps for stage in own) == spec.work_samples / spec.batch / spec.max_parallelism
    assert max(stage.index for stage in stages) >= 1


@pytest.mark.slow
def test_tiny_real_replay(tmp_path: Path) -> None:
    """The hand-made decisions run for real (resnet20, batch 4): each job's stages train its steps once each, in
    order, each continuing from the previous checkpoint; no stage before its decision or before those it waits for."""
    stages = plan(hand_changes(), FINISH, HAND_JOBS, SLOTS)
    launcher = load_config(REPO / "config" / "config.yaml")["launcher"]
    points = stage_points(stages, HAND_JOBS, launcher, SETTINGS)
    runs = execute(stages, points, tmp_path, local_launcher(120)).set_index(["job", "stage"])
    for stage in stages:
        run = runs.loc[(stage.job, stage.index)]
        assert run["start_s"] >= stage.start_s
        assert all(run["start_s"] >= runs.loc[waited, "end_s"] for waited in stage.after)
    for device in ("fast-0", "slow-0"):
        used = sorted(
            (runs.loc[(s.job, s.index), "start_s"], runs.loc[(s.job, s.index), "end_s"])
            for s in stages
            if device in s.devices
        )
        assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(used))
    table = tidy_table([tmp_path / point.id for point in points.values()])
    losses = table[table["metric"] == "loss"]
    for spec in HAND_JOBS:
        own = [points[(s.job, s.index)].id for s in stages if s.job == spec.id]
        steps = [list(losses.loc[losses["point_id"] == point_id, "step"]) for point_id in own]
        assert list(itertools.chain.from_iterable(steps)) == list(
            range(spec.work_samples // (spec.batch * spec.max_parallelism))
        )
    simulated = pd.DataFrame(
        [(spec.id, spec.submit_s, FINISH[spec.id], FINISH[spec.id] - spec.submit_s) for spec in HAND_JOBS],
        columns=["id", "submit_s", "finish_s", "jct_s"],
    )
    times = completion_times(runs.reset_index(), simulated).set_index("id")
    assert times.loc["a", "real_finish_s"] == runs.loc[("a", 1), "end_s"]
    assert times.loc["b", "real_jct_s"] == runs.loc[("b", 1), "end_s"] - 1
    b_runs = runs.loc["b"]
    assert times.loc["b", "real_busy_s"] == pytest.approx((b_runs["end_s"] - b_runs["start_s"]).sum())
    assert times.loc["b", "simulated_busy_s"] == pytest.approx((4 - 2) + (10 - 8))
    # the model state comes through the checkpoint: a one-type chain of stages trains as one uninterrupted run
    # (emulated types differ in their last bits, so b's slow-then-fast chain cannot be compared so)
    d = job("d", 0, 1, 12)
    fast = ((1, "fast"),)
    chain = [
        Stage("d", 0, 0, 1, "fast:1x1", fast, ("fast-0",), 5, ()),
        Stage("d", 1, 0, 1, "fast:1x1", fast, ("fast-0",), 7, (("d", 0),)),
    ]
    chain_points = stage_points(chain, [d], launcher, SETTINGS)
    execute(chain, chain_points, tmp_path, local_launcher(120))
    whole = typed_point("resnet20", 4, fast, launcher, SETTINGS, steps=12, run="uninterrupted")
    run_point(whole, tmp_path / whole.id, local_launcher(120))
    ids = [point.id for point in chain_points.values()] + [whole.id]
    table = tidy_table([tmp_path / point_id for point_id in ids]).query("metric == 'loss'")
    chained = table[table["point_id"] != whole.id].sort_values("step")["value"].tolist()
    assert len(chained) == 12
    assert chained == table[table["point_id"] == whole.id].sort_values("step")["value"].tolist()


def test_placement_label_round_trip() -> None:
    placement = Placement((Share("fast", 1, 2), Share("slow", 3, 1)))
    assert Placement.from_label(placement.label()) == placement
    with pytest.raises(ValueError, match="'fast:1x' is not a placement label"):
        Placement.from_label("fast:1x")


@pytest.mark.slow
def test_a_failed_stage_stops_the_stages_still_waiting(tmp_path: Path) -> None:
    """x's run fails at once (no such model); y, independent and due at 60 s, is never started and the replay fails
    within seconds."""
    launcher = load_config(REPO / "config" / "config.yaml")["launcher"]
    x = Stage("x", 0, 0, 1, "fast:1x1", ((1, "fast"),), ("fast-0",), 2, ())
    y = Stage("y", 0, 60, 61, "slow:1x1", ((1, "slow"),), ("slow-0",), 2, ())
    points = {
        ("x", 0): typed_point("no_such_model", 4, x.processes, launcher, SETTINGS, steps=2),
        ("y", 0): typed_point("resnet20", 4, y.processes, launcher, SETTINGS, steps=2),
    }
    started = time.monotonic()
    with pytest.raises(RunFailed, match="rank 0 exited with code 1"):
        execute([x, y], points, tmp_path, local_launcher(60))
    assert time.monotonic() - started < 30
    assert not (tmp_path / points[("y", 0)].id).exists()
