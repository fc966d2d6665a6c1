"""Hosts as network namespaces, joined by veth pairs to a bridge in the testbed's own switch namespace.

Everything is named after the owner (a run or cluster): hosts `ddl-<owner>-h<i>` with hostname `<owner>-h<i>`,
the switch `ddl-<owner>-sw` (bridge `br0`, port `h<i>` per host), `/etc/netns/ddl-<owner>-h<i>/hosts` naming every
host (bind-mounted over /etc/hosts by `ip netns exec`), and the state file `/run/ddlrepro/testbed/<owner>.json`.
The state file is written before the first namespace exists, with the creating process's pid and start time, so
whatever a killed run leaves behind is found and removed by the next `create` of the same owner. The bridge lives
in the switch namespace, never in the root one (Docker's FORWARD policy there drops bridged traffic), and no
address or route is ever added in the root namespace: nothing is routed off the machine. With an `overlay` subnet
every host also gets a VXLAN device over its link (overlay.py), addressed in that subnet.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, cast

from ddlrepro.host.testbed import limits, overlay, shaping
from ddlrepro.host.testbed.limits import TestbedError

STATE_DIR = Path("/run/ddlrepro/testbed")
NETNS_RUN = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")
INTERFACE = "eth0"
BRIDGE = "br0"
STOP_GRACE_SECONDS = 3.0
DISABLE_IPV6 = "for s in all default; do echo 1 >/proc/sys/net/ipv6/conf/$s/disable_ipv6; done"


@dataclass(frozen=True)
class Host:
    name: str  # its hostname, resolvable on every host of the testbed
    namespace: str
    address: str
    interface: str = INTERFACE
    port: str = ""  # its link's end on the switch
    overlay_address: str = ""  # on the VXLAN device, when the testbed has an overlay
    overlay_interface: str = ""


def namespace_prefix(owner: str) -> str:
    return f"ddl-{owner}-"


def switch_namespace(owner: str) -> str:
    return f"{namespace_prefix(owner)}sw"


def plan_hosts(
    owner: str, count: int, network: ipaddress.IPv4Network, overlay_network: ipaddress.IPv4Network | None = None
) -> list[Host]:
    return [
        Host(
            f"{owner}-h{i}",
            f"{namespace_prefix(owner)}h{i}",
            str(network.network_address + i),
            INTERFACE,
            f"h{i}",
            str(overlay_network.network_address + i) if overlay_network else "",
            overlay.DEVICE if overlay_network else "",
        )
        for i in range(1, count + 1)
    ]


def run(argv: list[str], batch: list[str] | None = None) -> str:
    """Run one command (feeding `batch` lines to `-batch -`); a failure is a TestbedError with its message."""
    text = "\n".join(batch) + "\n" if batch is not None else None
    done = subprocess.run(argv, input=text, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None if the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (tells a live owner from a reused pid), None if gone."""
    fields = process_stat(pid)
    return int(fields[19]) if fields else None


def state_path(owner: str) -> Path:
    return STATE_DIR / f"{owner}.json"


def read_state(owner: str) -> dict[str, Any] | None:
    try:
        return cast("dict[str, Any] | None", json.loads(state_path(owner).read_text()))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return {}  # cut short by a kill while written: a leftover


def write_state(owner: str, state: dict[str, Any]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    partial = state_path(owner).with_suffix(".json.part")
    partial.write_text(json.dumps(state, indent=2) + "\n")
    partial.replace(state_path(owner))


def owner_alive(state: dict[str, Any]) -> bool:
    pid = state.get("pid")
    return isinstance(pid, int) and process_start(pid) == state.get("pid_start")


@contextmanager
def state_lock() -> Iterator[None]:
    """Serialises creates, destroys and rate changes across processes (a lock on the state folder itself, so no
    lock file is left behind; each takes milliseconds)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    handle = os.open(STATE_DIR, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def owned_namespaces(owner: str) -> list[str]:
    prefix = namespace_prefix(owner)
    return sorted(name for name in os.listdir(NETNS_RUN) if name.startswith(prefix)) if NETNS_RUN.exists() else []


def processes_in(namespaces: list[str]) -> list[int]:
    """Every process whose network namespace is one of these (what `ip netns pids` finds, in one pass)."""
    inodes = set()
    for name in namespaces:
        with suppress(OSError):
            inodes.add(os.stat(NETNS_RUN / name).st_ino)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    found.append(int(entry))
    return found


def stop_processes(pids: list[int], grace_s: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM, SIGKILL what is still there after `grace_s`, and wait until all are gone (zombies count as gone)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, STOP_GRACE_SECONDS)):
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if not zombie(pid)]
            time.sleep(0.02)
        if not pids:
            return


def zombie(pid: int) -> bool:
    """Gone, or exited and not yet reaped."""
    fields = process_stat(pid)
    return fields is None or fields[0] == "Z"


def stop_owner(owner: str, grace_s: float) -> None:
    """Ask a testbed's live owner (a keeper) to tear it down (SIGTERM), SIGKILL it after `grace_s`, and wait
    until it is gone; the caller then removes whatever it left (remove_leftovers)."""
    state = read_state(owner)
    if state and owner_alive(state):
        stop_processes([state["pid"]], grace_s)


def remove_namespaces(owner: str) -> None:
    """Stop every process in the owner's namespaces, delete them, their /etc/netns entries and the state file."""
    namespaces = owned_namespaces(owner)
    stop_processes(processes_in(namespaces))
    if namespaces:
        subprocess.run(
            ["ip", "-force", "-batch", "-"],
            input="".join(f"netns del {n}\n" for n in namespaces),
            capture_output=True,
            text=True,
            check=False,
        )
    for entry in NETNS_ETC.glob(f"{namespace_prefix(owner)}*") if NETNS_ETC.exists() else []:
        shutil.rmtree(entry)  # with what others put there (the multi-node cluster's slurm/ folder)
    state_path(owner).unlink(missing_ok=True)


def remove_leftovers(owner: str) -> bool:
    """Remove what a killed run of this owner left (namespaces, /etc/netns entries, state); True if there was any.
    A testbed whose recorded owner process still runs is refused, naming its pid."""
    limits.check_owner(owner)
    state = read_state(owner)
    if state and owner_alive(state):
        raise TestbedError(f"testbed {owner!r} is still running (pid {state['pid']}): stop it first")
    leftovers = state is not None or bool(owned_namespaces(owner)) or any(NETNS_ETC.glob(f"{namespace_prefix(owner)}*"))
    if leftovers:
        remove_namespaces(owner)
    return leftovers


def sweep_dead_owners() -> list[str]:
    """Remove what every testbed whose owner process died left (runs name their testbeds at random, so a SIGKILLed
    run's owner never comes back to clean up); the owners swept. Call under state_lock."""
    swept = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        state = read_state(path.stem)
        if state is not None and not owner_alive(state) and limits.OWNER.fullmatch(path.stem):
            remove_leftovers(path.stem)
            swept.append(path.stem)
    return swept


def hosts_file(hosts: list[Host]) -> str:
    return "127.0.0.1\tlocalhost\n" + "".join(f"{host.address}\t{host.name}\n" for host in hosts)


def host_rates(
    hosts: list[Host], link_rate: str | int | Mapping[str, str | int | None] | None
) -> dict[str, int | None]:
    """Each host's rate in bit/s (None: no limit), from one rate for all or a mapping by host name."""
    if not isinstance(link_rate, Mapping):
        rate = limits.parse_rate(link_rate)
        return {host.name: rate for host in hosts}
    unknown = sorted(set(link_rate) - {host.name for host in hosts})
    if unknown:
        raise TestbedError(
            f"link_rate names hosts the testbed will not have: {unknown} (it has {[h.name for h in hosts]})"
        )
    return {host.name: limits.parse_rate(link_rate.get(host.name)) for host in hosts}


class Testbed:
    """N hosts on one bridge. `create` builds it (a context manager: destroyed on exit, SIGTERM included),
    `attach` finds one built by another process from its state file."""

    __test__ = False  # not a pytest test class despite its name

    def __init__(
        self,
        owner: str,
        hosts: list[Host],
        subnet: str,
        rates: dict[str, int | None],
        pid: int,
        overlay_subnet: str | None = None,
    ) -> None:
        self.owner = owner
        self.hosts = hosts
        self.subnet = subnet
        self.overlay_subnet = overlay_subnet
        self.rates = rates
        self.pid = pid
        self.switch = switch_namespace(owner)
        self._previous_handler: Any = None

    @classmethod
    def create(
        cls,
        owner: str,
        hosts: int,
        link_rate: str | int | Mapping[str, str | int | None] | None = None,
        subnet: str = "198.18.0.0/24",
        overlay_subnet: str | None = None,
    ) -> Testbed:
        """`link_rate`: every host's, or {host name: rate} (hosts left out: no limit); `overlay_subnet`: the
        VXLAN overlay's addresses (None: no overlay)."""
        limits.require_available()
        limits.check_owner(owner)
        network = limits.check_subnet(subnet)
        limits.check_hosts(hosts, network)
        overlay_network = overlay.check_overlay_subnet(overlay_subnet, network) if overlay_subnet else None
        if overlay_network:
            limits.check_hosts(hosts, overlay_network)
        planned = plan_hosts(owner, hosts, network, overlay_network)
        overlay_text = str(overlay_network) if overlay_network else None
        testbed = cls(owner, planned, str(network), host_rates(planned, link_rate), os.getpid(), overlay_text)
        with state_lock():
            sweep_dead_owners()
            remove_leftovers(owner)
            testbed.save()
            try:
                testbed.build(network.prefixlen)
            except BaseException:
                remove_namespaces(owner)
                raise
        return testbed

    @classmethod
    def attach(cls, owner: str) -> Testbed:
        limits.check_owner(owner)
        state = read_state(owner)
        if not state:
            raise TestbedError(f"no testbed {owner!r} (no {state_path(owner)}): start one first")
        if not owner_alive(state):
            raise TestbedError(f"testbed {owner!r} was left by a dead process (pid {state.get('pid')})")
        hosts = [Host(**host) for host in state["hosts"]]
        return cls(owner, hosts, state["subnet"], state["rates"], state["pid"], state.get("overlay_subnet"))

    def save(self) -> None:
        write_state(
            self.owner,
            {
                "owner": self.owner,
                "pid": self.pid,
                "pid_start": process_start(self.pid),
                "subnet": self.subnet,
                "overlay_subnet": self.overlay_subnet,
                "switch": self.switch,
                "hosts": [asdict(host) for host in self.hosts],
                "rates": self.rates,
            },
        )

    def build(self, prefix_length: int) -> None:
        """Namespaces, /etc/netns entries, bridge and links, addresses, rates: one `ip`/`tc` batch per namespace."""
        run(["ip", "-batch", "-"], [f"netns add {self.switch}", *(f"netns add {h.namespace}" for h in self.hosts)])
        for host in self.hosts:
            folder = NETNS_ETC / host.namespace
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(hosts_file(self.hosts))
        # Nothing but the hosts' traffic on their counters: no IPv6 on the switch (its ports would send listener
        # reports) and no multicast snooping (the bridge would send IGMP reports); hosts get no link-local address.
        run(["ip", "netns", "exec", self.switch, "sh", "-c", DISABLE_IPV6])
        switch = [f"link add {BRIDGE} type bridge mcast_snooping 0", f"link set {BRIDGE} up"]
        for host in self.hosts:
            switch += [
                f"link add {host.port} type veth peer name {host.interface} netns {host.namespace}",
                f"link set {host.port} master {BRIDGE} up",
            ]
        run(["ip", "-n", self.switch, "-batch", "-"], switch)
        for host in self.hosts:
            run(
                ["ip", "-n", host.namespace, "-batch", "-"],
                [
                    "link set lo up",
                    f"link set {host.interface} addrgenmode none",
                    f"addr add {host.address}/{prefix_length} dev {host.interface}",
                    f"link set {host.interface} up",
                ],
            )
        if self.overlay_subnet:
            self.build_overlay(ipaddress.ip_network(self.overlay_subnet).prefixlen)
        self.apply_rates(self.hosts)

    def build_overlay(self, prefix_length: int) -> None:
        """Every host's VXLAN device, then its neighbour and forwarding entries for every other host."""
        numbered = list(enumerate(self.hosts, start=1))
        for index, host in numbered:
            lines = overlay.device_commands(index, host.interface, host.address, host.overlay_address, prefix_length)
            run(["ip", "-n", host.namespace, "-batch", "-"], lines)
        for index, host in numbered:
            peers = [(i, peer.address, peer.overlay_address) for i, peer in numbered if i != index]
            if not peers:
                continue
            neighbours, forwarding = overlay.neighbour_commands(peers)
            run(["ip", "-n", host.namespace, "-batch", "-"], neighbours)
            run(["bridge", "-n", host.namespace, "-batch", "-"], forwarding)

    def apply_rates(self, hosts: list[Host]) -> None:
        """Each host's rate on its eth0 and on its switch port (both directions): one `tc` batch a namespace."""
        switch = [line for host in hosts for line in shaping.rate_commands(host.port, self.rates[host.name])]
        for host in hosts:
            shaping.apply(host.namespace, shaping.rate_commands(host.interface, self.rates[host.name]))
        shaping.apply(self.switch, switch)

    def host(self, host: Host | str | int) -> Host:
        """A host by itself, its name, or its number (1-based)."""
        if isinstance(host, Host):
            host = host.name
        for candidate in self.hosts:
            if host in (candidate.name, candidate.namespace) or host == self.hosts.index(candidate) + 1:
                return candidate
        raise TestbedError(f"testbed {self.owner!r} has no host {host!r}: it has {[h.name for h in self.hosts]}")

    def exec_prefix(self, host: Host | str | int) -> list[str]:
        """The argv prefix that runs a command on a host: its network and /etc view, its own hostname."""
        chosen = self.host(host)
        return [
            "ip",
            "netns",
            "exec",
            chosen.namespace,
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            chosen.name,
        ]

    def set_rate(self, host: Host | str | int | None, rate: str | int | None) -> None:
        """Change one host's link rate (None: every host's), both directions, while traffic runs."""
        bits = limits.parse_rate(rate)
        chosen = self.hosts if host is None else [self.host(host)]
        with state_lock():
            self.rates |= {each.name: bits for each in chosen}
            self.apply_rates(chosen)
            state = read_state(self.owner) or {}
            # another process may have changed other hosts' rates since this one attached
            state["rates"] = state.get("rates", {}) | {each.name: bits for each in chosen}
            self.rates = state["rates"]
            write_state(self.owner, state)

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes received and sent by each host's interface since it was made."""
        counts = {}
        for host in self.hosts:
            (link,) = json.loads(run(["ip", "-n", host.namespace, "-j", "-s", "link", "show", "dev", host.interface]))
            stats = link["stats64"]
            counts[host.name] = {"rx_bytes": stats["rx"]["bytes"], "tx_bytes": stats["tx"]["bytes"]}
        return counts

    def destroy(self) -> None:
        """Stop every process on the hosts, remove every namespace, /etc/netns entry and the state file; a second
        SIGTERM or SIGINT meanwhile waits until it is done (in the main thread) instead of cutting it short."""
        with state_lock(), signals_held():
            remove_namespaces(self.owner)

    def __enter__(self) -> Testbed:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, _exit_on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.destroy()
        finally:
            if self._previous_handler is not None:
                signal.signal(signal.SIGTERM, self._previous_handler)


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT delivered only after the block (the main thread's handlers run then)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _exit_on_signal(number: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like an exception, so `with Testbed.create(...)` tears down on it too."""
    raise SystemExit(128 + number)
