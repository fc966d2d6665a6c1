"""The scheduler simulator (ddlrepro.host.simulator): exact completion times of hand-computed two-job traces under
every policy, the cluster invariant over a generated trace, determinism, and errors that name what is wrong."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import pytest

from ddlrepro.host.cli import main
from ddlrepro.host.errors import UserError
from ddlrepro.host.simulator import elastic
from ddlrepro.host.simulator.cli import parse_cluster
from ddlrepro.host.simulator.cluster import ARTIFACT_CLUSTER, Cluster, OverAllocation, Placement, Share
from ddlrepro.host.simulator.engine import Simulation, SimulationError, Timing, simulate, write_tables
from ddlrepro.host.simulator.placements import preferred_only
from ddlrepro.host.simulator.schedulers import POLICIES, Policy
from ddlrepro.host.simulator.step_profiles import (
    ProfileError,
    ProfileLookupError,
    Profiles,
    from_table,
    read_artifact_dir,
    read_profiles,
)
from ddlrepro.host.simulator.traces import (
    ARTIFACT_APPLICATION_COUNTS,
    ARTIFACT_PARALLELISM_COUNTS,
    Job,
    TraceError,
    generate_trace,
    read_trace,
)

SMALL = Cluster.of({"fast": 2, "slow": 2})
ARTIFACT_HEADER = (
    "name,time,application,max_parallelism,batch_size,epochs,enable_heterogeneous_deterministic,preferred_gpu,\r\n"
)


def profiles_of(steps: Mapping[str, Mapping[int, float]]) -> Profiles:
    """One application `m` at per-EST batch 12: {device type: {ESTs per device: seconds of one EST's step}}."""
    rows = [
        {"application": "m", "device_type": t, "batch_per_est": 12, "ests_per_device": k, "step_time_s": s, "host": "h"}
        for t, by_ests in steps.items()
        for k, s in by_ests.items()
    ]
    return from_table(pd.DataFrame(rows))


def small_profiles(fast: str = "fast", slow: str = "slow", slow_step_s: float = 3.0) -> Profiles:
    """An EST's step takes 2 s on `fast`, 3 s on `slow`, with 1 or 2 ESTs per device (so a device's time per
    global step is k × that)."""
    return profiles_of({fast: {1: 2.0, 2: 2.0}, slow: {1: slow_step_s, 2: slow_step_s}})


def job(
    name: str,
    *,
    work: float,
    submit: float = 0.0,
    preferred: str = "fast",
    heterogeneous: bool = False,
    ests: int = 2,
    batch: int = 12,
) -> Job:
    return Job(
        id=name,
        row=1,
        submit_s=submit,
        application="m",
        trace_application="m",
        max_parallelism=ests,
        batch=batch,
        epochs=1,
        heterogeneous=heterogeneous,
        preferred_type=preferred,
        work_samples=work,
    )


def finishes(
    jobs: list[Job], policy: str, cluster: Cluster = SMALL, profiles: Profiles | None = None, **options
) -> dict[str, float]:
    result = simulate(jobs, cluster, profiles or small_profiles(), policy, Timing(**options))
    return dict(zip(result.jobs["id"], result.jobs["finish_s"], strict=True))


def allocated(result: Simulation, time_s: float) -> dict[str, int]:
    rows = result.allocations[result.allocations["time_s"] == time_s]
    return dict(zip(rows["device_type"], rows["allocated"], strict=True))


# Throughputs at batch 12, 2 ESTs (samples/s = 12 × 2 ÷ global step): fast:2x1 12, fast:1x2 6, slow:2x1 8,
# slow:1x2 4, fast:1x1 + slow:1x1 8 (step max(2, 3) = 3 s; waste 1 − (2/3)/(1/2 + 1/3) = 0.2 ≤ 0.3).
TRACE_1 = [job("a", work=720), job("b", submit=30, preferred="slow", work=960)]
TRACE_2 = [job("a", work=1200), job("b", work=480, heterogeneous=True)]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("yarn-cs", {"a": 80, "b": 260}),
        ("fifo-gang", {"a": 80, "b": 200}),
        ("easyscale-homo", {"a": 100, "b": 220}),
        ("easyscale-heter", {"a": 100, "b": 220}),
    ],
)
def test_two_jobs_on_two_types(policy: str, expected: dict[str, float]) -> None:
    """a (fast, 720 samples) at 0 s, b (slow, 960) at 30 s; rounds every 60 s, 20 s paid at a job's first start.

    yarn-cs: a gang fast:2x1 at 0: 20 s start, 40 s × 12 = 480, then 240 ÷ 12 = 20 s → 80. b is served only as
    the head of the queue, at 120: slow:2x1, 20 s + 40 × 8 = 320, 480 in [180, 240), 160 ÷ 8 = 20 s → 260.
    fifo-gang: b starts at 60 on the free slow pair: 320, 480, then 20 s → 200.
    easyscale-homo: a starts at 0 on one fast device (fast:1x2): 40 × 6 = 240; at 60 b starts on slow:1x2 and a
    doubles to fast:2x1 (free): 480 ÷ 12 = 40 s → 100; b: 20 s + 40 × 4 = 160; at 120 b doubles to slow:2x1:
    480 → 640, 320 ÷ 8 = 40 s → 220.
    easyscale-heter: neither job's heterogeneous flag is set: as homo."""
    assert finishes(TRACE_1, policy) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("yarn-cs", {"a": 120, "b": 180}),
        ("fifo-gang", {"a": 120, "b": 180}),
        ("easyscale-homo", {"a": 170, "b": 100}),
        ("easyscale-heter", {"a": 170, "b": 90}),
    ],
)
def test_heterogeneous_job_uses_the_other_type(policy: str, expected: dict[str, float]) -> None:
    """a (fast, 1200) and b (fast, 480, heterogeneous) both at 0 s.

    yarn-cs and fifo-gang: a gang fast:2x1: 20 s + 40 × 12 = 480, 720 ÷ 12 = 60 s → 120; b then: 20 s + 40 × 12
    = 480 → 180.
    easyscale-homo: both start on fast:1x2 (6/s): 20 s + 40 × 6 = 240 each; at 60 no fast device is free: b
    240 ÷ 6 = 40 s → 100; a 360 → 600, at 120 grows to fast:2x1: 600 ÷ 12 = 50 s → 170.
    easyscale-heter: at 60 b adds a slow device (fast:1x1 + slow:1x1, 8/s, speed-up 1.33 at waste 0.2):
    240 ÷ 8 = 30 s → 90; a as in homo → 170."""
    assert finishes(TRACE_2, policy) == expected


@pytest.mark.parametrize(("fast", "slow"), [("fast", "slow"), ("v100", "p100")])
def test_equal_speed_ups_go_to_the_growth_keeping_the_jobs_devices(fast: str, slow: str) -> None:
    """TRACE_2 under easyscale-heter at t = 60 (a on fast:1x2, b on fast:1x2, both slow devices free): b's growths
    fast:1x1 + slow:1x1 and a move onto slow:2x1 both give 8/s on 2 devices, marginal speed-up (8/6 − 1) ÷ 1 = 1/3
    each. The first keeps b's fast device: taken, so fast 2 and slow 1 are allocated. (Ranking by the placement's
    label took `p100:2x1` over `v100:1x1+p100:1x1` with the artifact's type names, moving b off its fast device.)"""
    jobs = [dataclasses.replace(j, preferred_type=fast) for j in TRACE_2]
    cluster = Cluster.of({fast: 2, slow: 2})
    result = simulate(jobs, cluster, small_profiles(fast, slow), "easyscale-heter")
    assert allocated(result, 60) == {fast: 2, slow: 1}
    assert dict(zip(result.jobs["id"], result.jobs["finish_s"], strict=True)) == {"a": 170, "b": 90}


def test_a_growth_wasting_over_30_percent_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRACE_2 under easyscale-heter on 2 fast + 1 slow, slow steps 3.9 s. At 60 b (fast:1x2, 6/s) could take the
    slow device: fast:1x1 + slow:1x1 gives 24 ÷ 3.9 = 6.15/s but wastes 1 − (2/3.9) ÷ (1/2 + 1/3.9) = 0.32 > 0.3:
    refused, b ends 240 ÷ 6 = 40 s later → 100. Without the cap it takes it: 240 ÷ (24/3.9) = 39 s → 99. a: fast:1x2
    until 120 (600 done), then fast:2x1: 600 ÷ 12 = 50 s → 170 either way."""
    cluster = Cluster.of({"fast": 2, "slow": 1})
    profiles = small_profiles(slow_step_s=3.9)
    assert finishes(TRACE_2, "easyscale-heter", cluster, profiles) == pytest.approx({"a": 170, "b": 100})
    monkeypatch.setattr(elastic, "MAX_WASTE", 1.0)
    assert finishes(TRACE_2, "easyscale-heter", cluster, small_profiles(slow_step_s=3.9)) == pytest.approx(
        {"a": 170, "b": 99}
    )


def test_a_job_at_most_doubles_its_devices_in_a_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4-EST job (2400 samples) on 8 fast devices, one EST's step 1 s alone on a device and 2 s with 2–4 (so a
    device's time per global step: 1, 4, 6, 8 s for 1–4 ESTs). t = 0: fast:1x4, 12 × 4 ÷ 8 = 6/s: 20 s start, 240
    done. t = 60: at most 2 devices: fast:2x2, 48 ÷ 4 = 12/s (fast:4x1, 48/s, gains 7/3 per added device, is past
    2×): 960 done by 120. t = 120: fast:4x1 (gain 3/2 per device, over fast:3x2's none): 1440 ÷ 48 = 30 s → 150.
    Without the cap, fast:4x1 at 60: 2160 ÷ 48 = 45 s → 105."""
    cluster = Cluster.of({"fast": 8})
    profiles = profiles_of({"fast": {1: 1.0, 2: 2.0, 4: 2.0}})
    wide = [job("w", work=2400, ests=4)]
    result = simulate(wide, cluster, profiles, "easyscale-homo")
    assert [allocated(result, t)["fast"] for t in (0, 60, 120)] == [1, 2, 4]
    assert result.jobs["finish_s"].tolist() == [150]
    monkeypatch.setattr(elastic, "MAX_GROWTH", 100)
    assert finishes(wide, "easyscale-homo", cluster, profiles_of({"fast": {1: 1.0, 2: 2.0, 4: 2.0}})) == {"w": 105}


def test_one_profiles_object_serves_two_clusters_as_fresh_ones_would() -> None:
    """A 4-EST job (1200 samples) starts on fast:2x2 (12/s: 480 done by 60). On 2 fast devices it stays: 720 ÷ 12 =
    60 s → 120; on 4 it grows to fast:4x1 at 60 (24/s): 720 ÷ 24 = 30 s → 90. The profiles memoise what follows
    from them: keyed without the cluster, the second run reused the first's growths."""
    jobs = [job("w", work=1200, ests=4)]
    shared = small_profiles()
    for cluster, expected in ((SMALL, {"w": 120}), (Cluster.of({"fast": 4, "slow": 2}), {"w": 90})):
        for policy in ("easyscale-homo", "easyscale-heter"):
            assert finishes(jobs, policy, cluster, shared) == expected
            fresh = simulate(jobs, cluster, small_profiles(), policy)
            assert simulate(jobs, cluster, shared, policy).allocations.equals(fresh.allocations)


def test_a_policy_that_over_allocates_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    def greedy(now, cluster, active, current, profiles) -> dict[str, Placement]:
        return {j.id: Placement((Share("fast", 3, 1),)) for j in active}

    monkeypatch.setitem(POLICIES, "greedy", Policy("greedy", greedy, preferred_only, gang=False, label="greedy"))
    with pytest.raises(OverAllocation, match=re.escape("t=0 s: 3 fast allocated, the cluster has 2")):
        simulate([job("a", work=100)], SMALL, small_profiles(), "greedy")


def test_measured_restart_is_paid_at_every_reallocation() -> None:
    """TRACE_1 under easyscale-homo, 5 s per (re)start: a 5 s + 55 × 6 = 330 by 60; grows (5 s), 390 ÷ 12 =
    32.5 s → 97.5. b starts at 60: 5 s + 55 × 4 = 220; grows at 120: 5 s + 55 × 8 = 440 → 660; 300 ÷ 8 = 37.5 s →
    217.5."""
    got = finishes(TRACE_1, "easyscale-homo", restart="measured", restart_s=5.0)
    assert got == {"a": 97.5, "b": 217.5}


def test_summary_reports_mean_jct_and_both_makespans() -> None:
    summary = simulate(TRACE_1, SMALL, small_profiles(), "yarn-cs").summary()
    assert summary == {"mean_jct_s": (80 + 230) / 2, "makespan_s": 260, "makespan_artifact_s": 240}


def artifact_profiles(tmp_path: Path) -> Profiles:
    """Every artifact application in the artifact's logs.json format, batches 4–4096, V100 fastest."""
    for index, application in enumerate(ARTIFACT_APPLICATION_COUNTS):
        logs = {
            str(batch): {"step1": [{"total_time": (index + 1) * batch * f / 4000} for f in (1.0, 1.5, 2.5)]}
            for batch in (2, 4096)
        }
        (tmp_path / application).mkdir(parents=True)
        (tmp_path / application / "logs.json").write_text(json.dumps(logs))
    return read_artifact_dir(tmp_path)


def test_no_round_allocates_more_devices_than_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round's devices in use are summed here from every job's placement as the policy decided it (not by the
    cluster's own count), over the generated artifact-sized trace (seed 0) on profiles where P100 is 1.5× and T4
    2.5× slower than V100. JCT: heter < homo < fifo-gang < yarn-cs; makespan: heter < homo < yarn-cs (on this
    trace the last job to finish is a heterogeneous one; on seeds 1–3 heter and homo tie, their last job running
    on the same devices under both)."""
    cluster = Cluster.of(ARTIFACT_CLUSTER)
    profiles = artifact_profiles(tmp_path)
    jobs = generate_trace(0, profiles, cluster)
    assert len(jobs) == sum(ARTIFACT_PARALLELISM_COUNTS.values())
    in_use: dict[tuple[str, float], Counter[str]] = {}

    def recording(policy: Policy) -> Policy:
        def decide(now, cluster, active, current, profiles) -> dict[str, Placement]:
            decided = policy.decide(now, cluster, active, current, profiles)
            used = Counter(dict.fromkeys(cluster.types, 0))
            for placement in decided.values():
                for share in placement.shares:
                    used[share.device_type] += share.devices
            in_use[policy.name, now] = used
            return decided

        return dataclasses.replace(policy, decide=decide)

    summaries = {}
    for name, policy in list(POLICIES.items()):
        monkeypatch.setitem(POLICIES, name, recording(policy))
        result = simulate(jobs, cluster, profiles, name)
        assert result.jobs["finish_s"].notna().all()
        rounds = {now: used for (policy_name, now), used in in_use.items() if policy_name == name}
        assert len(rounds) == result.allocations["time_s"].nunique()
        for now, used in rounds.items():
            assert all(used[t] <= cluster.size(t) for t in used), (name, now, used)
            assert allocated(result, now) == dict(used), (name, now)
        summaries[name] = result.summary()
    jct = {name: summary["mean_jct_s"] for name, summary in summaries.items()}
    makespan = {name: summary["makespan_s"] for name, summary in summaries.items()}
    assert jct["easyscale-heter"] < jct["easyscale-homo"] < jct["fifo-gang"] < jct["yarn-cs"]
    assert makespan["easyscale-heter"] < makespan["easyscale-homo"] < makespan["yarn-cs"]


def test_same_seed_same_bytes_other_seed_other_trace(tmp_path: Path) -> None:
    cluster = Cluster.of(ARTIFACT_CLUSTER)
    profiles = artifact_profiles(tmp_path / "profiles")
    outputs = []
    for run, seed in enumerate((7, 7, 8)):
        jobs = generate_trace(seed, profiles, cluster)
        results = [simulate(jobs, cluster, profiles, policy) for policy in POLICIES]
        written = write_tables(results, tmp_path / str(run))
        outputs.append([path.read_bytes() for path in written])
    assert outputs[0] == outputs[1]
    assert generate_trace(7, profiles, cluster) != generate_trace(8, profiles, cluster)
    assert outputs[0] != outputs[2]


def write(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(ARTIFACT_HEADER + "".join(row + "\r\n" for row in rows))
    return path


def test_reads_the_artifacts_format(tmp_path: Path) -> None:
    """Its quirks: CRLF lines, an unnamed ninth column (missing on some rows), a flag of 40."""
    profiles = artifact_profiles(tmp_path / "profiles")
    trace = write(tmp_path, "bert-0,115,bert,16,8,4,40,v100,0.4", "ncf-1,230,ncf,32,4096,4,0,p100")
    jobs = read_trace(trace, profiles, Cluster.of(ARTIFACT_CLUSTER))
    assert [(j.id, j.submit_s, j.heterogeneous, j.preferred_type) for j in jobs] == [
        ("bert-0", 115, True, "v100"),
        ("ncf-1", 230, False, "p100"),
    ]
    assert jobs[0].work_samples == pytest.approx(4 * 886.41)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("x-1,300,gpt,16,8,4,1,v100", "row 2, field application: no profile for 'gpt'"),
        ("b-1,-5,bert,16,8,4,1,v100", "row 2, field time: -5 is below 0"),
        ("b-1,100,bert,16,8,4,1,v100", "row 2, field time: 100 is earlier than the row before's 115"),
        ("b-1,300,bert,65,8,4,1,v100", "row 2, field max_parallelism: 65 is larger than the cluster (64 devices)"),
        ("b-1,300,bert,16,8,4,1,a100", "row 2, field preferred_gpu: 'a100' is not a device type"),
    ],
)
def test_bad_rows_are_named(tmp_path: Path, row: str, message: str) -> None:
    profiles = artifact_profiles(tmp_path / "profiles")
    trace = write(tmp_path, "bert-0,115,bert,16,8,4,1,v100", row)
    with pytest.raises(TraceError, match=re.escape(message)):
        read_trace(trace, profiles, Cluster.of(ARTIFACT_CLUSTER))


def test_unsorted_trace_kept_in_file_order_when_allowed(tmp_path: Path) -> None:
    """The artifact's own trace has one row (21) 24 s earlier than the row before."""
    profiles = artifact_profiles(tmp_path / "profiles")
    trace = write(tmp_path, "b-0,1341,bert,16,8,4,1,v100", "b-1,1317,bert,32,16,50,1,v100")
    jobs = read_trace(trace, profiles, Cluster.of(ARTIFACT_CLUSTER), allow_unsorted=True)
    assert [job.id for job in jobs] == ["b-0", "b-1"]


def test_a_repeated_name_replaces_the_job_in_its_place_as_the_artifact_does(tmp_path: Path) -> None:
    """The artifact keeps its jobs in an OrderedDict by name: a later row of the same name replaces the job."""
    profiles = artifact_profiles(tmp_path / "profiles")
    rows = ("e-1,100,electra,32,8,70,1,v100", "e-2,200,electra,16,8,5,1,p100", "e-1,300,electra,16,8,9,0,p100")
    trace = write(tmp_path, *rows)
    with pytest.raises(TraceError, match=r"field name: job names used twice: \['e-1'\]"):
        read_trace(trace, profiles, Cluster.of(ARTIFACT_CLUSTER))
    jobs = read_trace(trace, profiles, Cluster.of(ARTIFACT_CLUSTER), artifact_duplicates=True)
    assert [(job.id, job.submit_s, job.row) for job in jobs] == [("e-1", 300, 3), ("e-2", 200, 2)]


def test_a_gang_larger_than_its_type_is_named_before_running() -> None:
    """The artifact's trace has such a row (electra-28-2: 32 on P100, of which there are 16; a later row of the same
    name replaced it in the artifact's run)."""
    too_big = [job("a", work=100), dataclasses.replace(job("wide", work=100, ests=3, preferred="slow"), row=2)]
    with pytest.raises(TraceError, match=r"trace row 2 \(job wide\), field max_parallelism: a gang of 3"):
        simulate(too_big, SMALL, small_profiles(), "fifo-gang")
    assert simulate(too_big, SMALL, small_profiles(), "easyscale-homo").jobs["finish_s"].notna().all()


def test_lookup_outside_the_measured_range_names_it() -> None:
    profiles = small_profiles()
    assert profiles.step_time("m", "slow", 12, 2) == 3.0
    with pytest.raises(ProfileLookupError, match="application 'm', device type 'slow', batch_per_est 12: "):
        profiles.step_time("m", "slow", 12, 3)
    with pytest.raises(ProfileLookupError, match="'fast': batch_per_est 13 is outside the measured 12–12"):
        profiles.step_time("m", "fast", 13, 1)


def test_interpolates_linearly_inside_the_range() -> None:
    rows = [
        {
            "application": "m",
            "device_type": "t",
            "batch_per_est": b,
            "ests_per_device": k,
            "step_time_s": s,
            "host": "h",
        }
        for b, k, s in ((8, 1, 1.0), (8, 4, 4.0), (16, 1, 2.0), (16, 4, 8.0))
    ]
    profiles = from_table(pd.DataFrame(rows))
    assert profiles.step_time("m", "t", 8, 2) == 2.0
    assert profiles.step_time("m", "t", 12, 2) == 3.0


def test_jobs_left_at_max_sim_time_are_listed() -> None:
    with pytest.raises(SimulationError, match=r"max_sim_time_s=100.*\n  b \(row 1, submitted at 30 s, waiting, 0% "):
        simulate(TRACE_1, SMALL, small_profiles(), "yarn-cs", Timing(max_sim_time_s=100))


def test_command_line_writes_both_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "profile.csv"
    small_profiles_table = pd.DataFrame(
        [
            {"application": "m", "device_type": t, "batch_per_est": 12, "ests_per_device": k, "step_time_s": s}
            | {"host": "box"}
            for t, s in (("fast", 2.0), ("slow", 3.0))
            for k in (1, 2, 4, 8, 16, 32)
        ]
    )
    small_profiles_table.to_csv(profile, index=False)
    out = tmp_path / "out"
    argv = ["simulate", "--generate-seed", "1", "--profiles", str(profile), "--out", str(out)]
    main([*argv, "--policy", "yarn-cs", "easyscale-heter", "--cluster", "fast=32,slow=32"])
    printed = capsys.readouterr().out
    assert "bert → m" in printed and "profiles from box" in printed
    jobs = pd.read_csv(out / "jobs.csv")
    assert sorted(set(jobs["policy"])) == ["easyscale-heter", "yarn-cs"]
    assert len(pd.read_csv(out / "allocations.csv").columns) == 4


def test_round_k_starts_at_k_times_round_s() -> None:
    """A gang at 12/s, 18 samples, no start cost, 0.1 s rounds: 15 rounds. Adding 0.1 ten times gives 0.9999…"""
    timing = Timing(round_s=0.1, restart_s=0, max_sim_time_s=100)
    result = simulate([job("a", work=18)], SMALL, small_profiles(), "yarn-cs", timing)
    times = result.allocations["time_s"].drop_duplicates().tolist()
    assert len(times) >= 11 and times == [k * 0.1 for k in range(len(times))]
    assert result.jobs["finish_s"].tolist() == pytest.approx([1.5])


def test_the_artifacts_makespan_rounds_before_its_ceiling() -> None:
    """A last finish at 3 × 0.1 s (0.30000000000000004) ends round 2, which starts at 0.2 s."""
    jobs = pd.DataFrame({"finish_s": [3 * 0.1], "jct_s": [3 * 0.1]})
    summary = Simulation("yarn-cs", 0.1, jobs, pd.DataFrame()).summary()
    assert summary["makespan_artifact_s"] == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_sim_time_s": math.inf}, "max_sim_time_s: inf is not a finite number"),
        ({"max_sim_time_s": math.nan}, "max_sim_time_s: nan is not a finite number"),
        ({"max_sim_time_s": 0}, "max_sim_time_s: 0 is not above 0"),
        ({"round_s": math.nan}, "round_s: nan is not a finite number"),
        ({"round_s": -60}, "round_s: -60 is not above 0"),
        ({"restart_s": math.inf}, "restart_s: inf is not a finite number"),
        ({"round_s": 1e-3, "max_sim_time_s": 1e5}, "max_sim_time_s 100000 ÷ round_s 0.001 is 1e+08 rounds, more"),
    ],
)
def test_settings_that_could_never_end_are_errors(settings: dict[str, float], message: str) -> None:
    with pytest.raises(SimulationError, match=re.escape(message)):
        simulate(TRACE_1, SMALL, small_profiles(), "easyscale-homo", Timing(**settings))


@pytest.mark.parametrize(
    ("policy", "jobs", "message"),
    [
        (
            "easyscale-heter",
            [job("a", work=100, batch=16, heterogeneous=True)],
            "trace row 1 (job a), field batch_size: 16 is outside 'm''s profiled batches on every type "
            "easyscale-heter allows it (fast 12–12; slow 12–12)",
        ),
        (
            "easyscale-homo",
            [job("a", work=100, ests=8)],
            "trace row 1 (job a), field max_parallelism: 8 ESTs fit on no device type easyscale-homo allows it, at "
            "the ESTs per device profiled: fast needs 4 (has 2)",
        ),
        (
            "fifo-gang",
            [job("a", work=100, preferred="huge")],
            "trace row 1 (job a), field preferred_gpu: 'huge' is not a device type of ['fast']",
        ),
        (
            "easyscale-homo",
            [job("a", work=100, preferred="slow")],
            "trace row 1 (job a), field preferred_gpu: 'slow' is not a device type of ['fast']",
        ),
    ],
)
def test_a_job_that_could_never_run_is_named_before_simulating(policy: str, jobs: list[Job], message: str) -> None:
    """The profiles know `slow`, this cluster does not; 8 ESTs need 4 devices at ≤ 2 ESTs each."""
    profiles = small_profiles()
    cluster = SMALL if "batch_size" in message or "8 ESTs" in message else Cluster.of({"fast": 2})
    with pytest.raises(TraceError, match=re.escape(message)):
        simulate(jobs, cluster, profiles, policy)


def test_a_gang_needs_one_est_per_device_profiled() -> None:
    profiles = profiles_of({"fast": {2: 2.0, 4: 2.0}, "slow": {2: 3.0}})
    message = (
        "field batch_size: 'm' on 'fast' at batch_per_est 12 is profiled for 2–4 ESTs per device; a gang (yarn-cs)"
    )
    with pytest.raises(TraceError, match=re.escape(message)):
        simulate([job("a", work=100)], SMALL, profiles, "yarn-cs")
    assert finishes([job("a", work=120)], "easyscale-homo", profiles=profiles) == {"a": 40}


def test_an_empty_trace_is_named() -> None:
    with pytest.raises(SimulationError, match="no jobs to simulate"):
        simulate([], SMALL, small_profiles(), "yarn-cs")


def test_a_device_type_given_twice_in_cluster_is_an_error() -> None:
    assert parse_cluster("v100=1,p100=5") == Cluster.of({"v100": 1, "p100": 5})
    with pytest.raises(UserError, match=re.escape("--cluster: device type 'v100' given twice ('v100=1,v100=5')")):
        parse_cluster("v100=1,v100=5")


@pytest.mark.parametrize("column", ["application", "device_type", "host"])
def test_an_empty_name_in_a_profile_table_names_its_row(tmp_path: Path, column: str) -> None:
    table = tmp_path / "profile.csv"
    rows = [{"application": "m", "device_type": "fast", "batch_per_est": 12, "ests_per_device": k} for k in (1, 2)]
    pd.DataFrame([row | {"step_time_s": 2.0, "host": "h"} for row in rows]).assign(
        **{column: ["x", None] if column != "application" else ["m", None]}
    ).to_csv(table, index=False)
    with pytest.raises(ProfileError, match=re.escape(f"profile.csv row 2, column {column}: empty")):
        read_profiles(table)


def test_the_command_line_gives_the_same_bytes_under_other_hash_seeds(tmp_path: Path) -> None:
    """Two processes, PYTHONHASHSEED 1 and 2 (set and dict orders of strings differ between them)."""
    profile = tmp_path / "profile.csv"
    rows = [
        {"application": a, "device_type": t, "batch_per_est": b, "ests_per_device": k, "host": "box"}
        | {"step_time_s": 0.01 * b * f * (1 + i)}
        for i, a in enumerate(("m", "n"))
        for t, f in (("fast", 1.0), ("slow", 1.7))
        for b in (8, 16)
        for k in (1, 2, 4, 8)
    ]
    pd.DataFrame(rows).to_csv(profile, index=False)
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        command = [sys.executable, "-m", "ddlrepro.host.cli", "simulate", "--generate-seed", "3"]
        command += ["--profiles", str(profile), "--out", str(out), "--cluster", "fast=32,slow=32", "--policy"]
        env = os.environ | {"PYTHONHASHSEED": seed}
        subprocess.run([*command, *sorted(POLICIES)], check=True, capture_output=True, env=env, timeout=120)
        outputs.append([(out / name).read_bytes() for name in ("jobs.csv", "allocations.csv", "trace.csv")])
    assert outputs[0] == outputs[1]
