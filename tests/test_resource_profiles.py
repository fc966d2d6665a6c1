"""The BigGAN resource-profile study: the allocation reader against a fake cgroup folder, the sampler's
percentages of node and allocation, equal GAN parameters on both ranks after DDP steps."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import torch

from ddlrepro.rank.allocation import allocation_limits
from ddlrepro.rank.runtime import RankContext, ResourceSampler, next_tick

GIB = 2**30


def fake_cgroup_v2(root: Path, cpu_max: str, memory_max: str) -> Path:
    """A cgroup v2 folder for a process in /job: `cpu.max` and `memory.max` as given; its /proc/self/cgroup."""
    (root / "job").mkdir(parents=True)
    (root / "job" / "cpu.max").write_text(cpu_max + "\n")
    (root / "job" / "memory.max").write_text(memory_max + "\n")
    proc = root / "proc-self-cgroup"
    proc.write_text("0::/job\n")
    return proc


def fake_cgroup_v1(root: Path, quota_us: int, limit_bytes: int) -> Path:
    (root / "cpu" / "job").mkdir(parents=True)
    (root / "cpu" / "job" / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (root / "cpu" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    (root / "memory" / "job").mkdir(parents=True)
    (root / "memory" / "job" / "memory.limit_in_bytes").write_text(f"{limit_bytes}\n")
    proc = root / "proc-self-cgroup"
    proc.write_text("4:memory:/job\n3:cpu,cpuacct:/job\n0::/\n")
    return proc


def test_cgroup_v1_and_v2_limits_and_slurms_fallback(tmp_path: Path) -> None:
    v2 = allocation_limits(fake_cgroup_v2(tmp_path / "v2", "50000 100000", str(GIB)), tmp_path / "v2", {})
    assert (v2.cpu_cores, v2.memory_bytes, v2.cpu_source) == (0.5, GIB, "cgroup")
    v1 = allocation_limits(fake_cgroup_v1(tmp_path / "v1", 150000, 2 * GIB), tmp_path / "v1", {})
    assert (v1.cpu_cores, v1.memory_bytes) == (1.5, 2 * GIB)
    unlimited = fake_cgroup_v2(tmp_path / "none", "max 100000", "max")
    slurm = allocation_limits(unlimited, tmp_path / "none", {"SLURM_CPUS_ON_NODE": "4", "SLURM_MEM_PER_NODE": "512"})
    assert (slurm.cpu_cores, slurm.memory_bytes, slurm.memory_source) == (4.0, 512 * 2**20, "SLURM_MEM_PER_NODE")
    assert allocation_limits(unlimited, tmp_path / "none", {}).cpu_cores is None


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_50_percent_quota_doubles_the_share_of_allocation(tmp_path: Path) -> None:
    """One busy thread for 0.4 s: its CPU is ~N× its share of an N-core node, 2× its share of half a core."""
    limits = allocation_limits(fake_cgroup_v2(tmp_path, "50000 100000", str(4 * GIB)), tmp_path, {})
    ctx = RankContext(0, 1, 0, 1, 1, "gloo", torch.device("cpu"))
    sampler = ResourceSampler(ctx, 1.0, limits)
    sampler.process.cpu_percent(None)
    busy(0.4)
    sample = sampler.sample()
    cores = sample["cpu_percent"] / 100
    assert 0.3 < cores <= 1.05
    assert sample["cpu_percent_of_allocation"] == pytest.approx(100 * cores / 0.5)
    assert sample["cpu_percent_of_node"] == pytest.approx(100 * cores / psutil.cpu_count())
    assert sample["memory_percent_of_allocation"] == pytest.approx(100 * sample["rss_bytes"] / (4 * GIB))
    assert sample["memory_percent_of_node"] == pytest.approx(100 * sample["rss_bytes"] / psutil.virtual_memory().total)
    assert 0 < sample["node_cpu_percent"] <= 100 and 0 < sample["node_memory_percent"] < 100
    assert not any(name.startswith("gpu") for name in sample)  # CPU: no GPU samples at all


def test_samples_fall_on_shared_wall_clock_ticks() -> None:
    assert next_tick(100.3, 0.5) == pytest.approx(100.5)
    assert next_tick(100.5, 0.5) == pytest.approx(101.0)
