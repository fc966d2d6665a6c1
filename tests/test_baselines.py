"""The baselines and measurements the benchmarks and figures compare against: memory as PSS, torchrun's tuned
shrink, Horovod's own benchmark with our model (a benchmark's verdict on a busy host: test_benchmarks.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch

from ddlrepro.host.figures import kungfu_fig7
from ddlrepro.host.figures.step_timing import peak_memory
from ddlrepro.host.launchers import torchrun
from ddlrepro.host.run import run_point
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher
from ddlrepro.points import Point
from ddlrepro.rank.runtime import RankContext, ResourceSampler

REPO = Path(__file__).resolve().parents[1]
SHARED_MIB = 64


def sample_in_child(ctx: RankContext, results: multiprocessing.Queue) -> None:
    results.put(ResourceSampler(ctx, 1.0).sample())


def test_summed_pss_counts_pages_two_processes_share_once() -> None:
    """A forked child shares its parent's 64 MiB: their RSS counts it twice, their PSS once."""
    shared = bytearray(b"x" * (SHARED_MIB * 2**20))
    ctx = RankContext(0, 1, 0, 1, 1, "gloo", torch.device("cpu"))
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=sample_in_child, args=(ctx, results))
    child.start()
    in_child = results.get(timeout=60)
    in_parent = ResourceSampler(ctx, 1.0).sample()
    child.join()
    assert shared
    rss_sum = (in_child["rss_bytes"] + in_parent["rss_bytes"]) / 2**20
    pss_sum = (in_child["pss_bytes"] + in_parent["pss_bytes"]) / 2**20
    assert rss_sum - pss_sum > 0.8 * SHARED_MIB, (rss_sum, pss_sum)


def test_sampler_denied_pss_keeps_rss_and_records_no_pss(monkeypatch: pytest.MonkeyPatch) -> None:
    """A locked-down container may deny reading smaps (PSS): the sample keeps RSS and leaves PSS out."""

    def denied(process: psutil.Process) -> None:
        raise psutil.AccessDenied(process.pid)

    ctx = RankContext(0, 1, 0, 1, 1, "gloo", torch.device("cpu"))
    assert {"rss_bytes", "pss_bytes"} <= set(ResourceSampler(ctx, 1.0).sample())
    monkeypatch.setattr(psutil.Process, "memory_full_info", denied)
    sample = ResourceSampler(ctx, 1.0).sample()
    assert sample["rss_bytes"] > 0
    assert "pss_bytes" not in sample


def test_peak_memory_of_a_run_without_pss_is_nan_beside_runs_with_it() -> None:
    """A run whose sampler was denied PSS gets no total PSS, never a total of 0."""
    table = pd.DataFrame(
        memory_rows("pss_bytes", {("packed", 0): [10]})
        + memory_rows("rss_bytes", {("packed", 0): [100], ("ests", 0): [120]})
    )
    memory = peak_memory(table).set_index("point_id")
    assert memory.loc["packed", "total_pss_mib"] == 10
    assert pd.isna(memory.loc["ests", "total_pss_mib"])


def memory_rows(metric: str, values: dict[tuple[str, int], list[float]]) -> list[dict]:
    return [
        {"point_id": point, "rank": rank, "metric": metric, "value": value * 2**20}
        for (point, rank), samples in values.items()
        for value in samples
    ]


def test_peak_memory_sums_each_process_peak_pss_with_rss_beside() -> None:
    table = pd.DataFrame(
        memory_rows("pss_bytes", {("packed", 0): [10, 30], ("packed", 1): [20, 5], ("ests", 0): [40]})
        + memory_rows("rss_bytes", {("packed", 0): [100], ("packed", 1): [90, 110], ("ests", 0): [120]})
    )
    memory = peak_memory(table).set_index("point_id")
    assert memory.loc["packed"].to_dict() == {"total_pss_mib": 50, "total_rss_mib": 210}
    assert memory.loc["ests"].to_dict() == {"total_pss_mib": 40, "total_rss_mib": 120}


def test_peak_memory_of_runs_without_pss_names_the_missing_metric() -> None:
    table = pd.DataFrame(memory_rows("rss_bytes", {("packed", 0): [100]}))
    with pytest.raises(ValueError, match="pss_bytes"):
        peak_memory(table)


FIG7_SECTION = {
    "model": "resnet20",
    "image_size": 16,
    "batch_size": 4,
    "dataset_size": 64,
    "initial_workers": 1,
    "schedule": "3:2,6:1,9:0",
    "modes": ["torchrun", "torchrun-tuned"],
    "standby": 1,
    "collective_timeout_s": 30,
}


def fig7_point(mode: str) -> Point:
    (point,) = kungfu_fig7.points({**FIG7_SECTION, "modes": [mode]}, {"threads_per_worker": 1})
    return point


def test_the_tuned_torchrun_point_asks_for_a_short_keep_alive_and_the_default_for_torchs() -> None:
    tuned = torchrun.request(fig7_point("torchrun-tuned"), Path("run"))
    default = torchrun.request(fig7_point("torchrun"), Path("run"))
    assert tuned.rdzv_conf == "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
    assert default.rdzv_conf == "last_call_timeout=1"


def test_an_unknown_keep_alive_is_named() -> None:
    point = fig7_point("torchrun-tuned")
    broken = Point(point.figure, point.workload, point.workers, 1, {**point.params, "torchrun_keep_alive": "fast"})
    with pytest.raises(ValueError, match="torchrun_keep_alive: 'fast'"):
        torchrun.request(broken, Path("run"))


def test_speedups_are_against_the_faster_torchrun_for_each_kind_of_event() -> None:
    wide = pd.DataFrame(
        [
            {"mode": "torchrun", "step": 3, "kind": "grow", "latency": 4.0, "to_sync": 4.0},
            {"mode": "torchrun", "step": 6, "kind": "shrink", "latency": 20.0, "to_sync": 20.0},
            {"mode": "torchrun-tuned", "step": 3, "kind": "grow", "latency": 5.0, "to_sync": 5.0},
            {"mode": "torchrun-tuned", "step": 6, "kind": "shrink", "latency": 8.0, "to_sync": 8.0},
            {"mode": "inplace-cold", "step": 3, "kind": "grow", "latency": 2.0, "to_sync": 2.0},
            {"mode": "inplace-cold", "step": 6, "kind": "shrink", "latency": 0.02, "to_sync": 0.02},
        ]
    )
    summary = kungfu_fig7.latency_summary(wide).set_index(["mode", "kind"])
    assert summary.loc[("inplace-cold", "grow"), "speedup_vs_torchrun"] == pytest.approx(2.0)
    assert summary.loc[("inplace-cold", "grow"), "torchrun_baseline"] == "torchrun"
    assert summary.loc[("inplace-cold", "shrink"), "speedup_vs_torchrun"] == pytest.approx(400.0)
    assert summary.loc[("inplace-cold", "shrink"), "torchrun_baseline"] == "torchrun-tuned"


@pytest.mark.serial  # a deadline of seconds
@pytest.mark.slow
def test_tuned_torchrun_restarts_a_shrunk_job_before_the_default_keep_alive_could(tmp_path: Path) -> None:
    """torch's default notices a departed agent after 5 s x 3 heartbeats; tuned, the restart is well under that."""
    run_point(fig7_point("torchrun-tuned"), tmp_path / "run", local_launcher(300))
    events = kungfu_fig7.events(tidy_table([tmp_path / "run"]))
    (shrink,) = events.loc[events["kind"] == "shrink", "restart"]
    assert shrink < 10.0


SHIM_CHECK = """
import torch
from torchvision import models
from ddlrepro.rank.models import build_model

torch.manual_seed(0)
shimmed = getattr(models, "resnet20")(norm_layer=object)
torch.manual_seed(0)
own = build_model("resnet20")
images = torch.randn(2, 3, 224, 224)
logits = shimmed(images)
assert logits.shape == (2, 1000), logits.shape
assert torch.equal(logits[:, :10], own(images[..., :16, :16])), "not the model on the crop"
assert not logits[:, 10:].any()
assert sum(p.numel() for p in shimmed.parameters()) == sum(p.numel() for p in own.parameters())
try:
    models.resnet18
except AttributeError as error:
    print(error)
"""


def test_horovods_benchmark_gets_our_model_through_the_torchvision_shim() -> None:
    """What Horovod's script does with torchvision: `getattr(models, name)(norm_layer=...)` on 224 px images with
    labels in [0, 1000): our model on the crop of the point's size, logits padded, our parameters only."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks" / "horovod_shim"), str(REPO / "src")]),
        "DDLREPRO_SHIM_IMAGE_SIZE": "16",
    }
    done = subprocess.run([sys.executable, "-c", SHIM_CHECK], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ddlrepro has no model 'resnet18'" in done.stdout
