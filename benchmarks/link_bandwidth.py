"""The all-reduce microbenchmark across testbed hosts with rate-limited links: bus bandwidth ÷ the configured link
rate at 16–64 MiB, for gloo and MPI, 2 and 4 hosts, links at 200 Mbit/s and 1 Gbit/s (target ≥ 0.85), and the
time until a 2-node Slurm cluster is ready (target ≤ 30 s). As root; otherwise it says why and records nothing.
With `--strategies`, gloo also runs KungFu's strategies (strategies.py) in the same run as its ring, taking turns,
and each is reported against the link rate, against the ring, and against its graphs' link bound: the ring's bytes
per link ÷ the strategy's busiest rank's (`strategies.link_bound`; at 4 hosts STAR 0.5, BINARY_TREE 0.75, CLIQUE
1), the most of the ring's bus bandwidth the strategy can reach where links are the limit.

Through the multi-node Slurm cluster (scripts/slurm-cluster start --nodes N): each measurement is the workflow's
own kungfu-allreduce point run by the Slurm launcher inside an `sbatch` allocation of one task per host (srun
starts the ranks, MPI through Slurm's PMIx plugin), so it measures the path the figures take. Not through
Snakemake: its job polling adds seconds per point and nothing to what the links carry.

busbw = size ÷ time × 2(n−1)/n (nccl-tests), the time per operation taken as the median over ranks and timed
repetitions; a measurement's figure is its lowest ratio over the sizes (the target holds at every size). With one
rank per host each host's link carries 2(n−1)/n × size per operation in each direction, so busbw can reach the
link rate; the rate counts Ethernet frames, of which TCP's payload is at most 0.956. MPI runs
Open MPI's ring all-reduce, tuned for these links and this machine's shared cores (OPEN_MPI_TUNING below): what
Open MPI can reach here. The figures' MPI points run Open MPI as installed (its own algorithm choice, one TCP
connection per pair, no yielding), which a site tunes in its Open MPI configuration, not in ddlrepro.

What held MPI below the target, and the two settings that lift it (OPEN_MPI_TUNING below; measured with per-
repetition times, each host's `nstat` and qdisc counters, and /proc/stat every 0.1 s over the timed operations):
- 2 hosts (0.55 of the rate at 200 Mbit/s): most operations ran at gloo's time, but 7 and 10 of 18 (two runs of 6
  per size) took longer by whole multiples of one ring step's transfer time (at 16 MiB +0.35 or +0.69 s on 0.71 s),
  with no qdisc drop, no retransmission timeout and at most 2 retransmitted segments per host in a whole run: one
  direction of a step waited until the other had finished. Open MPI's ob1 sends a large message only after its
  peer's rendezvous ACK, and with one TCP connection per pair that ACK can queue behind the peer's own bulk data of
  the same step. Both ways around it removed the stalls: two connections per pair (btl_tcp_links=2, none of 18
  stalled) and an eager limit above the message size (no handshake at all; at a 32-MiB buffer per fragment).
- 4 hosts on this 2-core machine (0.73 at 1 Gbit/s with the fix above): both cores 100 % busy during the operations
  (77 % in the kernel, 7 % softirq) where gloo's ranks, blocking in their receives, left them 75 % idle while moving
  the same bytes: Open MPI's ranks poll their non-blocking sockets, and two ranks share a core, so a rank that has
  bytes to move waits for its neighbour's polling slice. Open MPI yields the core while it polls when it knows a
  node is oversubscribed (mpi_yield_when_idle, "will default to 1 when oversubscribing nodes",
  ompi/runtime/ompi_mpi_params.c); under srun, and with testbed hosts that each look like a whole machine, it cannot
  know, so the benchmark says so (0.86–0.91 of the rate per size then, 4 hosts at 1 Gbit/s).
On a machine with a core per rank the second setting would not matter (not measured here).

KungFu's strategies on 4 hosts at 1 Gbit/s (`--strategies`, foreign load 1–3 %) at first reached 0.62–0.81 of their
bounds, alike at 200 Mbit/s, so not for want of CPU. Each chunk's time at each rank (STAR, 64 MiB) and the switch ports'
byte counters every 20 ms showed why: the root's link sent nothing for the first 0.8 s of 2.5 s while its inputs
arrived at the full rate, because each leaf sent its chunks lane by lane (the even ones, then the odd ones, or the
reverse) and the root waited for chunk 1 from a leaf that sent it last. With leaves sending in chunk order
(strategies.Exchange) STAR took 1.72 s where its root's link needs 1.68 s for its 3 tensors; the binary trees stay
further from their bound (an inner rank's link carries sums up and totals down, each waiting on the other's hop).
The generated table (docs/performance.md) has each strategy's latest figures.

    python benchmarks/link_bandwidth.py [--hosts 2 4] [--rates 200mbit 1gbit] [--backends gloo mpi]
                                        [--strategies RING STAR BINARY_TREE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _common import REPO, SWEEP, BenchmarkRecord, busbw_by_size, per_size

from ddlrepro.host import testbed as testbed_package
from ddlrepro.host.config import validate_config
from ddlrepro.host.figures import kungfu_allreduce
from ddlrepro.host.hostload import ForeignLoadMeter, HostLoad, WatchedProcesses, process_tree_cpu
from ddlrepro.host.testbed import Testbed, forward, limits
from ddlrepro.host.testbed.slurm import OWNER
from ddlrepro.points import Point
from ddlrepro.rank.strategies import STRATEGIES, link_bound

SCRIPT = REPO / "scripts" / "slurm-cluster"
JOB_TIMEOUT_S = 600
SLURM_DAEMONS = {"munged", "slurmctld", "slurmd", "slurmstepd"}  # and the ranks they start
TESTBED_HELPERS = frozenset({testbed_package.__name__, forward.__name__})  # run with -m: hosts' keeper, port forwarder
OPEN_MPI_TUNING = {
    # Open MPI 4.1's fixed rules pick, for 4 ranks at 16-64 MiB, an all-reduce that moves about twice the ring's
    # bytes over the links (measured: 0.48 of the rate); the ring (algorithm 4) moves what gloo's does (the
    # segmented ring, 5, measured no better).
    "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
    "OMPI_MCA_coll_tuned_allreduce_algorithm": "4",
    # Two TCP connections per pair of ranks instead of one (btl_tcp_links, Open MPI's default 1): with one, a
    # rank's rendezvous handshake (ob1's ACK to its peer's large send) can queue behind its own bulk data to that
    # peer, and one direction of a ring step then waits for the other to finish (see the module docstring).
    "OMPI_MCA_btl_tcp_links": "2",
    # The testbed's hosts share this machine's cores (4 ranks on 2 here): yield while polling, as Open MPI does by
    # itself on a node it knows is oversubscribed.
    "OMPI_MCA_mpi_yield_when_idle": "1",
}


def cluster(action: str, state: Path, *extra: str) -> None:
    done = subprocess.run([str(SCRIPT), action, *extra, str(state)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"scripts/slurm-cluster {action} failed: {done.stderr.strip()}")


def start_cluster(hosts: int, state: Path) -> float:
    """Start an N-node cluster; seconds until every node is idle."""
    started = time.perf_counter()
    cluster("start", state, "--nodes", str(hosts))
    return time.perf_counter() - started


def allreduce_points(hosts: int, backends: list[str], strategies: list[str], launcher: dict) -> list[Point]:
    section = {"workers": hosts, "backends": backends, "strategies": strategies, **SWEEP}
    return kungfu_allreduce.points(section, launcher)


def run_point(point: Point, config: dict, run_dir: Path) -> None:
    """One point as the workflow's run rule runs it, in an allocation of one task per host."""
    command = [
        sys.executable,
        "-m",
        "ddlrepro",
        "run-point",
        "--point",
        point.to_json(),
        "--run-dir",
        str(run_dir),
        "--config-json",
        json.dumps(config),
    ]
    wrapped = shlex.join(command)
    sbatch = ["sbatch", "--wait", f"--nodes={point.workers}", "--ntasks-per-node=1", f"--output={run_dir}.out"]
    env = {**os.environ, "SLURM_CONF": "/etc/slurm/slurm.conf", **OPEN_MPI_TUNING}
    done = subprocess.run([*sbatch, "--wrap", wrapped], capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT_S)
    if done.returncode != 0 or not (run_dir / "result.json").exists():
        tail = Path(f"{run_dir}.out").read_text()[-3000:] if Path(f"{run_dir}.out").exists() else done.stderr
        sys.exit(f"{point.params['backend']} all-reduce on {point.workers} hosts failed:\n{tail}")


@contextlib.contextmanager
def cluster_meter() -> Iterator[ForeignLoadMeter]:
    """Foreign load while the cluster starts or a point runs on it: the daemons it starts detach from this process,
    and a point's ranks are started by the nodes' slurmd (srun steps), so the cluster's daemons (munged too) and the
    steps they start count as the run's own CPU, as do the testbed's helpers holding its hosts and forwarding
    slurmctld's port."""
    cluster = WatchedProcesses(SLURM_DAEMONS, TESTBED_HELPERS)
    with cluster, ForeignLoadMeter(lambda: process_tree_cpu() + cluster()) as meter:
        yield meter


def busbw_ratios(run_dir: Path, hosts: int, rate_bps: int, strategy: str | None = None) -> dict[int, float]:
    """{size in bytes: busbw ÷ link rate} (of one strategy in a gloo run of several)."""
    return {size: bps / rate_bps for size, bps in busbw_by_size(run_dir, hosts, strategy).items()}


def add_strategy(
    record: BenchmarkRecord,
    strategy: str,
    hosts: int,
    rate: str,
    where: str,
    ratios: dict[int, float],
    ring: dict[int, float],
    load: HostLoad,
) -> None:
    """A strategy's lowest busbw ÷ the ring's over the sizes (the same run, taking turns), beside its link bound."""
    versus_ring = {size: ratio / ring[size] for size, ratio in ratios.items()}
    lowest = min(versus_ring.values())
    bound = link_bound(strategy, hosts, max(ratios))
    what = f"gloo {strategy}, {where}: lowest busbw ÷ gloo's ring's over the sizes (its link bound {bound:.3g})"
    record.add(
        f"gloo-{strategy.lower()}-{hosts}hosts-{rate}",
        what,
        lowest,
        "",
        load,
        link_bound=bound,
        of_link_bound=lowest / bound,
        by_size=per_size(ratios),
    )
    print(f"    ÷ its link bound: {lowest / bound:.3f}; busbw ÷ rate per size: {per_size(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rates", nargs="+", default=["200mbit", "1gbit"])
    parser.add_argument("--backends", nargs="+", default=["gloo", "mpi"], choices=["gloo", "mpi"])
    parser.add_argument("--strategies", nargs="+", default=["RING"], choices=STRATEGIES, help="gloo's (RING always)")
    args = parser.parse_args()
    reason = limits.unavailable_reason()
    if reason:
        print(f"link_bandwidth: skipped: {reason}")
        return
    rates = {rate: limits.parse_rate(rate) for rate in args.rates}
    strategies = ["RING", *(strategy for strategy in args.strategies if strategy != "RING")]
    config = validate_config({"launcher": {"name": "slurm", "slurm": {"tasks_per_node": 1}}}, partial=True)
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        worst: tuple[float, str, object] | None = None
        for hosts in args.hosts:
            state = Path(scratch) / f"cluster-{hosts}"
            with cluster_meter() as meter:
                ready = start_cluster(hosts, state)
            if hosts == 2:
                record.add(
                    "ready-2-nodes", "2-node Slurm cluster: start until every node is idle", ready, "s", meter.load
                )
            try:
                testbed = Testbed.attach(OWNER)
                for rate, bits in rates.items():
                    testbed.set_rate(None, rate)
                    for point in allreduce_points(hosts, args.backends, strategies, config["launcher"]):
                        backend = point.params["backend"]
                        run_dir = Path(scratch) / f"{backend}-{hosts}-{rate}"
                        with cluster_meter() as meter:
                            run_point(point, config, run_dir)
                        where = f"{hosts} hosts, links at {rate} ({bits / 1e6:g} Mbit/s)"
                        ring = busbw_ratios(run_dir, hosts, bits, None if backend == "mpi" else "RING")
                        lowest = min(ring.values())  # the target holds at every size from 16 to 64 MiB
                        sizes = per_size(ring)
                        what = f"{backend}, {where}: lowest busbw ÷ rate over the sizes"
                        record.add(f"{backend}-{hosts}hosts-{rate}", what, lowest, "", meter.load, by_size=sizes)
                        print(f"    per size: {sizes}")
                        if worst is None or lowest < worst[0]:
                            worst = (lowest, f"{backend}, {hosts} hosts, {rate}", meter.load)
                        if backend == "gloo":
                            for strategy in strategies[1:]:
                                strategy_ratios = busbw_ratios(run_dir, hosts, bits, strategy)
                                add_strategy(record, strategy, hosts, rate, where, strategy_ratios, ring, meter.load)
            finally:
                cluster("stop", state)
        if worst is not None:
            record.add("worst-busbw-ratio", f"lowest busbw ÷ rate ({worst[1]})", worst[0], "", worst[2])


if __name__ == "__main__":
    main()
