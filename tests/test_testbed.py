"""The testbed on real network namespaces (as root; skipped with the reason otherwise): hosts, rates, counters,
competing traffic, teardown on every exit path, and bad input refused before anything exists."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO

from ddlrepro.host.run import unmet_requirement
from ddlrepro.host.rundir import METRICS, metric_records
from ddlrepro.host.testbed import Testbed, TestbedError, limits, traffic
from ddlrepro.host.testbed import overlay as overlay_device
from ddlrepro.host.testbed.counters import CounterSampler, metrics_file, node_counters
from ddlrepro.host.testbed.network import NETNS_ETC, NETNS_RUN, STATE_DIR
from ddlrepro.points import Point

REASON = limits.unavailable_reason()
needs_testbed = pytest.mark.skipif(REASON is not None, reason=REASON or "")
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
KILL_AFTER = 30  # every testbed the tests start in a child process dies by then


@pytest.fixture
def owner(request: pytest.FixtureRequest) -> str:
    """An owner name unique to this test process and test, torn down whatever the test did."""
    name = f"t{os.getpid() % 100000}{len(request.node.name) % 100}{abs(hash(request.node.name)) % 1000}"[:12]
    yield name
    subprocess.run([sys.executable, "-m", "ddlrepro.host.testbed", "stop", "--owner", name], env=ENV, check=False)


def left_behind(owner: str) -> list[str]:
    """Every trace of an owner's testbed: namespaces, /etc/netns entries, the state file."""
    found = [p.name for p in NETNS_RUN.glob(f"ddl-{owner}-*")] if NETNS_RUN.exists() else []
    found += [str(p) for p in NETNS_ETC.glob(f"ddl-{owner}-*")] if NETNS_ETC.exists() else []
    return found + [str(p) for p in STATE_DIR.glob(f"{owner}.*")]


def root_addresses() -> list[tuple[str, str]]:
    links = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    return sorted((link["ifname"], info["local"]) for link in links for info in link.get("addr_info", []))


def on_host(testbed: Testbed, host: str, command: str) -> str:
    argv = [*testbed.exec_prefix(host), "sh", "-c", command]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=10).stdout.strip()


def flow_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@needs_testbed
def test_hosts_have_their_own_names_addresses_and_resolve_each_other(owner: str) -> None:
    before = root_addresses()
    with Testbed.create(owner, 3) as testbed:
        during = root_addresses()
        names = [on_host(testbed, host.name, "hostname") for host in testbed.hosts]
        assert names == [f"{owner}-h1", f"{owner}-h2", f"{owner}-h3"]
        assert [host.address for host in testbed.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
        assert on_host(testbed, f"{owner}-h1", "ip -4 -br addr show dev eth0").split()[2] == "198.18.0.1/24"
        assert on_host(testbed, f"{owner}-h1", f"getent hosts {owner}-h3").split() == ["198.18.0.3", f"{owner}-h3"]
        assert on_host(testbed, 2, "hostname") == f"{owner}-h2"  # another shell on the same host
    assert before == during == root_addresses(), "an address was added in the root namespace"
    assert left_behind(owner) == []


@needs_testbed
def test_idle_links_carry_nothing_the_hosts_did_not_send(owner: str) -> None:
    with Testbed.create(owner, 3) as testbed:
        time.sleep(1.0)
        assert testbed.counters() == {host.name: {"rx_bytes": 0, "tx_bytes": 0} for host in testbed.hosts}


@pytest.mark.serial  # a shaped link's rate
@needs_testbed
def test_a_tcp_transfer_runs_at_the_configured_rate_and_counters_match_its_bytes(owner: str, tmp_path: Path) -> None:
    with Testbed.create(owner, 2, link_rate="200mbit") as testbed:
        before = testbed.counters()
        flows = [traffic.Flow(f"{owner}-h1", f"{owner}-h2", 2, "1gbit", 0.2, 2.2)]
        traffic.start(testbed, flows, tmp_path / "flows.jsonl").wait(15)
        after = testbed.counters()
    (record,) = flow_records(tmp_path / "flows.jsonl")
    # the rate counts Ethernet frames: TCP's payload is 1448 of each 1514 bytes (0.956)
    assert 0.90 <= record["achieved_bps"] / 200e6 <= 1.0, record
    assert record["received_bytes"] == record["sent_bytes"] > 0
    assert record["cpu_s"] > 0
    sent = after[f"{owner}-h1"]["tx_bytes"] - before[f"{owner}-h1"]["tx_bytes"]
    received = after[f"{owner}-h2"]["rx_bytes"] - before[f"{owner}-h2"]["rx_bytes"]
    assert sent == pytest.approx(record["sent_bytes"], rel=0.05)
    assert received == pytest.approx(record["received_bytes"], rel=0.05)


def resumed(received: Callable[[], int], within: float, settle: float = 0.5) -> int:
    """The byte count once it has grown over two `settle` windows in a row (the transfer runs again), polled for at
    most `within` seconds."""
    deadline = time.monotonic() + within
    last, growing = received(), 0
    while growing < 2:
        assert time.monotonic() < deadline, f"the transfer did not resume within {within} s"
        time.sleep(settle)
        now = received()
        growing = growing + 1 if now > last else 0
        last = now
    return last


@pytest.mark.serial  # a shaped link's rate
@needs_testbed
def test_set_rate_changes_the_rate_of_a_running_transfer(owner: str, tmp_path: Path) -> None:
    with Testbed.create(owner, 2, link_rate="400mbit") as testbed:
        h1 = f"{owner}-h1"
        # the flow outlasts both windows even when commands are slow under load; stopped once they are measured
        running = traffic.start(testbed, [traffic.Flow(f"{owner}-h2", h1, 1, "2gbit", 0, 60.0)], tmp_path / "f.jsonl")
        time.sleep(0.5)
        first = testbed.counters()[h1]["rx_bytes"]
        time.sleep(1.0)
        fast = testbed.counters()[h1]["rx_bytes"] - first
        testbed.set_rate(h1, "100mbit")  # h1's switch port: the direction this flow takes
        # the new qdisc drops what was queued: TCP may sit out backed-off retransmission timeouts (seen: > 3.5 s in
        # CI, once > 12 s: six timeouts in a row back off 0.2 + 0.4 + ... + 6.4 = 12.6 s), so the slow window starts
        # once the transfer has moved again
        second = resumed(lambda: testbed.counters()[h1]["rx_bytes"], within=40.0)
        time.sleep(2.0)
        slow = testbed.counters()[h1]["rx_bytes"] - second
        running.stop()
        assert Testbed.attach(owner).rates[h1] == 100_000_000
    assert fast * 8 / 1.0 == pytest.approx(400e6, rel=0.1)
    assert slow * 8 / 2.0 == pytest.approx(100e6, rel=0.1)


@needs_testbed
def test_sampler_files_each_hosts_bytes_as_metrics(owner: str, tmp_path: Path) -> None:
    with Testbed.create(owner, 2) as testbed, CounterSampler(testbed, metrics_file(tmp_path / METRICS), interval=0.1):
        on_host(
            testbed,
            1,
            f'{sys.executable} -c "import socket; s=socket.socket(socket.AF_INET, '
            f"socket.SOCK_DGRAM); [s.sendto(b'x' * 1000, ('198.18.0.2', 9)) for _ in range(100)]\"",
        )
        time.sleep(0.3)
    records = metric_records(tmp_path)
    assert {record["metric"] for record in records} == {"interface_rx_bytes", "interface_tx_bytes"}
    last = {(r["host"], r["metric"]): r["value"] for r in records}
    assert last[(f"{owner}-h1", "interface_tx_bytes")] >= 100 * 1042  # payload + UDP, IP and Ethernet headers
    assert len({record["time"] for record in records}) >= 3


@needs_testbed
def test_an_exception_tears_everything_down_with_the_processes_on_the_hosts(owner: str) -> None:
    with pytest.raises(RuntimeError), Testbed.create(owner, 2) as testbed:
        pid = int(on_host(testbed, 1, "sleep 60 >/dev/null 2>&1 & echo $!"))
        raise RuntimeError("the run failed")
    assert left_behind(owner) == []
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@needs_testbed
@pytest.mark.parametrize(
    ("number", "status"), [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, -signal.SIGINT)]
)
def test_a_signal_tears_everything_down(owner: str, number: int, status: int) -> None:
    """SIGINT: Python re-raises it after the `with` unwound (exit status -2)."""
    script = (
        f"from ddlrepro.host.testbed import Testbed\nwith Testbed.create({owner!r}, 2):\n print('up', flush=True)\n"
    )
    script += " import time; time.sleep(60)\n"
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert child.stdout.readline().strip() == "up"
    assert left_behind(owner)
    child.send_signal(number)
    assert child.wait(KILL_AFTER) == status
    assert left_behind(owner) == []


@needs_testbed
def test_each_host_can_have_its_own_link_rate(owner: str) -> None:
    with Testbed.create(owner, 2, {f"{owner}-h1": "100mbit"}) as testbed:
        assert testbed.rates == {f"{owner}-h1": 100_000_000, f"{owner}-h2": None}
        shown = subprocess.run(
            ["tc", "-n", testbed.hosts[0].namespace, "qdisc", "show", "dev", "eth0"], capture_output=True, text=True
        )
        assert "tbf" in shown.stdout and "100Mbit" in shown.stdout
        assert (
            "tbf"
            not in subprocess.run(
                ["tc", "-n", testbed.hosts[1].namespace, "qdisc", "show", "dev", "eth0"], capture_output=True, text=True
            ).stdout
        )


@needs_testbed
def test_a_killed_runs_testbed_of_another_owner_is_swept_by_the_next_create(owner: str) -> None:
    """Runs name their testbeds at random: a SIGKILLed run's owner never comes back, so any create sweeps it."""
    dead = owner[:-1] + ("x" if owner[-1] != "x" else "y")
    script = f"from ddlrepro.host.testbed import Testbed\nTestbed.create({dead!r}, 2)\nprint('up', flush=True)\n"
    script += "import time; time.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", script], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
    finally:
        child.kill()
        child.wait(KILL_AFTER)
    assert left_behind(dead)
    with Testbed.create(owner, 1):
        assert left_behind(dead) == []


@needs_testbed
def test_what_a_killed_run_left_is_removed_by_the_next_create(owner: str) -> None:
    script = f"from ddlrepro.host.testbed import Testbed\nTestbed.create({owner!r}, 3)\nprint('up', flush=True)\n"
    script += "import time; time.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", script], env=ENV, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "up"
    with pytest.raises(TestbedError, match=f"still running \\(pid {child.pid}\\)"):
        Testbed.create(owner, 2)
    child.kill()
    child.wait(KILL_AFTER)
    assert len(left_behind(owner)) == 3 + 1 + 3 + 1  # namespaces (hosts, switch), /etc/netns entries, state
    with Testbed.create(owner, 2) as testbed:
        assert [host.name for host in testbed.hosts] == [f"{owner}-h1", f"{owner}-h2"]
        assert not (NETNS_RUN / f"ddl-{owner}-h3").exists()
    assert left_behind(owner) == []


@needs_testbed
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"hosts": 0}, "hosts must be a whole number ≥ 1, got 0"),
        ({"hosts": 100_000}, "100000 hosts is more than this machine can hold: at most"),
        ({"hosts": 5, "subnet": "198.18.0.0/30"}, "at most 2 \\(subnet 198.18.0.0/30 holds 2 host addresses\\)"),
        ({"link_rate": "0mbit"}, "link rate '0mbit' must be above 0"),
        ({"link_rate": "9" * 400 + "gbit"}, "link rate '9999.*' must be above 0 and at most 1000gbit"),
        ({"link_rate": "2000gbit"}, "link rate '2000gbit' must be above 0 and at most 1000gbit"),
        ({"link_rate": "-5mbit"}, "link rate '-5mbit' is not a rate"),
        ({"link_rate": "fast"}, "link rate 'fast' is not a rate"),
        (
            {"link_rate": {"elsewhere-h1": "1gbit"}},
            "link_rate names hosts the testbed will not have: \\['elsewhere-h1'\\]",
        ),
        ({"subnet": "10.0.0.0/24"}, "subnet 10.0.0.0/24 is outside 198.18.0.0/15"),
        ({"subnet": "198.17.255.0/24"}, "outside 198.18.0.0/15"),
        ({"subnet": "198.18.0.300/24"}, "subnet '198.18.0.300/24' is not a network"),
        ({"owner": "Bad-name"}, "owner 'Bad-name' must match"),
        ({"owner": "waytoolongowner"}, "owner 'waytoolongowner' must match"),
    ],
)
def test_bad_input_is_refused_before_anything_exists(owner: str, arguments: dict, message: str) -> None:
    chosen = {"owner": owner, "hosts": 2} | arguments
    with pytest.raises(TestbedError, match=message):
        Testbed.create(**chosen)
    assert left_behind(chosen["owner"]) == []


@needs_testbed
def test_a_bad_flow_or_rate_change_is_refused(owner: str, tmp_path: Path) -> None:
    with Testbed.create(owner, 2) as testbed:
        with pytest.raises(TestbedError, match="no host 'elsewhere'"):
            traffic.start(testbed, [traffic.Flow("elsewhere", f"{owner}-h1", 1, "1mbit", 0, 1)], tmp_path / "f")
        with pytest.raises(TestbedError, match="link rate '0' must be above 0"):
            testbed.set_rate(None, "0")
        assert set(testbed.rates.values()) == {None}


@needs_testbed
def test_the_command_line_testbed_outlives_its_command_until_stop(owner: str) -> None:
    script = [str(REPO / "scripts" / "testbed")]
    started = subprocess.run(
        [*script, "start", "--owner", owner, "--hosts", "2", "--link-rate", "1gbit"],
        capture_output=True,
        text=True,
        timeout=KILL_AFTER,
        check=True,
    )
    assert f"{owner}-h2" in started.stdout and "198.18.0.2" in started.stdout and "1gbit" in started.stdout
    shown = subprocess.run(
        [*script, "exec", "--owner", owner, f"{owner}-h2", "--", "hostname"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert shown.stdout.strip() == f"{owner}-h2"
    subprocess.run([*script, "rate", "--owner", owner, "--host", f"{owner}-h1", "300mbit"], check=True, timeout=10)
    status = subprocess.run([*script, "status", "--owner", owner], capture_output=True, text=True, check=True)
    assert "300mbit" in status.stdout and "rx" in status.stdout
    clash = subprocess.run([*script, "start", "--owner", owner, "--hosts", "3"], capture_output=True, text=True)
    assert clash.returncode != 0 and f"testbed {owner!r} is already running (pid" in clash.stderr
    assert len(Testbed.attach(owner).hosts) == 2  # the running one untouched
    subprocess.run([*script, "stop", "--owner", owner], check=True, timeout=KILL_AFTER)
    assert left_behind(owner) == []


def test_a_point_that_needs_the_testbed_is_skipped_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    point = Point("kungfu-fig9", "throughput", 2, 1, params={"testbed_hosts": 2})
    monkeypatch.setattr("ddlrepro.host.run.testbed_unavailable_reason", lambda: "needs root for network namespaces")
    assert unmet_requirement(point) == "skipped: needs root for network namespaces"
    monkeypatch.setattr("ddlrepro.host.run.testbed_unavailable_reason", lambda: None)
    assert unmet_requirement(point) is None


@pytest.mark.serial  # rates and start times
@needs_testbed
def test_flows_are_paced_to_their_offered_rate_and_start_and_stop_on_time(owner: str, tmp_path: Path) -> None:
    record = tmp_path / "flows.jsonl"
    with Testbed.create(owner, 3, link_rate="1gbit") as testbed:
        h1, h2, h3 = (host.name for host in testbed.hosts)
        flows = [traffic.Flow(h1, h2, 3, "80mbit", 0.5, 2.0), traffic.Flow(h3, h2, 1, "40mbit", 0.0, 1.5)]
        started = time.time()
        traffic.start(testbed, flows, record).wait(15)
    by_source = {entry["source"]: entry for entry in flow_records(record)}
    for source, rate, start_s, stop_s in ((h1, 80e6, 0.5, 2.0), (h3, 40e6, 0.0, 1.5)):
        entry = by_source[source]  # the bytes follow from the rate over the span and the span's two ends
        assert entry["achieved_bps"] == pytest.approx(rate, rel=0.15), entry
        assert entry["first_byte"] - started == pytest.approx(
            start_s, abs=0.3
        )  # connect + first send on a busy 2-core host
        assert entry["last_byte"] - started == pytest.approx(stop_s, abs=0.2)


@needs_testbed
def test_an_overlay_joins_the_hosts_over_vxlan_and_goes_with_the_testbed(owner: str) -> None:
    before = root_addresses()
    with Testbed.create(owner, 3, link_rate="1gbit", overlay_subnet=overlay_device.SUBNET) as testbed:
        assert [host.overlay_address for host in testbed.hosts] == ["198.18.1.1", "198.18.1.2", "198.18.1.3"]
        device = json.loads(on_host(testbed, 1, "ip -j -d link show dev vxlan0"))[0]
        assert (device["mtu"], device["linkinfo"]["info_data"]["id"]) == (1450, 4096)
        assert on_host(testbed, 1, "ip -4 -br addr show dev vxlan0").split()[2] == "198.18.1.1/24"
        # every peer known in advance, as Calico does: a permanent neighbour and forwarding entry each
        assert on_host(testbed, 1, "ip neigh show dev vxlan0 nud permanent | wc -l") == "2"
        assert Testbed.attach(owner).overlay_subnet == overlay_device.SUBNET
    assert before == root_addresses()
    assert left_behind(owner) == []


@needs_testbed
def test_an_overlay_subnet_must_be_its_own(owner: str) -> None:
    with pytest.raises(TestbedError, match=re.escape("overlaps the underlay's 198.18.0.0/24")):
        Testbed.create(owner, 2, overlay_subnet="198.18.0.128/25")
    with pytest.raises(TestbedError, match=re.escape("outside 198.18.0.0/15")):
        Testbed.create(owner, 2, overlay_subnet="10.0.0.0/24")
    assert left_behind(owner) == []


@pytest.mark.serial  # a shaped link's rate
@needs_testbed
@pytest.mark.parametrize("overlay", [False, True], ids=["bridge", "overlay"])
def test_interface_counters_are_within_5_percent_of_the_bytes_sent(owner: str, overlay: bool, tmp_path: Path) -> None:
    """Calibration: a known transfer, host 1 to host 2, against the counters the ranks read (rank/interfaces.py) on
    both ends. The bytes as counted include each counted packet's headers (at most 66 of 1398 payload bytes: 4.7 %);
    less those (overlay.payload_bytes) they are the payload. Over the overlay vxlan0 counts the inner packets, eth0
    the same plus 50 bytes of VXLAN headers each."""
    subnet = overlay_device.SUBNET if overlay else None
    with Testbed.create(owner, 2, link_rate="400mbit", overlay_subnet=subnet) as testbed:
        before = [node_counters(testbed, host) for host in (1, 2)]
        flow = traffic.Flow(f"{owner}-h1", f"{owner}-h2", 1, "300mbit", 0.1, 0.6, overlay=overlay)
        traffic.start(testbed, [flow], tmp_path / "flows.jsonl").wait(15)
        after = [node_counters(testbed, host) for host in (1, 2)]
    (record,) = flow_records(tmp_path / "flows.jsonl")
    sent = record["sent_bytes"]
    assert record["received_bytes"] == sent > 2e6  # of 18.75 MB offered: a loaded 2-core machine sends less
    assert sorted(after[0]) == (["eth0", "vxlan0"] if overlay else ["eth0"])
    moved = {
        (end, interface): {field: after[end][interface][field] - before[end][interface][field] for field in counts}
        for end in (0, 1)
        for interface, counts in after[end].items()
    }
    for (end, interface), counts in moved.items():
        direction = "tx" if end == 0 else "rx"
        counted, packets = counts[f"{direction}_bytes"], counts[f"{direction}_packets"]
        encapsulated = overlay and interface == "eth0"
        assert overlay_device.payload_bytes(counted, packets, encapsulated) == pytest.approx(sent, rel=0.02)
        if not encapsulated:
            assert counted == pytest.approx(sent, rel=0.05), (end, interface)
    if overlay:  # the underlay carries the overlay's packets and their outer headers
        assert moved[0, "eth0"]["tx_bytes"] > moved[0, "vxlan0"]["tx_bytes"]
