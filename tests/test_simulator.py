"""The scheduler simulator (ddlrepro.host.simulator): exact completion times of hand-computed two-job traces under
every policy, the cluster invariant over a generated trace, determinism, and errors that name what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ddlrepro.host.cli import main
from ddlrepro.host.simulator.cluster import ARTIFACT_CLUSTER, Cluster
from ddlrepro.host.simulator.engine import SimulationError, simulate, write_tables
from ddlrepro.host.simulator.policies import POLICIES
from ddlrepro.host.simulator.profiles import ProfileLookupError, Profiles, from_table, read_artifact_dir
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


def small_profiles() -> Profiles:
    """One application `m` at batch 12: an EST's step takes 2 s on `fast`, 3 s on `slow`, with 1 or 2 ESTs per
    device (so a device's time per global step is k × that)."""
    rows = [
        {"application": "m", "device_type": t, "batch_per_est": 12, "ests_per_device": k, "step_time_s": s, "host": "h"}
        for t, s in (("fast", 2.0), ("slow", 3.0))
        for k in (1, 2)
    ]
    return from_table(pd.DataFrame(rows))


def job(name: str, submit: float, preferred: str, work: float, heterogeneous: bool = False) -> Job:
    return Job(name, 1, submit, "m", "m", 2, 12, 1, heterogeneous, preferred, work)


def finishes(jobs: list[Job], policy: str, **options) -> dict[str, float]:
    result = simulate(jobs, SMALL, small_profiles(), policy, **options)
    return dict(zip(result.jobs["id"], result.jobs["finish_s"], strict=True))


# Throughputs at batch 12, 2 ESTs (samples/s = 12 × 2 ÷ global step): fast:2x1 12, fast:1x2 6, slow:2x1 8,
# slow:1x2 4, fast:1x1 + slow:1x1 8 (step max(2, 3) = 3 s; waste 1 − (2/3)/(1/2 + 1/3) = 0.2 ≤ 0.3).
TRACE_1 = [job("a", 0, "fast", 720), job("b", 30, "slow", 960)]
TRACE_2 = [job("a", 0, "fast", 1200), job("b", 0, "fast", 480, heterogeneous=True)]


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


def test_no_round_allocates_more_devices_than_exist(tmp_path: Path) -> None:
    cluster = Cluster.of(ARTIFACT_CLUSTER)
    profiles = artifact_profiles(tmp_path)
    jobs = generate_trace(0, profiles, cluster)
    assert len(jobs) == sum(ARTIFACT_PARALLELISM_COUNTS.values())
    means = {}
    for policy in POLICIES:
        result = simulate(jobs, cluster, profiles, policy)
        used = result.allocations.pivot(index="time_s", columns="device_type", values="allocated")
        assert (used <= pd.Series(ARTIFACT_CLUSTER)[used.columns]).all().all(), policy
        assert result.jobs["finish_s"].notna().all()
        means[policy] = result.summary()["mean_jct_s"]
    assert means["easyscale-heter"] < means["easyscale-homo"] < means["fifo-gang"] < means["yarn-cs"]


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
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
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
    too_big = [job("a", 0, "fast", 100), Job("wide", 2, 0, "m", "m", 3, 12, 1, False, "slow", 100)]
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
        {"application": "m", "device_type": "t", "batch_per_est": b, "ests_per_device": k, "step_time_s": s, "host": ""}
        for b, k, s in ((8, 1, 1.0), (8, 4, 4.0), (16, 1, 2.0), (16, 4, 8.0))
    ]
    profiles = from_table(pd.DataFrame(rows))
    assert profiles.step_time("m", "t", 8, 2) == 2.0
    assert profiles.step_time("m", "t", 12, 2) == 3.0


def test_jobs_left_at_max_sim_time_are_listed() -> None:
    with pytest.raises(SimulationError, match=r"max_sim_time_s=100.*\n  b \(row 1, submitted at 30 s, waiting, 0% "):
        simulate(TRACE_1, SMALL, small_profiles(), "yarn-cs", max_sim_time_s=100)


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
