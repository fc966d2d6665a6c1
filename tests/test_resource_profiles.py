"""The BigGAN resource-profile study: the allocation reader against a fake cgroup folder, the sampler's
percentages of node and allocation, equal GAN parameters on both ranks after DDP steps, bad environments refused,
`snakemake biggan_profiles` end to end (podman installed the project's way as root; the container environments
skipped with the reason otherwise), the neighbour's CPU seen on the node, and `compare` across results folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest
import torch
import yaml
from conftest import REPO, copy_workflow, snakemake

from ddlrepro.host.checks import figure_references
from ddlrepro.host.compare import compare_environments, merged_table
from ddlrepro.host.config import ConfigError, load_config, validate_config
from ddlrepro.host.environments import engine_unavailable_reason, slurm_unreachable_reason
from ddlrepro.host.figures import figure_points
from ddlrepro.rank.allocation import allocation_limits
from ddlrepro.rank.runtime import RankContext, ResourceSampler, next_tick
from ddlrepro.records import RECORD_PREFIX

GIB = 2**30
FIGURE = "biggan-profiles"
SAMPLE_INTERVAL_S = 0.1  # ≥ 3 ticks in 4 steps on a quiet host or CI's busy one (0.25 s once saw only 2)


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
    assert 0 < cores <= 1.05  # how busy depends on the host's load; the ratios below do not
    assert sample["cpu_percent_of_allocation"] == pytest.approx(100 * cores / 0.5)
    assert sample["cpu_percent_of_node"] == pytest.approx(100 * cores / psutil.cpu_count())
    assert sample["memory_percent_of_allocation"] == pytest.approx(100 * sample["rss_bytes"] / (4 * GIB))
    assert sample["memory_percent_of_node"] == pytest.approx(100 * sample["rss_bytes"] / psutil.virtual_memory().total)
    assert 0 < sample["node_cpu_percent"] <= 100 and 0 < sample["node_memory_percent"] < 100
    assert not any(name.startswith("gpu") for name in sample)  # CPU: no GPU samples at all


@pytest.mark.parametrize(
    ("neighbour", "busy_s", "shared"),
    [(None, 10.5, False), ({"cpus": 2}, 10.5, True), (None, 14.0, True), (None, None, None), ({"cpus": 2}, None, True)],
)
def test_provenance_says_whether_the_node_was_shared(
    neighbour: dict[str, Any] | None, busy_s: float | None, shared: bool | None
) -> None:
    """Shared: a neighbour declared beside the run, or foreign processes above the threshold (here 0.5 or 4.0 of
    20 CPU seconds, against 0.1); unknown (None) with no neighbour and nothing measured."""
    from ddlrepro.host.environments import node_sharing
    from ddlrepro.host.hostload import HostLoad
    from ddlrepro.points import Point

    point = Point(
        "biggan-profiles", "gan", 2, 1, {"environment": "x", "environment_kind": "container", "neighbour": neighbour}
    )
    load = None if busy_s is None else HostLoad(wall_s=10.0, cpus=2, host_busy_s=busy_s, own_s=10.0, steal_s=0.0)
    node = node_sharing(point, load)
    assert node["shared"] is shared and node["neighbour"] is bool(neighbour)
    expected = None if busy_s is None else pytest.approx((busy_s - 10.0) / 20.0)
    assert node["foreign_cpu_share"] == expected


def test_samples_fall_on_shared_wall_clock_ticks() -> None:
    assert next_tick(100.3, 0.5) == pytest.approx(100.5)
    assert next_tick(100.5, 0.5) == pytest.approx(101.0)


@pytest.mark.serial  # wake-ups within 80 ms of a tick: a busy parallel pass delays them more
def test_every_cpu_sample_covers_one_whole_interval(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """The CPU baseline is read on a tick, not when the sampler starts: no CPU sample covers a part of an
    interval. Memory is sampled on that first tick already."""
    readings: list[float] = []
    read_cpu = psutil.Process.cpu_percent

    def recorded(process: psutil.Process, interval: float | None = None) -> float:
        readings.append(time.time())
        return read_cpu(process, interval)

    monkeypatch.setattr(psutil.Process, "cpu_percent", recorded)
    interval_s = 0.2
    time.sleep(next_tick(time.time(), interval_s) - time.time() + interval_s / 2)  # start mid-interval
    with ResourceSampler(RankContext(0, 1, 0, 1, 1, "gloo", torch.device("cpu")), interval_s):
        time.sleep(5.5 * interval_s)
    samples = [json.loads(line.removeprefix(RECORD_PREFIX)) for line in capsys.readouterr().out.splitlines()]
    cpu = [sample for sample in samples if sample.get("metric") == "cpu_percent"]
    memory = [sample for sample in samples if sample.get("metric") == "rss_bytes"]
    assert len(readings) == len(cpu) + 1 >= 3  # the baseline, then one reading per sample
    assert len(memory) == len(cpu) + 1  # a level is sampled on the first tick too
    # Each read within a wake-up delay after a tick (the old baseline, at start, read half an interval after one).
    offsets = [(reading / interval_s + 0.5) % 1 - 0.5 for reading in readings]
    assert all(-0.05 < offset < 0.4 for offset in offsets), offsets


def environments(*names: str) -> list[dict[str, Any]]:
    container = {"cpus": 0.75, "memory": "2g"}  # below a core per rank: the neighbour finds CPU to take
    known = {
        "hpc": {"name": "hpc", "kind": "slurm"},
        "local": {"name": "local", "kind": "local"},
        "container": {"name": "container", "kind": "container", "container": container},
        "container+neighbour": {
            "name": "container+neighbour",
            "kind": "container",
            "container": container,
            "neighbour": {"cpus": 2},
        },
    }
    return [known[name] for name in names]


@pytest.mark.parametrize(
    ("listed", "message"),
    [
        ([{"name": "a", "kind": "local"}, {"name": "a", "kind": "local"}], r"environments\[1\]\.name: 'a' named twice"),
        ([{"name": " x", "kind": "local"}], r"environments\[0\]\.name: ' x' does not match"),
        (
            [{"name": "n", "kind": "slurm", "neighbour": {"cpus": 1}}],
            r"environments\[0\]\.neighbour: a neighbour runs in a container: kind 'slurm' has no container engine",
        ),
        ([{"name": "", "kind": "local"}], r"environments\[0\]\.name: '' should be non-empty"),
    ],
)
def test_bad_environments_are_config_errors(listed: list[dict[str, Any]], message: str) -> None:
    config = load_config(REPO / "config" / "config.yaml")
    config["figures"][FIGURE]["environments"] = listed
    with pytest.raises(ConfigError, match=message):
        figure_points(validate_config(config))


@pytest.fixture(scope="module")
def podman_reason() -> str | None:
    """Why podman containers cannot run here; as root, podman (and stress-ng) installed the project's way first."""
    if os.geteuid() != 0:
        return "podman with cgroup limits needs root"
    done = subprocess.run([str(REPO / "scripts" / "container-tools"), "install"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"scripts/container-tools install failed: {done.stderr[-300:]}"
    engine_unavailable_reason.cache_clear()  # asked before the install, it said "not installed"
    return engine_unavailable_reason()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, podman_reason: str | None) -> Path:
    """`snakemake biggan_profiles` on tiny settings: hpc (skipped) and the two container environments; without
    podman the local environment instead, so that a run happens anyway."""
    workdir = copy_workflow(tmp_path_factory.mktemp("biggan"))
    ran = ["container", "container+neighbour"] if podman_reason is None else ["local"]
    tiny = {"enabled": True, "workers": 2, "steps": 4, "batch_size": 4, "environments": environments("hpc", *ran)}
    settings = {"figures": {FIGURE: tiny}, "launcher": {"sample_interval_s": SAMPLE_INTERVAL_S}}
    (workdir / "tiny-biggan.yaml").write_text(yaml.safe_dump(settings))
    done = snakemake(workdir, "biggan_profiles", "--configfile", "config/config.yaml", "tiny-biggan.yaml", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


def summary_of(results: Path) -> pd.DataFrame:
    return pd.read_csv(results / "tables" / f"{FIGURE}.summary.csv").set_index("environment")


@pytest.mark.serial  # a stress-ng neighbour on every core
@pytest.mark.slow
def test_snakemake_biggan_profiles(built: Path, podman_reason: str | None) -> None:
    """Figure, summary and checks; hpc skipped with its reason; containers skipped with theirs where podman is not."""
    results = built / "results"
    assert (results / "figures" / f"{FIGURE}.png").stat().st_size > 0
    summary = summary_of(results)
    assert summary.loc["hpc", "status"] == "skipped" and "Slurm" in summary.loc["hpc", "reason"]
    first = "local" if podman_reason else "container"
    assert summary.loc[first, "status"] == "ok" and summary.loc[first, "ticks"] >= 3
    assert summary.loc[first, "gpu_utilization_percent_mean_skipped"] == "skipped: needs CUDA"
    if podman_reason is None:
        assert summary.loc["container", "allocation_cpu_cores"] == 1.5  # two ranks' containers of 0.75 CPU each
        assert summary.loc["container", "allocation_memory_gib"] == 4.0
    checks = pd.read_csv(results / "checks" / f"{FIGURE}.tsv", sep="\t").set_index("check")
    assert checks.loc["hpc-gpu-busy", "status"] == "skipped"
    if podman_reason is None:  # 4 steps sampled every 0.1 s: does that span the 3 s the CPU-limit checks rest on?
        span = checks.loc["cpu-samples-span-enough"]
        (reference,) = [r for r in figure_references()[FIGURE] if r["id"] == "cpu-samples-span-enough"]
        assert reference["compare"] == ">="
        assert span["status"] == ("pass" if span["measured"] >= reference["against"] else "fail")  # ~1 s measured
        assert span["measured"] == pytest.approx((summary.loc["container", "ticks"] - 1) * SAMPLE_INTERVAL_S)


@pytest.mark.serial  # a stress-ng neighbour on every core
@pytest.mark.slow
def test_gan_ranks_hold_equal_parameters_after_ddp_steps(built: Path) -> None:
    """Two real ranks, different batches each: after the steps both hold the same G and D, and they trained."""
    from ddlrepro.rank.gan_models import Generator
    from ddlrepro.rank.workloads.gan import parameter_digest, shape_of

    table = pd.read_csv(built / "results" / "tables" / f"{FIGURE}.csv")
    digests = table[table["metric"].str.endswith("_digest", na=False)]
    assert not digests.empty
    for _, rows in digests.groupby(["point_id", "metric"]):
        assert sorted(rows["rank"]) == [0, 1] and rows["value"].nunique() == 1, rows
    first = table.iloc[0]
    shape = {key: int(first[key]) for key in ("resolution", "channels", "z_dim", "attention_resolution")}
    torch.manual_seed(int(first["seed"]))
    initial = parameter_digest(Generator(shape_of(shape, 1)))
    trained = digests.loc[digests["metric"] == "generator_digest", "value"].iloc[0]
    assert trained != pytest.approx(initial, rel=1e-9)


@pytest.mark.serial  # a stress-ng neighbour on every core
@pytest.mark.slow
def test_the_neighbour_raises_node_cpu(built: Path, podman_reason: str | None) -> None:
    if podman_reason:
        pytest.skip(podman_reason)
    summary = summary_of(built / "results")
    alone, beside = summary.loc["container"], summary.loc["container+neighbour"]
    node, foreign = "node_cpu_percent_mean", "foreign_cpu_percent_of_node_mean"
    assert beside[node] > alone[node], (beside[node], alone[node])
    assert beside[foreign] > alone[foreign] + 10, (beside[foreign], alone[foreign])
    assert not subprocess.run(
        ["podman", "ps", "--all", "--quiet", "--filter", "name=ddlrepro-neighbour"], capture_output=True, text=True
    ).stdout.strip()  # removed after the run
    nodes = {}
    for path in (built / "results" / "runs" / FIGURE).glob("*/provenance.json"):
        provenance = json.loads(path.read_text())
        nodes[provenance["point"]["params"]["environment"]] = provenance.get("node")
    assert nodes["container+neighbour"]["shared"] and nodes["container+neighbour"]["neighbour"], nodes
    # Foreign CPU is not measured around containers' processes: without a neighbour, sharing is unknown.
    assert not nodes["container"]["neighbour"] and nodes["container"]["shared"] is None, nodes


@pytest.mark.serial  # a stress-ng neighbour on every core
@pytest.mark.slow
def test_compare_merges_two_results_folders_and_refuses_unlike_runs(built: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(built / "results" / "tables", other / "tables")
    out = tmp_path / "compared"
    merged = compare_environments(FIGURE, {"hpc": built / "results", "cloud": other}, out / "c.png", out / "c.csv")
    ran = summary_of(built / "results").query("status == 'ok'").index[0]
    assert {f"hpc: {ran}", f"cloud: {ran}", "hpc: hpc"} <= set(merged["environment"])
    compared = pd.read_csv(out / "c.summary.csv").set_index("environment")
    memory = compared["job_memory_gib_mean"]
    assert memory[f"hpc: {ran}"] == memory[f"cloud: {ran}"] > 0
    table = pd.read_csv(other / "tables" / f"{FIGURE}.csv")
    table.assign(batch_size=table["batch_size"] * 2).to_csv(other / "tables" / f"{FIGURE}.csv", index=False)
    with pytest.raises(ValueError, match="differ in more than the environment: batch_size"):
        compare_environments(FIGURE, {"hpc": built / "results", "cloud": other}, out / "c.png", out / "c.csv")
    with pytest.raises(ValueError, match=r"empty \[' '\], named twice \[\]"):
        merged_table(FIGURE, {"a": other, " ": other})


def test_compare_refuses_a_name_given_twice_before_reading_anything(tmp_path: Path) -> None:
    """`--env a=X --env a=Y` would otherwise keep one of them silently."""
    command = [sys.executable, "-m", "ddlrepro", "compare", FIGURE, "--out-dir", str(tmp_path)]
    done = subprocess.run([*command, "--env", "a=/nowhere", "--env", "a=/elsewhere"], capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip() == "environment names must be non-empty and unique: empty [], named twice ['a']"
    assert not list(tmp_path.iterdir())


def test_an_unreachable_slurm_cluster_is_named_on_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sinfo without a configuration says so over several lines; the reason becomes one table cell."""
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        "#!/bin/sh\necho 'sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host' >&2\n"
        "echo 'sinfo: error: fetch_config: DNS SRV lookup failed' >&2\necho 'sinfo: fatal: ' >&2\nexit 1\n"
    )
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    reason = slurm_unreachable_reason()
    assert "\n" not in reason
    assert reason.startswith("no Slurm cluster reachable (sinfo: sinfo: error: resolve_ctls_from_dns_srv")
    assert "DNS SRV lookup failed / sinfo: fatal:)" in reason
