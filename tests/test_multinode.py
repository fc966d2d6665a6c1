"""A real two-node Slurm cluster on the testbed (scripts/slurm-cluster start --nodes 2), the Slurm profile across
its nodes, and the rank-side interface byte counter."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import ONE_WORKER_COUNT_DLAAS, REPO, checks_excluding, copy_workflow, only
from test_slurm import empty_config_homes, kill_one_worker_during, setup_profile, slurm_snakemake

from ddlrepro.host.rundir import metric_records
from ddlrepro.host.testbed.limits import unavailable_reason
from ddlrepro.rank.interfaces import interface_bytes
from ddlrepro.rank.workloads.allreduce import sizes

SCRIPT = str(REPO / "scripts" / "slurm-cluster")
NODES, TASKS_PER_NODE = 2, 2
WORKERS = NODES * TASKS_PER_NODE
# The cross-node all-reduce: sizes large enough that the payload outweighs barriers and TCP's acknowledgements.
ALLREDUCE = {
    "workers": WORKERS,
    "backends": ["gloo", "mpi"],
    "strategies": ["RING"],
    "min_bytes": 2**20,
    "max_bytes": 2**22,
    "warmup": 1,
    "repetitions": 2,
    "target_bytes": 2**23,
    "max_ops": 4,
}
FRAMEWORKS = "{workers: [4], frameworks: [torch, horovod, tensorflow], horovod_controllers: [gloo, mpi]}"
ELASTIC = "{enabled: true, modes: [inplace-warm], schedule: '3:2,6:1,9:0', dataset_size: 64, batch_size: 4}"


def test_interface_bytes_leaves_out_loopback_and_reads_both_directions(tmp_path: Path) -> None:
    for name, rx, tx in (("lo", 5, 6), ("eth0", 1000, 2000), ("ib0", 7, 8)):
        statistics = tmp_path / name / "statistics"
        statistics.mkdir(parents=True)
        (statistics / "rx_bytes").write_text(f"{rx}\n")
        (statistics / "tx_bytes").write_text(f"{tx}\n")
        (statistics / "rx_packets").write_text(f"{rx // 100}\n")
        (statistics / "tx_packets").write_text(f"{tx // 100}\n")
    (tmp_path / "bonding_masters").write_text("")  # a file beside the interfaces, as on real machines
    assert interface_bytes(tmp_path) == {
        "eth0": {"rx_bytes": 1000, "tx_bytes": 2000, "rx_packets": 10, "tx_packets": 20},
        "ib0": {"rx_bytes": 7, "tx_bytes": 8, "rx_packets": 0, "tx_packets": 0},
    }


def cluster_command(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    command = ["timeout", "-s", "KILL", str(timeout), SCRIPT, *args]
    return subprocess.run(command, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two Slurm nodes, each a testbed host with its own slurmd; stopped (testbed and all) afterwards."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("multinode")
    try:
        started = cluster_command("start", "--nodes", str(NODES), str(state))
        assert started.returncode == 0, started.stderr
        assert "export SLURM_CONF=/etc/slurm/slurm.conf" in started.stdout
        yield {**os.environ, "SLURM_CONF": "/etc/slurm/slurm.conf", "DDLREPRO_TEST_SLURM_STATE": str(state)}
    finally:  # also after a start that failed or was killed half-way
        stopped = cluster_command("stop", str(state))
        assert stopped.returncode == 0, stopped.stderr
    assert not cluster_namespaces()


def cluster_namespaces() -> set[str]:
    return {path.name for path in Path("/run/netns").glob("ddl-slurm-*")}


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("nodes", "message"), [("0", "whole number ≥ 1"), ("100000", "more than this machine can hold")]
)
def test_bad_node_counts_are_refused_before_anything_exists(tmp_path: Path, nodes: str, message: str) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    before = cluster_namespaces()  # a killed earlier run's may be there: `start` removes them, a refusal does not
    refused = cluster_command("start", "--nodes", nodes, str(tmp_path / "state"))
    assert refused.returncode != 0 and message in refused.stderr
    assert not (tmp_path / "state").exists()
    assert cluster_namespaces() == before


def two_per_node(workdir: Path) -> str:
    (workdir / "nodes.yaml").write_text(f"launcher:\n  slurm: {{tasks_per_node: {TASKS_PER_NODE}}}\n")
    return "nodes.yaml"


def node_of(rank: int) -> str:
    return f"slurm-h{rank // TASKS_PER_NODE + 1}"


def cross_node_bytes(run_dir: Path) -> dict[str, dict[str, int]]:
    """{hostname: {rx_bytes, tx_bytes}} each node's eth0 moved between its local rank 0's start and end."""
    moved: dict[str, dict[str, int]] = {}
    for record in metric_records(run_dir):
        if record["metric"] in ("node_rx_bytes", "node_tx_bytes") and record["interface"] == "eth0":
            sign = 1 if record["phase"] == "end" else -1
            field = record["metric"].removeprefix("node_")
            node = moved.setdefault(record["hostname"], {"rx_bytes": 0, "tx_bytes": 0})
            node[field] += sign * int(record["value"])
    return moved


def ring_allreduce_bytes_per_node(settings: dict) -> int:
    """What gloo's ring all-reduce must move out of (and into) each node: per operation on S bytes each rank sends
    2(n−1)/n·S to its ring neighbours; with the ranks in block order two ring links cross between the nodes, so
    each node sends 2(n−1)/n·S over its link and receives as much. Operations per size: the sum check, the
    warm-up and the timed repetitions (as in rank/workloads/allreduce.py)."""
    n = settings["workers"]
    total = 0
    for size in sizes(settings["min_bytes"], settings["max_bytes"]):
        ops = max(1, min(settings["max_ops"], settings["target_bytes"] // size))
        total += size * (1 + settings["warmup"] + settings["repetitions"] * ops)
    return round(2 * (n - 1) / n * total)


@pytest.mark.slurm
@pytest.mark.slow
def test_profile_runs_every_framework_across_two_nodes(cluster: dict[str, str], tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path)
    sections = {
        "kungfu-fig9": FRAMEWORKS,
        "kungfu-allreduce": json.dumps(ALLREDUCE),
        "easyscale-fig9": "{enabled: true, logical_workers: 4, stages: [[1, 1, 1, 1], [2, 2]]}",
        "kungfu-fig7": ELASTIC,
    }
    configs = ["tests/configs/tiny.yaml", only(workdir, "multinode.yaml", sections), two_per_node(workdir)]
    tables = [f"results/tables/{figure}.csv" for figure in sections]  # the runs, not the checks against the papers
    env = empty_config_homes(cluster, tmp_path / "home")  # `snakemake --profile slurm` after docs/slurm.md's setup
    setup_profile(workdir, env)
    done = slurm_snakemake(workdir, env, *tables, "--configfile", *configs, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = workdir / "results" / "runs"

    for provenance_path in runs.glob("*/*/provenance.json"):
        provenance = json.loads(provenance_path.read_text())
        spec = json.loads((provenance_path.parent / "jobspec.json").read_text())
        hostnames = {worker["rank"]: worker["hostname"] for worker in provenance["workers"]}
        if "runtime" in spec:  # the elastic run: one node, as its allocation
            assert len(set(hostnames.values())) == 1, provenance_path
        else:  # ranks in block order, two to a node, each on a node of its own allocation
            blocks = [hostnames[rank] for rank in range(0, len(hostnames), TASKS_PER_NODE)]
            assert len(set(blocks)) == len(blocks) and set(blocks) <= set(map(node_of, range(WORKERS)))
            assert hostnames == {rank: blocks[rank // TASKS_PER_NODE] for rank in hostnames}, provenance_path
            assert len(hostnames) < WORKERS or blocks == [node_of(0), node_of(TASKS_PER_NODE)]

    table = pd.read_csv(workdir / "results" / "tables" / "kungfu-fig9.csv")
    sums = table[table["metric"] == "parameter_sum"]
    assert sums.groupby("point_id")["rank"].nunique().eq(WORKERS).all()
    assert sums.groupby("point_id")["value"].nunique().eq(1).all()  # the gradients really were averaged
    rates = table[table["metric"] == "img_per_sec"].fillna({"horovod_controller": "-"})
    assert set(map(tuple, rates[["framework", "horovod_controller"]].drop_duplicates().to_numpy())) == {
        ("torch", "-"),
        ("horovod", "gloo"),
        ("horovod", "mpi"),
        ("tensorflow", "-"),
    }

    (gloo,) = [
        path.parent
        for path in runs.glob("kungfu-allreduce/*/result.json")
        if json.loads(path.read_text())["point"]["params"]["backend"] == "gloo"
    ]
    expected = ring_allreduce_bytes_per_node(ALLREDUCE)
    moved = cross_node_bytes(gloo)
    assert set(moved) == {node_of(0), node_of(TASKS_PER_NODE)}
    for node, counts in moved.items():
        for field, value in counts.items():
            assert abs(value / expected - 1) <= 0.10, f"{node} {field}: {value} B, the ring must move {expected} B"


@pytest.mark.slurm
@pytest.mark.slow
def test_killed_task_on_the_second_node_fails_naming_it_and_a_retry_recovers(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    workdir = copy_workflow(tmp_path)
    sections = {"dlaas-scaling": f"{{workers: [{WORKERS}], iterations: 80, batch_size: 4}}"}
    slow = only(workdir, "slow.yaml", sections, checks_excluding(*ONE_WORKER_COUNT_DLAAS))
    nodes = two_per_node(workdir)
    second = TASKS_PER_NODE  # the second node's first rank
    run_dir, code, _ = kill_one_worker_during(
        workdir, cluster, "tests/configs/tiny.yaml", slow, nodes, workers=WORKERS, rank=second
    )
    assert code != 0
    log = (workdir / "results" / "logs" / "run_point" / "dlaas-scaling" / f"{run_dir.name}.log").read_text()
    assert f"srun: error: {node_of(second)}: task {second}" in log
    assert "failed in Slurm job" in log and f"on node {node_of(second)}" in log

    (workdir / "retry.yaml").write_text("launcher:\n  retries: 1\n")
    run_dir, code, stderr = kill_one_worker_during(
        workdir, cluster, "tests/configs/tiny.yaml", slow, nodes, "retry.yaml", workers=WORKERS, rank=second
    )
    assert code == 0, stderr[-4000:]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    assert len(list((run_dir / "attempts").iterdir())) == 2


@pytest.mark.slurm
@pytest.mark.slow
def test_a_slurmd_dying_mid_job_fails_it_naming_the_node_and_status_shows_it(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """Last in this module: it leaves the second node down."""
    workdir = copy_workflow(tmp_path)
    sections = {"dlaas-scaling": f"{{workers: [{WORKERS}], iterations: 3000, batch_size: 4}}"}
    slow = only(workdir, "slow.yaml", sections, checks_excluding(*ONE_WORKER_COUNT_DLAAS))
    second = node_of(TASKS_PER_NODE)
    state = Path(cluster["DDLREPRO_TEST_SLURM_STATE"])
    slurmd = int((state / f"slurmd-{second}.pid").read_text())
    run_dir, code, stderr = kill_one_worker_during(
        workdir,
        cluster,
        "tests/configs/tiny.yaml",
        slow,
        two_per_node(workdir),
        workers=WORKERS,
        victim=lambda _: slurmd,
    )
    assert code != 0, stderr[-3000:]
    log = (workdir / "results" / "logs" / "run_point" / "dlaas-scaling" / f"{run_dir.name}.log").read_text()
    assert f"on node {second}" in log, log[-3000:]
    assert not (run_dir / "result.json").exists()
    shown = cluster_command("status", str(state))
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith(second)]
    assert "*" in line or "down" in line, shown.stdout
