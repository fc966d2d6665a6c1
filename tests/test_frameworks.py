"""The throughput workload under each framework, in real 2-process runs through the local launcher: the same
protocol and records, and gradients really averaged (every rank ends with the same parameters although each
trained on its own batch). Horovod over MPI and the MPI all-reduce go through mpirun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import tiny_point

from ddlrepro.host.figures import kungfu_allreduce
from ddlrepro.host.launchers import local
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import OutputCollector, metric_records
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point

FRAMEWORK_POINTS = {
    "torch-STAR": {"framework": "torch", "strategy": "STAR"},
    "horovod-gloo": {"framework": "horovod", "horovod_controller": "gloo"},
    "horovod-mpi": {"framework": "horovod", "horovod_controller": "mpi"},
    "tensorflow": {"framework": "tensorflow"},
}


# TensorFlow's start-up alone takes ~10 s here: a slow case (make test-fast leaves it out).
FRAMEWORK_MARKS = {"tensorflow": pytest.mark.slow}


@pytest.mark.parametrize("name", [pytest.param(name, marks=FRAMEWORK_MARKS.get(name, ())) for name in FRAMEWORK_POINTS])
def test_framework_runs_the_protocol_on_two_processes(tmp_path: Path, name: str) -> None:
    if name == "horovod-mpi" and not shutil.which("mpirun"):
        pytest.fail("mpirun is missing: `make horovod` installs Open MPI (Debian) as root")
    params = FRAMEWORK_POINTS[name]
    record = run_point(tiny_point(workers=2, iterations=2, **params), tmp_path, local_launcher(300))
    assert record["status"] == "ok"
    records = metric_records(tmp_path)
    rates = [m for m in records if m["metric"] == "img_per_sec"]
    assert sorted((m["rank"], m["iteration"]) for m in rates) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(m["value"] > 0 for m in rates)
    sums = {m["rank"]: m["value"] for m in records if m["metric"] == "parameter_sum"}
    assert sums[0] == sums[1], "the ranks trained on different batches: equal parameters need averaged gradients"
    log = (tmp_path / "log.txt").read_text()
    result_line = next(line for line in log.splitlines() if "RESULT: " in line)
    settings = json.loads(result_line.split(" ", 5)[-1])
    assert settings["framework"] == params["framework"]
    assert settings["np"] == 2
    assert settings["strategy"] == params.get("strategy", "RING")
    if params["framework"] == "horovod":
        assert settings["controller"] == params["horovod_controller"]
        expected_mode = "mpirun" if params["horovod_controller"] == "mpi" else "horovod-gloo"
        assert json.loads((tmp_path / "jobspec.json").read_text())["mode"] == expected_mode


def test_horovod_ranks_get_horovodrun_environment(tmp_path: Path) -> None:
    job = local_launcher(60).render(tiny_point(workers=2, framework="horovod"), tmp_path).request
    port = job.horovod_port
    for rank, worker in enumerate(job.workers):
        assert worker.env["HOROVOD_RANK"] == str(rank)
        assert worker.env["HOROVOD_SIZE"] == "2"
        assert worker.env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(port)
        assert worker.env["HOROVOD_CONTROLLER"] == "gloo"


def test_tensorflow_ranks_share_one_cluster(tmp_path: Path) -> None:
    job = local_launcher(60).render(tiny_point(workers=2, framework="tensorflow"), tmp_path).request
    configs = [json.loads(worker.env["TF_CONFIG"]) for worker in job.workers]
    assert configs[0]["cluster"] == configs[1]["cluster"]
    assert len(set(configs[0]["cluster"]["worker"])) == 2
    assert [c["task"]["index"] for c in configs] == [0, 1]


def test_mpirun_lines_are_filed_under_their_rank(tmp_path: Path) -> None:
    with OutputCollector(tmp_path) as output:
        local._file_tagged_line(output, "stdout", '[1,1]<stdout>:DDLREPRO {"kind": "worker", "rank": 1}')
        local._file_tagged_line(output, "stdout", "[1,0]<stderr>:Traceback (most recent call last):")
        local._file_tagged_line(output, "stderr", "mpirun noticed that process rank 0 exited")
        assert set(output.workers) == {1}
        assert output.stderr_tail(0) == ["Traceback (most recent call last):"]
        assert output.stderr_tail(-1) == ["mpirun noticed that process rank 0 exited"]


def test_mpi_allreduce_runs_under_mpirun(tmp_path: Path) -> None:
    params = {"backend": "mpi", "strategy": "MPI_Allreduce", "min_bytes": 1024, "max_bytes": 8192, "warmup": 1}
    params |= {"repetitions": 2, "target_bytes": 8192, "max_ops": 4, "sample_interval_s": 1.0}
    record = run_point(Point("kungfu-allreduce", "allreduce", 2, 1, params), tmp_path, local_launcher(120))
    assert record["status"] == "ok"
    times = [m for m in metric_records(tmp_path) if m["metric"] == "allreduce_time_s"]
    assert sorted({m["size_bytes"] for m in times}) == [1024, 2048, 4096, 8192]
    assert {m["rank"] for m in times} == {0, 1}


def test_strategies_take_turns_in_one_run_and_each_ratio_to_ring_comes_from_it(tmp_path: Path) -> None:
    strategies = ["RING", "STAR", "CLIQUE"]
    params = {"backend": "gloo", "strategies": strategies, "min_bytes": 1024, "max_bytes": 2048, "warmup": 1}
    params |= {"repetitions": 3, "target_bytes": 4096, "max_ops": 2, "sample_interval_s": 1.0}
    record = run_point(Point("kungfu-allreduce", "allreduce", 2, 1, params), tmp_path / "run", local_launcher(120))
    assert record["status"] == "ok"
    times = [m for m in metric_records(tmp_path / "run") if m["metric"] == "allreduce_time_s" and m["rank"] == 0]
    turns = {(m["size_bytes"], m["iteration"]): [] for m in times}
    for m in times:  # in the order rank 0 timed them
        turns[(m["size_bytes"], m["iteration"])].append(m["setting"])
    rotated = [strategies[shift:] + strategies[:shift] for shift in range(3)]
    assert turns == {(size, repetition): rotated[repetition] for size in (1024, 2048) for repetition in range(3)}

    summary = kungfu_allreduce.summarize(tidy_table([tmp_path / "run"]))
    assert sorted(summary["strategy"]) == sorted(strategies * 2)
    assert summary.loc[summary["strategy"] == "RING", "vs_gloo_ring"].eq(1.0).all()
    assert summary["vs_gloo_ring"].gt(0).all()
