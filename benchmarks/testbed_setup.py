"""Testbed setup: the time to build and tear down a 4-host testbed with rate-limited links (target ≤ 3 s), and how
close one TCP connection between two of its hosts comes to the configured link rate at 200 Mbit/s and 1 Gbit/s
(achieved ÷ configured; TCP's payload is 1448 of each 1514-byte frame the rate counts, so 0.956 is the ceiling;
target ≥ 0.9). As root (network namespaces); otherwise it says why and records nothing.

    python benchmarks/testbed_setup.py [--rounds 10] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import BenchmarkRecord, testbed_unavailable

from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.testbed import Testbed, limits, traffic

OWNER = "tbbench"
HOSTS = 4
RATES = ["200mbit", "1gbit"]


def setup_teardown_seconds() -> float:
    started = time.perf_counter()
    Testbed.create(OWNER, HOSTS, link_rate="1gbit").destroy()
    return time.perf_counter() - started


def tcp_rate_ratio(rate: str, seconds: float, record: Path) -> float:
    """One TCP connection offered far more than the link carries, host 1 to host 2: achieved ÷ configured."""
    with Testbed.create(OWNER, 2, link_rate=rate) as testbed:
        source, destination = (host.name for host in testbed.hosts)
        flow = traffic.Flow(source, destination, 1, "40gbit", 0.2, 0.2 + seconds)
        traffic.start(testbed, [flow], record).wait(seconds + 30)
    outcome = json.loads(record.read_text().splitlines()[-1])
    if "receiver_error" in outcome or "sender_error" in outcome:
        sys.exit(f"the transfer at {rate} failed: {outcome}")
    return outcome["achieved_bps"] / limits.parse_rate(rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="setup + teardown rounds (the median is reported)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each TCP transfer")
    args = parser.parse_args()
    if testbed_unavailable(Path(__file__).stem):
        return
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        with ForeignLoadMeter() as meter:
            rounds = [setup_teardown_seconds() for _ in range(args.rounds)]
        what = f"setup + teardown of a {HOSTS}-host testbed at 1 Gbit/s (median of {args.rounds})"
        record.add("setup-teardown", what, statistics.median(rounds), "s", meter.load, slowest=max(rounds))
        for rate in RATES:
            with ForeignLoadMeter() as meter:
                ratio = tcp_rate_ratio(rate, args.seconds, Path(scratch) / f"{rate}.jsonl")
            record.add(
                f"tcp-{rate}",
                f"one TCP connection at a {rate} link: achieved ÷ configured",
                ratio,
                "",
                meter.load,
                configured=rate,
            )


if __name__ == "__main__":
    main()
