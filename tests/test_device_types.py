"""Device types emulated on CPU (ISA cap, threads, CPU quota) and D2: real multi-process gloo runs of the consistent
trainer on mixed types, typed placements in the config, and the per-rank CPU quota through a real cgroup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, output_of_throttled
from test_consistent import differing, losses

from ddlrepro.host import cpuquota
from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.cpuquota import CpuQuotas
from ddlrepro.host.figures import figure_points
from ddlrepro.host.figures.device_types import quota_status, typed_params
from ddlrepro.host.launchers.processes import free_loopback_port
from ddlrepro.host.owners import owned_name
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point
from ddlrepro.rank.allocation import cgroup_cpu_limit
from ddlrepro.rank.devicetypes import rank_environment
from ddlrepro.records import RECORD_PREFIX

TYPES = {
    "fast": {"isa": "native", "threads": None, "cpu_quota": 1.0},
    "slow": {"isa": "sse41", "threads": None, "cpu_quota": 0.6},
}
STEPS = 3


def typed(placement: list, mode: str = "D1", kernels: str | None = None, **extra) -> Point:
    """A job of 4 ESTs of smallnet (BatchNorm, dropout) on typed processes: [[2, "fast"], [1, "slow"], ...]."""
    counts = [count for count, _ in placement]
    params = {"model": "smallnet", "logical_workers": 4, "placement": counts, "mode": mode, "batch_size": 4}
    params |= {"steps": STEPS, "learning_rate": 0.05, "backend": "gloo", "sample_interval_s": 1.0, **extra}
    params |= typed_params([name for _, name in placement], TYPES, 1, kernels)
    return Point("easyscale-fig9", "consistent", len(counts), 1, params)


def can_set_quotas() -> str | None:
    """Why this machine cannot set a CPU quota (None when it can)."""
    with CpuQuotas(f"probe-{os.getpid()}", {0: 0.5}) as quotas:
        return None if quotas.applied else quotas.status


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("devicetypes")
    mixed, other_mixed = [[2, "fast"], [1, "slow"], [1, "slow"]], [[1, "slow"], [3, "fast"]]
    plans = {
        "D2-baseline": typed([[1, "fast"]] * 4, kernels="slow"),
        "D1+D2-mixed": typed(mixed, kernels="slow"),
        "D1+D2-other-mixed": typed(other_mixed, kernels="slow"),
        "D1-baseline": typed([[1, "fast"]] * 4),
        "D1-alone-mixed": typed(mixed),
    }
    for name, point in plans.items():
        run_point(point, folder / name, local_launcher(300))
    return folder


def workers(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "provenance.json").read_text())["workers"]


@pytest.mark.slow
def test_d1_d2_is_bitwise_identical_to_its_baseline_across_mixed_placements(runs: Path) -> None:
    reference = losses(runs / "D2-baseline")
    assert len(reference) == STEPS
    for name in ("D1+D2-mixed", "D1+D2-other-mixed"):
        assert losses(runs / name) == reference, name
        assert differing(runs / "D2-baseline", runs / name) == [], name


@pytest.mark.slow
def test_d1_alone_differs_once_types_mix(runs: Path) -> None:
    """Its own kernels on the slow processes give other gradient bits, so the parameters differ (over these 3
    steps the float32 losses may still round to the same values, as they do on some CPUs)."""
    assert any(name.startswith("parameter") for name in differing(runs / "D1-baseline", runs / "D1-alone-mixed"))


@pytest.mark.slow
def test_each_rank_records_its_type_kernels_and_quota(runs: Path) -> None:
    alone = workers(runs / "D1-alone-mixed")
    assert [w["device_type"] for w in alone] == ["fast", "slow", "slow"]
    assert [w["aten_capability"] for w in alone][1:] == ["DEFAULT", "DEFAULT"]
    assert "SSE4.1" in alone[1]["onednn_isa"] and "SSE4.1" not in alone[0]["onednn_isa"]
    d2 = workers(runs / "D1+D2-mixed")
    assert {w["kernels_of"] for w in d2} == {"slow"} and {w["aten_capability"] for w in d2} == {"DEFAULT"}
    assert [w["cpu_quota_wanted"] for w in d2] == [None, 0.6, 0.6]
    reason = can_set_quotas()
    if reason is None:  # the slow ranks read their own cgroup's limit (the fast one: whatever limits this test)
        assert [w["cpu_quota_cores"] for w in d2][1:] == pytest.approx([0.6, 0.6])
    assert [w["cpu_quota_status"] for w in d2][1:] == ["applied" if reason is None else reason] * 2
    table = tidy_table([runs / "D1+D2-mixed"])
    steps = table[table["metric"] == "step_time_s"]
    assert set(steps["device_type"]) == {"fast (slow's kernels)", "slow (slow's kernels)"}


@pytest.mark.slow
def test_an_unapplied_quota_is_recorded_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpuquota, "CGROUP_ROOT", tmp_path / "no-cgroups")
    run_point(typed([[2, "fast"], [2, "slow"]], steps=1), tmp_path / "run", local_launcher(300))
    status = workers(tmp_path / "run")[1]["cpu_quota_status"]
    assert status.startswith("not applied: no cpu controller under")
    table = tidy_table([tmp_path / "run"])
    assert quota_status(table) == status


def busy_rate(quotas: CpuQuotas | None) -> float:
    """Loop iterations per second of a CPU-bound process (in rank 0's group of `quotas`, if given) over 1 s."""
    loop = "import time\nend, n = time.perf_counter() + 1.0, 0\nwhile time.perf_counter() < end:\n    n += 1\nprint(n)"
    return int(output_of_throttled(loop, quotas))


@pytest.mark.serial  # compares loop speeds
def test_a_cgroup_quota_slows_a_cpu_bound_loop_and_is_removed() -> None:
    """A quota of 0.3 of a core reads about 0.3x the free loop, and below 0.6x even when the free readings fell on
    this VM's slower speed level and the throttled one on the faster (about 12 and 18 million iterations/s: with a
    quota of 0.6 against one free reading this read 0.84x). Free: the best of readings before and after."""
    reason = can_set_quotas()
    if reason:
        pytest.skip(f"cannot create cgroups here: {reason}")
    free = [busy_rate(None)]
    with CpuQuotas(f"test-{os.getpid()}", {0: 0.3}) as quotas:
        assert quotas.status == "applied"
        base = quotas.base
        throttled = busy_rate(quotas)
    free.append(busy_rate(None))
    assert not base.exists()
    assert throttled < max(free) * 0.6, (throttled, free)


def test_the_groups_go_even_when_a_run_fails_with_a_process_left_in_them() -> None:
    reason = can_set_quotas()
    if reason:
        pytest.skip(f"cannot create cgroups here: {reason}")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(RuntimeError, match="the run failed"), CpuQuotas(f"fail-{os.getpid()}", {0: 0.5}) as quotas:
            base = quotas.base
            quotas.join(0, sleeper.pid)
            raise RuntimeError("the run failed")
        assert not base.exists() and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_group_of_the_same_name_is_someone_elses_and_stays(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")  # a v2 hierarchy with the cpu controller
    theirs = tmp_path / owned_name("quota", "x")  # the name this process would give its own group
    theirs.mkdir()
    (theirs / "cgroup.procs").write_text("4242\n")
    with CpuQuotas("x", {0: 0.5}, root=tmp_path) as quotas:
        assert not quotas.applied and "File exists" in quotas.status
    assert (theirs / "cgroup.procs").read_text() == "4242\n"


def test_a_machine_without_a_cpu_controller_applies_nothing(tmp_path: Path) -> None:
    with CpuQuotas("x", {1: 0.6}, root=tmp_path) as quotas:
        quotas.join(0, os.getpid())
        assert not quotas.applied and quotas.status.startswith(f"not applied: no cpu controller under {tmp_path}")
    assert list(tmp_path.iterdir()) == []


def test_a_process_reads_its_own_cgroup_limit_v1_and_v2(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    (tmp_path / "cpu" / "job").mkdir(parents=True)
    (tmp_path / "cpu" / "job" / "cpu.cfs_quota_us").write_text("60000\n")
    (tmp_path / "cpu" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("5:cpu,cpuacct:/job\n0::/\n")
    assert cgroup_cpu_limit(proc, tmp_path) == pytest.approx(0.6)
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "cpu.max").write_text("150000 100000\n")
    proc.write_text("0::/two\n")
    assert cgroup_cpu_limit(proc, tmp_path) == pytest.approx(1.5)
    (tmp_path / "two" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(proc, tmp_path) is None


def test_d2_gives_every_rank_the_reference_kernels_and_own_types_their_own() -> None:
    d2, alone = typed([[2, "fast"], [2, "slow"]], kernels="slow"), typed([[2, "fast"], [2, "slow"]])
    for rank in (0, 1):
        assert rank_environment(d2.params, rank)["ONEDNN_MAX_CPU_ISA"] == "SSE41"
    assert "ONEDNN_MAX_CPU_ISA" not in rank_environment(alone.params, 0)
    assert rank_environment(alone.params, 1)["ATEN_CPU_CAPABILITY"] == "default"
    assert [rank_environment(alone.params, rank)["DDLREPRO_DEVICE_TYPE"] for rank in (0, 1)] == ["fast", "slow"]
    assert "device_types" not in typed([[2, "fast"], [2, "fast"]]).params  # the default type: an untyped point


def fig9_config(**section) -> dict:
    config = load_config(REPO / "config" / "config.yaml")
    config["figures"]["easyscale-fig9"].update(section)
    return config


def test_typed_placements_expand_panel_b() -> None:
    points = list(figure_points(fig9_config())["easyscale-fig9"].values())
    typed_points = [p for p in points if "device_types" in p.params]
    assert len(points) == 17 and len(typed_points) == 8
    last = [p for p in typed_points if p.params.get("stage") == 2 and p.params["mode"] == "D1"]
    assert sorted(p.params.get("kernels", {}).get("name", "own") for p in last) == ["own", "slow"]
    assert [t["name"] for t in last[0].params["device_types"]] == ["fast", "slow", "slow"]
    assert {p.params["kernels"]["isa"] for p in typed_points if "kernels" in p.params} == {"sse41"}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"heterogeneous_stages": [[[1, "fast"]] * 4, [[2, "fast"], [2, "fast"]], [[2, "fast"], [2, "slw"]]]},
            r"figures\.easyscale-fig9\.heterogeneous_stages\[2\]\[1\]: unknown device type 'slw'; "
            r"launcher\.device_types defines fast, slow",
        ),
        (
            {"heterogeneous_stages": [[[1, "fast"]] * 4, [[2, "fast"]], [[2, "fast"], [2, "slow"]]]},
            r"figures\.easyscale-fig9\.heterogeneous_stages\[1\]: \[\[2, 'fast'\]\] runs 2 ESTs, logical_workers is 4",
        ),
        (
            {"heterogeneous_stages": [[[1, "fast"]] * 4]},
            r"figures\.easyscale-fig9\.heterogeneous_stages: 1 stages, `stages` has 3",
        ),
        (
            {"d2_reference_type": "medium"},
            r"figures\.easyscale-fig9\.d2_reference_type: unknown device type 'medium'",
        ),
    ],
)
def test_bad_typed_placements_name_their_key(section: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        figure_points(fig9_config(**section))


def test_bad_device_types_fail_validation_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("launcher:\n  device_types:\n    slow: {isa: sse3}\nfigures: {}\n")
    with pytest.raises(ConfigError, match=r"launcher\.device_types\.slow\.isa: 'sse3' is not valid"):
        load_config(REPO / "config" / "config.yaml", bad)
    bad.write_text("figures:\n  easyscale-fig9: {heterogeneous_stages: [[[1, fast, 2]]]}\n")
    with pytest.raises(ConfigError, match=r"figures\.easyscale-fig9\.heterogeneous_stages\[0\]\[0\]"):
        load_config(REPO / "config" / "config.yaml", bad)


@pytest.mark.slow
def test_a_rank_started_without_its_types_variables_starts_again_with_them(tmp_path: Path) -> None:
    """As in a pod template shared by every rank: the workload itself sets its kernels' variables."""
    point = typed([[4, "slow"]], steps=1)
    env = {name: value for name, value in os.environ.items() if name not in ("ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")}
    env |= {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_loopback_port())}
    env |= {"DDLREPRO_RUN_DIR": str(tmp_path), "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "ddlrepro.rank.workloads", point.to_json()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(RECORD_PREFIX)]
    records = [json.loads(line.removeprefix(RECORD_PREFIX)) for line in lines]
    (worker,) = [record for record in records if record["kind"] == "worker"]
    assert worker["aten_capability"] == "DEFAULT" and "SSE4.1" in worker["onednn_isa"]
    assert worker["cpu_quota_status"].startswith("not applied: the launcher set no CPU quota")
