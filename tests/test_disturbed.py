"""A timing taken beside foreign CPU load is flagged `disturbed`, not judged: real tiny runs with and without a
CPU hog on every core, through the run folder, the tidy table, the figure's summary and the checks."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from conftest import REPO, output_of_throttled, tiny_point

from ddlrepro.host.checks import check_figure, checks_settings, figure_references
from ddlrepro.host.config import load_config
from ddlrepro.host.cpuquota import CpuQuotas
from ddlrepro.host.figures import figure_module
from ddlrepro.host.hostload import ForeignLoadMeter, WatchedProcesses
from ddlrepro.host.tables import host_load_columns, tidy_table
from ddlrepro.points import Point

HOG_LIMIT_S = 120
MAX_FOREIGN_SHARE = checks_settings({})["max_foreign_share"]
GUARD = 0.1  # a machine-speed guard as a steady machine would set it (checks.max_speed_drift)
TIMED_CHECKS = ["two-workers-faster"]  # ÷ the 1-worker run (tiny.yaml runs no host-ceiling run)


@contextmanager
def cpu_hogs() -> Iterator[None]:
    """One busy loop per core, killed on leaving, never outliving HOG_LIMIT_S (`timeout`). Each is started by a
    shell that exits at once, so it is no descendant of this process: a run counts its own process tree as its own
    CPU, and a hog among our children would be counted as the run's."""
    started = subprocess.run(
        [
            "sh",
            "-c",
            f"for i in $(seq {os.cpu_count() or 1}); do timeout {HOG_LIMIT_S} sh -c 'while :; do :; done'"
            " >/dev/null 2>&1 & echo $!; done",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pids = [int(pid) for pid in started.stdout.split()]
    try:
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # timeout passes it on to its busy loop


def dlaas_checks(tmp_path: Path) -> tuple[dict, object]:
    """Run tiny dlaas-scaling (1 and 2 workers), tabulate, summarise and check it; return its runs and checks."""
    config = load_config(REPO / "config" / "config.yaml", REPO / "tests" / "configs" / "tiny.yaml")
    module = figure_module("dlaas-scaling")
    points = module.points(config["figures"]["dlaas-scaling"], config["launcher"])
    records = {point.id: run_in_fresh_process(point, tmp_path / point.id) for point in points}
    table = tidy_table([tmp_path / point.id for point in points], max_foreign_share=MAX_FOREIGN_SHARE)
    summary = module.summarize(table)
    references = figure_references()["dlaas-scaling"]
    checks = check_figure("dlaas-scaling", summary, references, "smoke", config["checks"]["exclude"])
    return records, checks.set_index("check")


def run_in_fresh_process(point: Point, run_dir: Path) -> dict:
    """Run a point as the workflow's run rule does, in a process of its own: a run counts the CPU of the children
    its process has waited for as its own, and a long-lived pytest process may reap earlier tests' children while
    this one measures."""
    command = [sys.executable, "-m", "ddlrepro", "run-point", "--point", point.to_json(), "--run-dir", str(run_dir)]
    settings = json.dumps({"launcher": {"timeout_s": 300}})
    subprocess.run([*command, "--config-json", settings], check=True, capture_output=True, timeout=360)
    return json.loads((run_dir / "result.json").read_text())


@pytest.mark.serial  # a CPU hog on every core
@pytest.mark.slow
def test_runs_beside_a_cpu_hog_are_disturbed_and_quiet_runs_are_judged(tmp_path: Path) -> None:
    with cpu_hogs():
        busy, checks = dlaas_checks(tmp_path / "busy")
    for record in busy.values():
        assert record["host_load"]["own_cpu"] == "this process and its descendants"
        assert record["host_load"]["foreign_share"] > MAX_FOREIGN_SHARE, record["host_load"]
    assert set(checks.loc[TIMED_CHECKS, "status"]) == {"disturbed"}

    quiet, checks = quiet_checks(tmp_path / "quiet")
    for point_id, record in quiet.items():
        assert busy[point_id]["host_load"]["foreign_share"] > record["host_load"]["foreign_share"], point_id


def quiet_checks(folder: Path) -> tuple[dict, object]:
    """The same runs without a hog: judged when their recorded load is under the threshold (one replicate: no
    interval, so inconclusive with n = 1), and `disturbed` exactly when above it (whatever else runs on this machine
    meanwhile)."""
    records, checks = dlaas_checks(folder)
    assert all(
        record["host_load"]["speed_before"] > 0 < record["host_load"]["speed_after"] for record in records.values()
    )
    loaded = any(host_load_columns(record, MAX_FOREIGN_SHARE)["disturbed"] for record in records.values())
    statuses, loads = set(checks.loc[TIMED_CHECKS, "status"]), [r["host_load"] for r in records.values()]
    if loaded:
        assert statuses == {"disturbed"}, loads
    else:
        assert statuses == {"inconclusive"} and set(checks.loc[TIMED_CHECKS, "n"]) == {1}, loads
    return records, checks


def test_slurm_runs_count_the_job_cgroup_as_their_own_cpu(tmp_path: Path) -> None:
    """cgroup v2 and v1 layouts of slurmd (job_<id>/step_batch/...): the job's CPU, every step included."""
    from ddlrepro.host.launchers.slurm import own_cpu_counter

    job = tmp_path / "v2" / "system.slice" / "slurmstepd.scope" / "job_42"
    job.mkdir(parents=True)
    (job / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    proc = tmp_path / "cgroup-v2"
    proc.write_text("0::/system.slice/slurmstepd.scope/job_42/step_batch/user/task_0\n")
    source, counter = own_cpu_counter(proc, tmp_path / "v2")
    assert source == "the Slurm job's cgroup on this node" and counter() == 2.5

    v1 = tmp_path / "v1" / "cpu,cpuacct" / "slurm" / "uid_0" / "job_7"
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("1500000000\n")
    proc.write_text("5:memory:/slurm/uid_0/job_7/step_0\n4:cpu,cpuacct:/slurm/uid_0/job_7/step_0/task_1\n")
    assert own_cpu_counter(proc, tmp_path / "v1")[1]() == 1.5

    proc.write_text("0::/user.slice/user-0.slice/session-3.scope\n")
    assert own_cpu_counter(proc, tmp_path / "v2") == ("unknown: this process is in no Slurm job cgroup", None)


def test_runs_whose_own_cpu_cannot_be_counted_say_so(tmp_path: Path) -> None:
    from ddlrepro.host.hostload import process_tree_cpu
    from ddlrepro.host.launchers import configured_launcher
    from ddlrepro.host.run import measured_host_load

    local = configured_launcher()
    point = tiny_point()
    assert local.own_cpu_counter(local.render(point, tmp_path)) == (
        "this process and its descendants",
        process_tree_cpu,
    )
    podman = configured_launcher({"images": {"build": "podman"}}, {"digest": "sha256:abc"})
    source, counter = podman.own_cpu_counter(podman.render(point, tmp_path))
    assert counter is None and source.startswith("unknown: the ranks run in containers")
    pods = configured_launcher({"launcher": {"name": "kubernetes", "kubernetes": {"image": "ddlrepro:cpu"}}})
    source, counter = pods.own_cpu_counter(pods.render(point, tmp_path))
    assert counter is None and "pods" in source
    assert measured_host_load(None, source, []) == {"own_cpu": source, "foreign_share": None, "steal_share": None}


def test_slurm_runs_in_apptainer_still_count_the_job_cgroup(tmp_path: Path) -> None:
    from ddlrepro.host.launchers import configured_launcher

    slurm = configured_launcher({"launcher": {"name": "slurm", "slurm": {"container": "/images/ddlrepro-cpu.sif"}}})
    source, _ = slurm.own_cpu_counter(slurm.render(tiny_point(), tmp_path))
    assert "Slurm job" in source  # outside an allocation: "unknown: ... no Slurm job cgroup"


def test_a_run_whose_machine_speed_moved_is_disturbed_where_the_guard_is_set() -> None:
    quiet = {"foreign_share": 0.01, "steal_share": 0.0, "speed_before": 50.0}
    steady = host_load_columns({"host_load": quiet | {"speed_after": 48.0}}, MAX_FOREIGN_SHARE, GUARD)
    assert not steady["disturbed"] and steady["machine_speed"] == 49.0 and steady["speed_drift"] == pytest.approx(-0.04)
    for after in (40.0, 60.0):  # slower or faster by 20 %: the run's timing is not the machine's steady speed
        moved = {"host_load": quiet | {"speed_after": after}}
        assert host_load_columns(moved, MAX_FOREIGN_SHARE, GUARD)["disturbed"]
        assert not host_load_columns(moved, MAX_FOREIGN_SHARE)["disturbed"]  # the default: recorded, not judged
        assert host_load_columns(moved, MAX_FOREIGN_SHARE)["speed_drift"] == pytest.approx(after / 50.0 - 1)
    unknown = host_load_columns({"host_load": {"foreign_share": 0.01, "steal_share": 0.0}}, MAX_FOREIGN_SHARE, GUARD)
    assert not unknown["disturbed"] and unknown["speed_drift"] != unknown["speed_drift"]  # NaN: not measured


@pytest.mark.serial  # compares loop speeds
def test_the_machine_speed_index_sees_a_slower_machine() -> None:
    """A host that gives a process less CPU than it appears to (emulated: a cgroup quota of 0.2 of a core, as a busy
    neighbour VM without steal accounting would) reads far slower than the machine unthrottled: about 0.3x in the
    same speed state, and below 0.6x even against the slower of this VM's two speed levels (about 12 and 18
    million iterations/s; a quota of 0.3 read 0.65x across them). Unthrottled: the best of readings before and
    after, which catch the faster level when it is there."""
    free = [index_in_process(None)]
    with CpuQuotas(f"speed-{os.getpid()}", {0: 0.2}) as quotas:
        if not quotas.applied:
            pytest.skip(f"cannot create cgroups here: {quotas.status}")
        slowed = index_in_process(quotas)
    free.append(index_in_process(None))
    assert slowed < max(free) * 0.6, (slowed, free)


def index_in_process(quotas: CpuQuotas | None) -> float:
    """machine_speed() in a fresh process (in rank 0's group of `quotas`, if given): 3 rounds of ~60 ms each."""
    script = "from ddlrepro.host.hostload import machine_speed\nprint(machine_speed(iterations=1_000_000))"
    return float(output_of_throttled(script, quotas))


@pytest.mark.serial  # a busy process on one core
@pytest.mark.parametrize("known_by", ["name", "module"])
def test_processes_started_elsewhere_count_as_own_cpu_when_watched(tmp_path: Path, known_by: str) -> None:
    """A daemonised busy process (as Slurm's steps and the testbed's helpers are: nobody here waits for it) is
    foreign load to a plain meter and the run's own to one that watches it by its name or by the module it runs
    (hostload.WatchedProcesses, benchmarks/link_bandwidth.py)."""
    loop = "import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end:\n    pass"
    if known_by == "name":
        burn = tmp_path / "ddlrepro-burn"  # the process's name is the name it is started by
        burn.symlink_to(Path(sys.executable).resolve())
        script = f"setsid {burn} -c {shlex.quote(loop)} &"
        watched = WatchedProcesses({"ddlrepro-burn"}, period_s=0.05)
    else:
        (tmp_path / "ddlrepro_burn.py").write_text(loop)
        script = f"cd {tmp_path} && setsid {sys.executable} -m ddlrepro_burn &"
        watched = WatchedProcesses(set(), frozenset({"ddlrepro_burn"}), period_s=0.05)
    with watched, ForeignLoadMeter(lambda: watched()) as own, ForeignLoadMeter(lambda: 0.0) as plain:
        subprocess.run(["sh", "-c", script], check=True)  # returns at once: the burner is nobody's child here
        time.sleep(2.5)
    assert own.load is not None and plain.load is not None
    burned = own.load.own_s  # about 2 s of one core when the host is quiet
    assert burned > 0.8 and plain.load.foreign_s > burned * 0.9
    assert own.load.foreign_s < plain.load.foreign_s - burned * 0.9
