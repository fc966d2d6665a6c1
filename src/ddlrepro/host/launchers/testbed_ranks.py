"""A point's ranks one per testbed host (`testbed_hosts` in its params), and the competing traffic into rank 0's host.

The run owns its testbed: created before the first rank starts and destroyed after the last one ended, whatever
happened (Testbed's context manager: exceptions, SIGTERM). Host i+1 runs rank i through the testbed's exec
prefix (its network namespace and hostname); MASTER_ADDR is host 1's 198.18.x address; the host after the last
rank's only sends the traffic. Every link has the point's `link_rate` (none: unlimited). The point's `network`
says what the ranks talk over: `bridge` (default here) their links to the testbed's bridge, `overlay` a VXLAN
overlay over those links (testbed/overlay.py, the stand-in for Calico's): MASTER_ADDR and gloo's interface are then
the overlay's, so every byte between ranks is encapsulated. Each rank also gets each network's interface on its
host (`NETWORK_INTERFACES_ENV`): a paired run trains a model over the bridge beside one over the overlay.

The traffic (`traffic` in the params: connections, offered rate, seconds) is real TCP from that extra host into
host 1 (rank 0, STAR's first root), started when rank 0 prints its `interference_requested` record: the host side
reacts to what a rank reports, the ranks decide nothing by a clock. It is started on a thread of its own, never on
rank 0's output reader (which must keep draining rank 0's pipe); if starting it fails, the run fails with that error
once its ranks ended (logs kept, no result.json), rather than reading as a policy that did not switch. It stops
after its seconds or when the run ends. Its outcome (testbed/traffic.py's flow record) is filed into the run's
metrics: `traffic_start` (time and value: the first byte's arrival), `traffic_received_bytes` and
`traffic_achieved_bps`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from ddlrepro.host.launch import TestbedHosts
from ddlrepro.host.launchers.base import WorkerSpec
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.host.testbed import Testbed, traffic
from ddlrepro.host.testbed.network import plan_hosts, run
from ddlrepro.host.testbed.overlay import SUBNET as OVERLAY_SUBNET
from ddlrepro.rank.taskenv import NETWORK_INTERFACES_ENV
from ddlrepro.records import RECORD_PREFIX

SUBNET = "198.18.0.0/24"
NETWORKS = ("bridge", "overlay")  # what ranks on testbed hosts talk over; `host` (no testbed) is not placed here
TRIGGER = "interference_requested"
FLOWS_FILE = "flows.jsonl"
RTO_MIN = "10ms"

LineHandler = Callable[[int | None, str, str], None]


@dataclass(frozen=True)
class TestbedPlacement:
    """Where a point's ranks run: its own testbed (owner, hosts, link rate) and the traffic into host 1, if any,
    whose flow records go to `flows_file`, relative to the run folder (jobspec.json names no path of this machine
    for it)."""

    __test__ = False  # not a pytest test class despite its name

    owner: str
    hosts: int
    link_rate: str | None
    flows_file: str
    traffic: dict[str, Any] | None
    network: str = "bridge"


def placement(testbed: TestbedHosts | None, workers: int) -> TestbedPlacement | None:
    """The point's testbed (its launch's), None when it runs on this machine's loopback."""
    if testbed is None:
        return None
    needed = workers + 1 if testbed.traffic else workers
    if testbed.hosts < needed:
        raise ValueError(f"testbed_hosts {testbed.hosts}: {workers} ranks need {needed} hosts (one more sends traffic)")
    if testbed.network not in NETWORKS:
        raise ValueError(f"network {testbed.network!r}: ranks on testbed hosts talk over one of {list(NETWORKS)}")
    owner = "r" + secrets.token_hex(5)  # one testbed per run, even for runs of the same point at once
    return TestbedPlacement(owner, testbed.hosts, testbed.link_rate, FLOWS_FILE, testbed.traffic, testbed.network)


def overlay_subnet(where: TestbedPlacement) -> str | None:
    return OVERLAY_SUBNET if where.network == "overlay" else None


def planned_testbed(where: TestbedPlacement) -> Testbed:
    """The testbed as it will be (names, addresses), before it exists: what renders the ranks' commands."""
    overlay = overlay_subnet(where)
    overlay_network = ipaddress.IPv4Network(overlay) if overlay else None
    hosts = plan_hosts(where.owner, where.hosts, ipaddress.IPv4Network(SUBNET), overlay_network)
    return Testbed(where.owner, hosts, SUBNET, {}, 0, overlay)


def placed_workers(workers: list[WorkerSpec], where: TestbedPlacement) -> tuple[list[WorkerSpec], str]:
    """Rank i's command run on host i+1, each rank alone on its host; and MASTER_ADDR (host 1's address on the
    network the ranks talk over)."""
    testbed = planned_testbed(where)
    overlay = where.network == "overlay"
    first = testbed.hosts[0]
    master = first.overlay_address if overlay else first.address
    placed = []
    for worker in workers:
        assert worker.rank is not None
        env = {**worker.env, "MASTER_ADDR": master, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        host = testbed.hosts[worker.rank]
        env["GLOO_SOCKET_IFNAME"] = host.overlay_interface if overlay else host.interface
        interfaces = {"bridge": host.interface} | ({"overlay": host.overlay_interface} if overlay else {})
        env[NETWORK_INTERFACES_ENV] = json.dumps(interfaces)
        placed.append(replace(worker, command=[*testbed.exec_prefix(worker.rank + 1), *worker.command], env=env))
    return placed, master


def requests_traffic(line: str) -> bool:
    """Whether a line is rank 0's `interference_requested` record (a cheap test first: every line passes here)."""
    return (
        TRIGGER in line
        and line.startswith(RECORD_PREFIX)
        and json.loads(line[len(RECORD_PREFIX) :]).get("metric") == TRIGGER
    )


class Interference:
    """Starts the placement's traffic when rank 0 asks for it, once, on its own thread; files its outcome when
    stopped and raises what starting it raised."""

    def __init__(self, testbed: Testbed, where: TestbedPlacement, output: OutputCollector) -> None:
        self.testbed = testbed
        self.where = where
        self.output = output
        self.running: traffic.Traffic | None = None
        self.starter: threading.Thread | None = None
        self.start_error: BaseException | None = None
        self.flows = output.run_dir.resolve() / where.flows_file
        self._lock = threading.Lock()

    def add_line(self, rank: int | None, stream: str, line: str) -> None:
        self.output.add_line(rank, stream, line)
        if rank == 0 and stream == "stdout" and requests_traffic(line):
            self.request()

    def request(self) -> None:
        """Start the traffic (once) without holding up the caller: rank 0's output reader."""
        with self._lock:
            if self.where.traffic is None or self.starter is not None:
                return
            self.starter = threading.Thread(target=self._start, args=(self.where.traffic,), daemon=True)
            self.starter.start()

    def _start(self, settings: dict[str, Any]) -> None:
        flow = traffic.Flow(
            source=self.testbed.hosts[-1].name,
            destination=self.testbed.hosts[0].name,
            connections=settings["connections"],
            rate=settings["rate"],
            start_s=0.0,
            stop_s=float(settings["seconds"]),
        )
        try:
            self.running = traffic.start(self.testbed, [flow], self.flows)
        except BaseException as error:  # kept for stop() to raise on the hosting thread
            self.start_error = error

    def stop(self) -> None:
        """Stop the traffic and file its outcome; raise what starting it raised, if it failed."""
        with self._lock:
            starter = self.starter
        if starter is None:
            return
        starter.join()
        if self.start_error is not None:
            raise self.start_error
        if self.running is not None:
            self.running.stop()
            self.file_outcome()

    def file_outcome(self) -> None:
        for line in self.flows.read_text().splitlines() if self.flows.exists() else []:
            flow = json.loads(line)
            first, last = flow.get("first_byte"), flow.get("last_byte")
            if first is None or last is None:  # no byte arrived: the figure's traffic windows stay unmeasured
                continue
            for metric, time, value in (
                ("traffic_start", first, first),
                ("traffic_received_bytes", last, flow["received_bytes"]),
                ("traffic_achieved_bps", last, flow["achieved_bps"]),
            ):
                self.output.add_record({"kind": "metric", "time": time, "metric": metric, "value": value})


def datacenter_retransmits(testbed: Testbed) -> None:
    """A lost packet retransmitted after RTO_MIN, not Linux's default 200 ms: on these sub-millisecond links a
    lost tail packet of a gradient (three ranks bursting into the root's queue at once) would otherwise stall a
    0.3 s step by 0.2 s and read as interference; data-centre hosts lower it the same way."""
    for host in testbed.hosts:
        links = [(testbed.subnet, host.interface, host.address)]
        if testbed.overlay_subnet:
            links.append((testbed.overlay_subnet, host.overlay_interface, host.overlay_address))
        for subnet, interface, address in links:
            route = f"{subnet} dev {interface} proto kernel scope link src {address} rto_min {RTO_MIN}"
            run(["ip", "-n", host.namespace, "route", "replace", *route.split()])


@contextmanager
def hosted(where: TestbedPlacement, output: OutputCollector) -> Iterator[LineHandler]:
    """The placement's testbed while the ranks run; yields the handler their output lines go through."""
    with Testbed.create(where.owner, where.hosts, where.link_rate, SUBNET, overlay_subnet(where)) as testbed:
        datacenter_retransmits(testbed)
        interference = Interference(testbed, where, output)
        try:
            yield interference.add_line
        except BaseException:
            # The ranks' own failure is the one to report; a traffic start that failed too is only context.
            with contextlib.suppress(Exception):
                interference.stop()
            raise
        interference.stop()
