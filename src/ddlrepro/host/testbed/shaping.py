"""Link rates: a token bucket (TBF) on the egress of each host's eth0 (host → switch) and on the egress of its
switch port (switch → host), so both directions of a link are limited, and `tc qdisc replace` changes a rate while
traffic runs. TBF rather than HTB: one qdisc per interface with no classes to keep in step, and more accurate
here: one TCP connection between two hosts for 3 s reached 0.957 of the configured rate with TBF at both 200 Mbit/s
and 1 Gbit/s (the rate counts Ethernet frames: 1448 payload bytes of 1514 is 0.956), 0.957 and 0.938 with HTB at its
default burst. benchmarks/testbed_setup.py measures it again."""

from __future__ import annotations

import subprocess

from ddlrepro.host.testbed.limits import TestbedError

NO_LIMIT_YET = "Cannot delete qdisc with handle of zero"  # removing a limit that was never set: nothing to do
MIN_BURST_BYTES = 64 * 1024  # one GSO super-packet: smaller and TBF splits every one, costing CPU
BURST_SECONDS = 0.002  # tokens for 2 ms: a late timer tick does not lose rate
QUEUE_SECONDS = 0.02  # 20 ms of queue absorbs a window's burst without drops at the rate


def burst_bytes(rate: int) -> int:
    return max(MIN_BURST_BYTES, int(rate / 8 * BURST_SECONDS))


def queue_bytes(rate: int) -> int:
    return max(2 * burst_bytes(rate), int(rate / 8 * QUEUE_SECONDS))


def rate_commands(interface: str, rate: int | None) -> list[str]:
    """`tc -batch` lines that set one interface's egress rate (bit/s), or remove its limit (None)."""
    if rate is None:
        return [f"qdisc del dev {interface} root"]
    return [
        f"qdisc replace dev {interface} root handle 1: tbf rate {rate}bit"
        f" burst {burst_bytes(rate)} limit {queue_bytes(rate)}"
    ]


def apply(namespace: str, commands: list[str]) -> None:
    """Run `tc` lines in a namespace, all of them even when one fails; only real failures raise."""
    if not commands:
        return
    argv = ["tc", "-force", "-n", namespace, "-batch", "-"]
    done = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True, check=False)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error") and NO_LIMIT_YET not in line]
    if done.returncode != 0 and errors:
        raise TestbedError(f"`{' '.join(argv)}` in {namespace} failed: {'; '.join(errors)}")
