"""GPUs: which backend and device each rank takes (everywhere, the GPU count stood in for), and the CUDA paths for
real where this machine has a GPU: NCCL training, NVML sampling the GPU the rank uses, the GAN on a GPU. CI has no
GPU: the tests marked `cuda` are skipped there, saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import REPO, tiny_point

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import biggan_profiles
from ddlrepro.host.run import run_point, unmet_requirement
from ddlrepro.host.rundir import metric_records
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher
from ddlrepro.rank import runtime
from ddlrepro.rank.runtime import GpuProbe, RankContext

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU); CI has none")
GIB = 2**30


def context(monkeypatch: pytest.MonkeyPatch, gpus: int, local_rank: int, local_ranks: int, **options) -> RankContext:
    """The context a rank would take on a host with `gpus` GPUs (the count stood in for) and `local_ranks` ranks."""
    monkeypatch.setattr(runtime, "cuda_device_count", lambda: gpus)
    for name, value in {"RANK": local_rank, "WORLD_SIZE": local_ranks, "LOCAL_RANK": local_rank}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_ranks))
    return RankContext.from_environment(1, **options)


@pytest.mark.parametrize(
    ("gpus", "local_rank", "local_ranks", "options", "expected"),
    [
        (0, 1, 2, {}, ("gloo", "cpu")),
        (2, 1, 2, {}, ("nccl", "cuda:1")),  # a GPU for each rank: NCCL, rank i on GPU i
        (1, 1, 2, {}, ("gloo", "cpu")),  # fewer GPUs than ranks: NCCL would put two ranks on one GPU
        (1, 1, 2, {"backend": "gloo", "device": "auto"}, ("gloo", "cuda:0")),  # gloo ranks may share a GPU
        (4, 3, 8, {"backend": "gloo", "device": "auto"}, ("gloo", "cuda:3")),
        (0, 0, 1, {"backend": "gloo", "device": "auto"}, ("gloo", "cpu")),
    ],
)
def test_each_rank_takes_a_backend_and_device_its_host_can_give(
    monkeypatch: pytest.MonkeyPatch, gpus: int, local_rank: int, local_ranks: int, options: dict, expected: tuple
) -> None:
    ctx = context(monkeypatch, gpus, local_rank, local_ranks, **options)
    assert (ctx.backend, str(ctx.device)) == expected


def test_nccl_without_a_gpu_of_its_own_fails_naming_the_rank_and_host(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match=r"NCCL needs a GPU per rank: local rank 1 of 2 on .+, which has 1 GPU"):
        context(monkeypatch, 1, 1, 2, backend="nccl")


def test_a_local_nccl_point_of_more_ranks_than_gpus_is_skipped_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime, "cuda_device_count", lambda: 1)
    point = tiny_point(workers=2, backend="nccl")
    expected = "skipped: needs a GPU per NCCL rank, 2 ranks on this host, which has 1 GPU(s)"
    assert unmet_requirement(point, "local") == expected
    assert unmet_requirement(point, "slurm") is None  # its nodes' GPUs are seen by its ranks, not here
    assert unmet_requirement(tiny_point(workers=1, backend="nccl"), "local") is None
    monkeypatch.setattr(runtime, "cuda_device_count", lambda: 0)
    assert unmet_requirement(point, "slurm") == "skipped: needs CUDA"


def finished(run_dir: Path) -> dict:
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok", (run_dir / "log.txt").read_text()[-3000:]
    return json.loads((run_dir / "provenance.json").read_text())


def assert_nvml_samples(metrics: list[dict], ranks: int) -> None:
    """Every rank sampled its GPU through NVML: utilisation in 0–100 %, and at every tick the device memory NVML
    sees at least what torch allocated (NVML counts the CUDA context and every process's memory, torch only this
    process's tensors)."""
    for rank in range(ranks):
        series = {
            metric: [row["value"] for row in metrics if row["rank"] == rank and row["metric"] == metric]
            for metric in ("gpu_utilization_percent", "gpu_memory_bytes", "torch_allocated_bytes")
        }
        assert series["gpu_utilization_percent"], f"rank {rank} has no NVML samples"
        assert all(0 <= value <= 100 for value in series["gpu_utilization_percent"])
        ticks = list(zip(series["gpu_memory_bytes"], series["torch_allocated_bytes"], strict=True))
        assert all(device >= allocated for device, allocated in ticks) and max(series["torch_allocated_bytes"]) > 0


@cuda
def test_a_nccl_point_trains_on_its_gpu_and_samples_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "kungfu-fig9" / "point"
    run_point(tiny_point(workers=1, backend="nccl", iterations=4), run_dir, local_launcher(300))
    (worker,) = finished(run_dir)["workers"]
    assert (worker["backend"], worker["device"]) == ("nccl", "cuda:0")
    assert worker["gpu"] == torch.cuda.get_device_name(0) and worker["cuda"] == torch.version.cuda
    assert_nvml_samples(metric_records(run_dir), 1)


@cuda
def test_nvml_samples_the_gpu_this_process_uses() -> None:
    """A GiB allocated on CUDA's device 0 shows in that probe's device memory: NVML found the same GPU."""
    probe = GpuProbe(torch.device("cuda", 0))
    torch.cuda.init()
    before = probe.sample()["gpu_memory_bytes"]
    block = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    grown = probe.sample()["gpu_memory_bytes"] - before
    del block
    assert GIB <= grown < 2 * GIB


@cuda
def test_ranks_beyond_the_gpus_train_on_the_cpu_with_auto_and_share_a_gpu_with_gloo(tmp_path: Path) -> None:
    ranks = torch.cuda.device_count() + 1
    on_cpu, shared = tmp_path / "kungfu-fig9" / "auto", tmp_path / "kungfu-fig9" / "gloo"
    run_point(tiny_point(workers=ranks), on_cpu, local_launcher(300))
    assert {(w["backend"], w["device"]) for w in finished(on_cpu)["workers"]} == {("gloo", "cpu")}
    run_point(tiny_point(workers=ranks, backend="gloo", device="auto"), shared, local_launcher(300))
    devices = [w["device"] for w in sorted(finished(shared)["workers"], key=lambda w: w["rank"])]
    assert devices == [f"cuda:{rank % (ranks - 1)}" for rank in range(ranks)]
    assert_nvml_samples(metric_records(shared), ranks)


@cuda
def test_a_nccl_point_of_more_ranks_than_gpus_is_skipped_with_the_reason(tmp_path: Path) -> None:
    ranks = torch.cuda.device_count() + 1
    run_dir = tmp_path / "kungfu-fig10" / "point"
    run_point(tiny_point(workers=ranks, figure="kungfu-fig10", backend="nccl"), run_dir, local_launcher(300))
    result = json.loads((run_dir / "result.json").read_text())
    reason = f"skipped: needs a GPU per NCCL rank, {ranks} ranks on this host, which has {ranks - 1} GPU(s)"
    assert (result["status"], result["reason"]) == ("skipped", reason)


@cuda
def test_the_gan_trains_on_the_gpu(tmp_path: Path) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    section = {
        **config["figures"][biggan_profiles.ID],
        "workers": 1,
        "environments": [{"name": "gpu", "kind": "local"}],
    }
    (point,) = biggan_profiles.points(section, {**config["launcher"], "backend": "nccl"})
    run_dir = tmp_path / biggan_profiles.ID / point.id
    run_point(point, run_dir, local_launcher(300))
    (worker,) = finished(run_dir)["workers"]
    assert (worker["backend"], worker["device"]) == ("nccl", "cuda:0")
    metrics = metric_records(run_dir)
    assert len([row for row in metrics if row["metric"] == "step_time_s"]) == point.params["steps"]
    assert_nvml_samples(metrics, 1)
    table = tidy_table([run_dir])
    summary = biggan_profiles.summarize(table)
    figure = biggan_profiles.plot(table, summary, "smoke", [])
    (row,) = summary.to_dict("records")
    assert 0 <= row["gpu_utilization_percent_mean"] <= 100 and 0 < row["gpu_memory_percent_mean"] <= 100
    assert "gpu_utilization_percent_mean_skipped" not in row
    assert [line.get_label() for line in figure.axes[2].lines] == ["gpu: utilisation", "gpu: memory"]
