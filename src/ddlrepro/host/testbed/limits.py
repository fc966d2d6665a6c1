"""What the testbed refuses, each before anything is created, with the value named."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from ddlrepro.host.errors import UserError

BENCHMARK_RANGE = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544's benchmarking range: never routed anywhere
OWNER = re.compile(r"[a-z][a-z0-9]{0,11}")
# A host must hold at least one CPU rank of the smoke models (torch with gloo: about 250 MB resident) beside its
# daemons; the kernel's share of a host (namespace, veth pair, qdiscs) is well under 1 MiB and never the limit.
HOST_MEMORY_BYTES = 256 * 2**20
BRIDGE_MAX_PORTS = 1024  # the Linux bridge's port limit (BR_MAX_PORTS)
RATE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>bit|kbit|mbit|gbit|tbit)?", re.IGNORECASE)
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


class TestbedError(UserError):
    """The testbed cannot be made, attached or changed as asked; the message says why."""

    __test__ = False  # not a pytest test class despite its name


def unavailable_reason() -> str | None:
    """Why this machine cannot host a testbed, or None when it can (for callers that skip)."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    missing = [tool for tool in ("ip", "tc", "unshare", "hostname") if shutil.which(tool) is None]
    if missing:
        return f"needs root for network namespaces, and {', '.join(missing)} (iproute2, util-linux) is missing"
    if not Path("/proc/self/ns/net").exists():
        return "needs root for network namespaces: this kernel has none"
    return None


def require_available() -> None:
    reason = unavailable_reason()
    if reason:
        raise TestbedError(reason)


def check_owner(owner: str) -> str:
    if not isinstance(owner, str) or not OWNER.fullmatch(owner):
        raise TestbedError(f"owner {owner!r} must match [a-z][a-z0-9]{{0,11}} (it names namespaces and hostnames)")
    return owner


MAX_RATE_BITS = 10**12  # 1000gbit: no link the testbed emulates is faster


def parse_rate(rate: str | int | None) -> int | None:
    """A link rate in bit/s from `200mbit`, `1gbit`, `1.5Gbit`, `500kbit` or a number of bit/s; None: unlimited."""
    if rate is None:
        return None
    match = RATE.fullmatch(str(rate).strip())
    if not match:
        raise TestbedError(f"link rate {rate!r} is not a rate: write e.g. 200mbit or 1gbit (bits per second)")
    bits = float(match["number"]) * RATE_UNITS[(match["unit"] or "bit").lower()]
    if not 1 <= bits <= MAX_RATE_BITS:  # inf included: a number of 400 digits parses as one
        raise TestbedError(f"link rate {str(rate)[:40]!r} must be above 0 and at most {format_rate(MAX_RATE_BITS)}")
    return round(bits)


def format_rate(bits: int | None) -> str:
    if bits is None:
        return "unlimited"
    for unit in ("gbit", "mbit", "kbit"):
        if bits % RATE_UNITS[unit] == 0:
            return f"{bits // RATE_UNITS[unit]}{unit}"
    return f"{bits}bit"


def check_subnet(subnet: str) -> ipaddress.IPv4Network:
    try:
        network = ipaddress.ip_network(subnet)
    except ValueError as error:
        raise TestbedError(f"subnet {subnet!r} is not a network: {error}") from None
    if not isinstance(network, ipaddress.IPv4Network) or not network.subnet_of(BENCHMARK_RANGE):
        raise TestbedError(f"subnet {subnet} is outside {BENCHMARK_RANGE}, the only range the testbed uses")
    return network


def meminfo_bytes(key: str) -> int:
    """One /proc/meminfo entry (MemTotal, MemAvailable...) in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise TestbedError(f"cannot read {key} from /proc/meminfo")


def available_memory() -> int:
    return meminfo_bytes("MemAvailable")


def exit_code(program: str, action: Callable[[], int | None]) -> int:
    """Run a command-line action: its exit code, or 1 with the TestbedError's message after `program: `."""
    try:
        return action() or 0
    except TestbedError as error:
        print(f"{program}: {error}", file=sys.stderr)
        return 1


def max_hosts(network: ipaddress.IPv4Network) -> tuple[int, str]:
    """The most hosts this machine and subnet hold, and what sets that bound."""
    bounds = {
        f"{available_memory() // 2**20} MiB available at {HOST_MEMORY_BYTES // 2**20} MiB a host": available_memory()
        // HOST_MEMORY_BYTES,
        f"subnet {network} holds {network.num_addresses - 2} host addresses": network.num_addresses - 2,
        f"a bridge holds {BRIDGE_MAX_PORTS} ports": BRIDGE_MAX_PORTS,
    }
    reason = min(bounds, key=bounds.__getitem__)
    return bounds[reason], reason


def check_hosts(hosts: int, network: ipaddress.IPv4Network) -> int:
    if not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1:
        raise TestbedError(f"hosts must be a whole number ≥ 1, got {hosts!r}")
    bound, reason = max_hosts(network)
    if hosts > bound:
        raise TestbedError(f"{hosts} hosts is more than this machine can hold: at most {bound} ({reason})")
    return hosts
