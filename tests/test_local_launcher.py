"""Real multi-process torch.distributed runs through the local launcher, and how they fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import tiny_point

from ddlrepro.host.launchers.base import JobSpec, RunFailed, WorkerSpec
from ddlrepro.host.launchers.local import LocalRequest
from ddlrepro.host.launchers.processes import private_temporary_folder
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import OutputCollector, metric_records
from ddlrepro.host.testing import local_launcher


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run") / "kungfu-fig9" / "point"
    # Ticks 0.05 s apart: the tiny run spans several, and CPU needs two (a baseline, then a whole interval).
    run_point(tiny_point(workers=2, iterations=3, sample_interval_s=0.05), run_dir, local_launcher(300))
    return run_dir


def test_run_folder_has_every_file(finished_run: Path) -> None:
    names = {path.name for path in finished_run.iterdir()}
    assert names == {"attempt.json", "jobspec.json", "log.txt", "metrics.jsonl", "provenance.json", "result.json"}


def test_result_follows_the_benchmark_protocol(finished_run: Path) -> None:
    result = json.loads((finished_run / "result.json").read_text())
    summary = result["summary"]
    assert result["status"] == "ok"
    assert summary["img_per_sec_per_worker"] > 0
    assert summary["total"] == pytest.approx(2 * summary["img_per_sec_per_worker"])
    metrics = metric_records(finished_run)
    rates = [m for m in metrics if m["metric"] == "img_per_sec"]
    assert sorted((m["rank"], m["iteration"]) for m in rates) == [(r, i) for r in (0, 1) for i in range(3)]
    rank0 = [m["value"] for m in rates if m["rank"] == 0]
    mean = sum(rank0) / len(rank0)
    assert summary["img_per_sec_per_worker"] == pytest.approx(mean)
    log = (finished_run / "log.txt").read_text()
    assert f"[rank 0] RESULT: {mean:.2f} +-" in log
    assert '"np": 2' in log


def test_every_rank_samples_its_resources(finished_run: Path) -> None:
    """Memory on every tick, CPU on every tick but the first (its baseline): one CPU sample fewer than memory."""
    metrics = metric_records(finished_run)
    for rank in (0, 1):
        sampled = Counter(m["metric"] for m in metrics if m["rank"] == rank and m["iteration"] is None)
        assert sampled["cpu_percent"] >= 1
        assert sampled["cpu_percent"] == sampled["rss_bytes"] - 1


def test_provenance_records_code_software_hardware(finished_run: Path) -> None:
    provenance = json.loads((finished_run / "provenance.json").read_text())
    assert set(provenance["git"]) == {"sha", "dirty"}
    assert provenance["packages"]["torch"].startswith("2.13.0")
    assert provenance["torch"]["backend"] == "gloo"
    assert provenance["launcher_host"]["cpu_count"] >= 1
    assert provenance["launcher_host"]["cpu_model"]
    assert len(provenance["hostnames"]) == 1
    assert [worker["rank"] for worker in provenance["workers"]] == [0, 1]
    assert all(worker["threads"] == 1 for worker in provenance["workers"])
    # every rank loaded its libraries uncollected, then froze them and collects again (ddlrepro.startup)
    assert all(worker["collector"]["enabled"] and worker["collector"]["frozen"] > 0 for worker in provenance["workers"])
    assert provenance["point"]["workers"] == 2
    assert provenance["jobspec"]["launcher"] == "local"


def test_jobspec_is_torchrun_compatible(finished_run: Path) -> None:
    spec = json.loads((finished_run / "jobspec.json").read_text())
    envs = [worker["env"] for worker in spec["workers"]]
    assert [env["RANK"] for env in envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"2"}
    assert {env["MASTER_ADDR"] for env in envs} == {"127.0.0.1"}
    assert {env["OMP_NUM_THREADS"] for env in envs} == {"1"}
    assert len({env["MASTER_PORT"] for env in envs}) == 1


def worker_pids(run_dir: Path) -> dict[int, int]:
    log = run_dir / "log.txt"
    pids = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        if '"kind": "worker"' in line:
            record = json.loads(line.split("DDLREPRO ", 1)[1])
            pids[record["rank"]] = record["pid"]
    return pids


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def start_run(point_json: str, run_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ddlrepro", "run-point", "--point", point_json, "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.serial  # a deadline of seconds
def test_killed_worker_fails_the_run_fast_and_cleanly(tmp_path: Path) -> None:
    point = tiny_point(workers=2, iterations=200, batch_size=4)
    run_dir = tmp_path / "run"
    launcher = start_run(point.to_json(), run_dir)
    pids = wait_for(lambda: len(worker_pids(run_dir)) == 2 and worker_pids(run_dir), 60, "both workers to start")
    wait_for(lambda: "img_per_sec" in (run_dir / "metrics.jsonl").read_text(), 60, "a first timed iteration")
    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.monotonic()
    _, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode != 0
    assert time.monotonic() - killed_at < 10
    assert "rank 1 was killed by SIGKILL" in stderr
    assert not (run_dir / "result.json").exists()
    assert (run_dir / "log.txt").read_text().count("[rank 1]") > 0
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    record = run_point(tiny_point(workers=2), run_dir, local_launcher(300), attempt=2)  # Snakemake's retry
    assert record["status"] == "ok"
    attempts = list((run_dir / "attempts").iterdir())
    assert len(attempts) == 1
    assert not (attempts[0] / "result.json").exists()
    assert (attempts[0] / "log.txt").exists()
    # The failed attempt, as its attempt.json recorded it, is listed before this one in result.json.
    assert [attempt["outcome"] for attempt in record["attempts"]] == ["failed", "ok"]
    assert "rank 1 was killed by SIGKILL" in record["attempts"][0]["error"]
    assert record["attempts"][0]["folder"] == f"attempts/{attempts[0].name}"
    assert record["attempts"][0]["wall_s"] > 0


def test_failing_worker_reports_rank_and_stderr_tail(tmp_path: Path) -> None:
    point = tiny_point(workers=2, model="no_such_model")
    with pytest.raises(RunFailed) as caught:
        run_point(point, tmp_path / "run", local_launcher(120))
    message = str(caught.value)
    assert caught.value.rank in (0, 1)
    assert f"rank {caught.value.rank} exited with code 1" in message
    assert "unknown model 'no_such_model'" in message
    assert not (tmp_path / "run" / "result.json").exists()


@pytest.mark.serial  # a deadline of seconds
@pytest.mark.slow
def test_timeout_stops_every_worker(tmp_path: Path) -> None:
    point = tiny_point(workers=2, iterations=10_000, batch_size=4)
    started = time.monotonic()
    with pytest.raises(RunFailed, match="timed out after 8 s"):
        run_point(point, tmp_path / "run", local_launcher(8))
    assert time.monotonic() - started < 20
    assert not (tmp_path / "run" / "result.json").exists()


def test_an_unreadable_record_is_named_and_the_rest_still_filed(tmp_path: Path) -> None:
    with OutputCollector(tmp_path) as output:
        output.add_line(0, "stdout", 'DDLREPRO {"kind": "metric", "time":')  # a line cut in two on its way
        output.add_line(0, "stdout", "DDLREPRO [1, 2]")
        output.add_line(0, "stdout", 'DDLREPRO {"kind": "result", "rank": 0}')
        assert output.result == {"rank": 0}
        tail = output.stderr_tail(0)
        assert tail[0].startswith("unreadable record (Expecting value)")
        assert tail[1] == "unreadable record (not a record): [1, 2]"


def test_a_failed_attempt_of_other_code_ends_the_series(tmp_path: Path) -> None:
    """A retry resumes only failed attempts of this code: an earlier invocation's, of another commit, is history."""
    from ddlrepro.host.provenance import git_state
    from ddlrepro.host.run import earlier_attempts

    for name, code in (("20260101T000000", {"sha": "0" * 40, "dirty": False}), ("20260101T000100", git_state())):
        folder = tmp_path / "attempts" / name
        folder.mkdir(parents=True)
        (folder / "attempt.json").write_text(json.dumps({"attempt": 1, "outcome": "failed", "code": code}))
    assert [attempt["folder"] for attempt in earlier_attempts(tmp_path, git_state(), 2)] == ["attempts/20260101T000100"]


@pytest.mark.parametrize(
    ("leftover", "attempt"),
    [
        ({"attempt": 1, "outcome": "ok"}, 1),  # a forced rerun: Snakemake removed result.json, run.py set it aside
        ({"attempt": 1, "outcome": "ok"}, 2),  # ... and that rerun's own first attempt died before its attempt.json
        ({"attempt": 1, "outcome": "failed"}, 1),  # a killed workflow's attempt, run again by a new invocation
        ({"attempt": 2, "outcome": "failed"}, 2),  # numbered as no attempt of this series before attempt 2
    ],
)
def test_leftovers_of_earlier_runs_are_no_earlier_attempt(tmp_path: Path, leftover: dict, attempt: int) -> None:
    """The attempt number is Snakemake's; what earlier runs left under attempts/ never makes a run a retry (a
    forced rerun once counted a completed run as a failed attempt, so the faults injected on attempt 1 never
    happened)."""
    from ddlrepro.host.provenance import git_state
    from ddlrepro.host.run import earlier_attempts

    folder = tmp_path / "attempts" / "20260101T000000"
    folder.mkdir(parents=True)
    (folder / "attempt.json").write_text(json.dumps(leftover | {"code": git_state()}))
    assert earlier_attempts(tmp_path, git_state(), attempt) == []


def test_only_a_ps_point_with_checkpoints_gets_resume_inputs(tmp_path: Path) -> None:
    """The ps workload resumes from the last failed attempt's checkpoint/; torchrun's points, which also have a
    `checkpoint_interval`, restart from their own and get nothing."""
    from ddlrepro.host.run import resume_inputs
    from ddlrepro.points import Point
    from ddlrepro.records import CHECKPOINT_DIR

    (tmp_path / "attempts" / "1" / CHECKPOINT_DIR).mkdir(parents=True)
    earlier = [{"attempt": 1, "folder": "attempts/1"}]
    ps = Point("wikimedia-ps", "ps", 4, 1, {"checkpoint_interval": 3})
    checkpoint = str(tmp_path / "attempts" / "1" / CHECKPOINT_DIR)
    assert resume_inputs(ps, tmp_path, earlier) == {"attempt": "2", "resume_checkpoint": checkpoint}
    assert resume_inputs(ps, tmp_path, []) == {"attempt": "1"}
    torchrun = Point("biggan-elasticity", "elastic", 2, 1, {"checkpoint_interval": 1, "runtime": "torchrun"})
    assert resume_inputs(torchrun, tmp_path, earlier) == {}
    assert resume_inputs(Point("wikimedia-ps", "ps", 4, 1, {}), tmp_path, earlier) == {}


def test_workers_temporary_files_go_with_the_run(tmp_path: Path) -> None:
    """Ranks get a TMPDIR of their own, removed with what they left there (torchrun and TensorFlow leave files)."""
    leave_a_folder = "import sys, tempfile; print('LEFT', tempfile.mkdtemp(prefix='left-'))"
    env = {"DDLREPRO_RUN_DIR": str(tmp_path / "run")}
    workers = [WorkerSpec(rank, [sys.executable, "-c", leave_a_folder], env) for rank in range(2)]
    request = LocalRequest(mode="ranks", ranks=2, workers=workers, master_addr="127.0.0.1", master_port=0)
    with OutputCollector(tmp_path) as output:
        local_launcher(60).execute(JobSpec("local", 60, request), output)
    lines = (tmp_path / "log.txt").read_text().splitlines()
    left = [Path(line.split("LEFT ")[1]) for line in lines if "LEFT " in line]
    assert len(left) == 2
    assert all(folder.parent.name.startswith("ddlrepro-run-") for folder in left)
    assert not any(folder.parent.exists() for folder in left)
    assert os.environ.get("TMPDIR") != str(left[0].parent)


def test_runs_that_end_out_of_order_never_leave_tmpdir_naming_a_removed_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs executed at once in one process (threads, as some tests do): the first to start ends first, and
    TMPDIR then names the other's live folder, then what it was before either."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    first, second = private_temporary_folder(), private_temporary_folder()
    first_folder = first.__enter__()
    second_folder = second.__enter__()
    assert os.environ["TMPDIR"] == str(second_folder)
    first.__exit__(None, None, None)
    assert not first_folder.exists() and os.environ["TMPDIR"] == str(second_folder) and second_folder.is_dir()
    second.__exit__(None, None, None)
    assert not second_folder.exists() and os.environ["TMPDIR"] == str(tmp_path)
