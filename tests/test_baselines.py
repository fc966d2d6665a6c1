"""The baselines and measurements the benchmarks and figures compare against: memory as PSS, a benchmark's verdict
on a busy host, torchrun's tuned shrink, Horovod's own benchmark with our model."""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from ddlrepro.figures.easyscale_overheads import peak_memory
from ddlrepro.hostload import HostLoad
from ddlrepro.workloads.runtime import RankContext, ResourceSampler

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import judged, verdict  # noqa: E402

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


def load(foreign_s: float, steal_s: float = 0.0) -> HostLoad:
    """A 10 s interval on 2 CPUs (20 CPU-seconds) in which the run itself used 5."""
    return HostLoad(wall_s=10.0, cpus=2, host_busy_s=5.0 + foreign_s, own_s=5.0, steal_s=steal_s)


@pytest.mark.parametrize(
    ("foreign_s", "steal_s", "met", "expected"),
    [
        (0.0, 0.0, True, "met"),
        (1.0, 0.0, False, "missed"),
        (2.5, 0.0, True, "disturbed"),
        (1.0, 1.5, True, "disturbed"),
        (9.0, 0.0, False, "disturbed"),
    ],
)
def test_a_benchmark_on_a_busy_host_is_disturbed_not_met_or_missed(
    foreign_s: float, steal_s: float, met: bool, expected: str
) -> None:
    assert verdict(met, load(foreign_s, steal_s)) == expected


def test_a_judged_figure_shows_the_load_beside_it() -> None:
    line = judged("fidelity 0.990", True, ">= 0.98", load(4.0, 0.2))
    assert line == "fidelity 0.990  (target >= 0.98): disturbed  [foreign load 20.0 % (steal 1.0 %)]"


def test_memory_is_judged_whatever_the_load() -> None:
    assert verdict(False, load(9.0), timed=False) == "missed"
