"""Competing traffic: TCP flows between testbed hosts at an offered rate, started and stopped at given times.

Each flow is one receiver process on its destination host and one sender process on its source host
(`flowpeer.py`, run through the testbed's exec_prefix), bounded in time (its stop) and in bytes (what its offered
rate sends in its window). When a flow ends, one JSON line is appended to the caller's record file: the flow, the
bytes sent and received, the achieved rate and the CPU seconds its two processes used (the generator's own cost).
The testbed's destroy stops any flow still running (it stops every process on its hosts).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddlrepro.host.redaction import redacted_tail
from ddlrepro.host.testbed import limits
from ddlrepro.host.testbed.limits import TestbedError
from ddlrepro.host.testbed.network import Testbed

READY_SECONDS = 10.0
LATE_SECONDS = 5.0  # how long past its stop a flow may take to report before it is killed


def first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The first line a process prints, or "" if it says nothing within `timeout_s` (then it is killed)."""
    if process.stdout and select.select([process.stdout], [], [], timeout_s)[0]:
        return process.stdout.readline()
    process.kill()
    return ""


@dataclass(frozen=True)
class Flow:
    source: str  # host name
    destination: str
    connections: int
    rate: str  # offered, all connections together, e.g. "100mbit"
    start_s: float  # after traffic.start
    stop_s: float
    overlay: bool = False  # to the destination's overlay (VXLAN) address rather than its underlay one


def check_flow(testbed: Testbed, flow: Flow) -> None:
    testbed.host(flow.source), testbed.host(flow.destination)
    if flow.source == flow.destination:
        raise TestbedError(f"flow {flow}: source and destination are the same host")
    if not isinstance(flow.connections, int) or flow.connections < 1:
        raise TestbedError(f"flow {flow}: connections must be ≥ 1, got {flow.connections!r}")
    if not 0 <= flow.start_s < flow.stop_s:
        raise TestbedError(f"flow {flow}: needs 0 ≤ start_s < stop_s")
    if flow.overlay and not testbed.overlay_subnet:
        raise TestbedError(f"flow {flow}: over the overlay, but testbed {testbed.owner!r} has none")
    limits.parse_rate(flow.rate)


def destination_address(testbed: Testbed, flow: Flow) -> str:
    destination = testbed.host(flow.destination)
    return destination.overlay_address if flow.overlay else destination.address


class Traffic:
    """Flows under way; `wait()` until all reported, `stop()` ends them early (their records are still written)."""

    def __init__(self, testbed: Testbed, flows: list[Flow], record: Path) -> None:
        self.testbed = testbed
        self.record = record
        self.origin = time.time()
        self.processes: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(flow,), daemon=True) for flow in flows]

    def _spawn(self, host: str, argv: list[str]) -> subprocess.Popen[str]:
        command = [*self.testbed.exec_prefix(host), sys.executable, "-m", "ddlrepro.host.testbed.flowpeer", *argv]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with self._lock:
            self.processes.append(process)
        return process

    def _run(self, flow: Flow) -> None:
        start, stop = self.origin + flow.start_s, self.origin + flow.stop_s
        rate = limits.parse_rate(flow.rate)
        if rate is None:
            raise ValueError(f"flow {flow.source}→{flow.destination}: an offered rate is needed, not {flow.rate!r}")
        receive = ["receive", "--connections", str(flow.connections), "--until", str(stop + LATE_SECONDS)]
        receiver = self._spawn(flow.destination, receive)
        ready = first_line(receiver, READY_SECONDS).split()
        outcome: dict[str, Any] = {}
        if ready[:1] == ["ready"]:
            sender = self._spawn(
                flow.source,
                [
                    "send",
                    "--to",
                    destination_address(self.testbed, flow),
                    "--port",
                    ready[1],
                    "--connections",
                    str(flow.connections),
                    "--rate",
                    str(rate),
                    "--start-at",
                    str(start),
                    "--stop-at",
                    str(stop),
                    "--max-bytes",
                    str(int(rate / 8 * (flow.stop_s - flow.start_s))),
                ],
            )
            outcome.update(self._report(sender, stop, "sender"))
        else:
            outcome["error"] = f"receiver did not start: {ready} {receiver.stderr.read() if receiver.stderr else ''}"
        outcome.update(self._report(receiver, stop + LATE_SECONDS, "receiver"))  # it listens until then
        self._write(flow, outcome)

    def _report(self, process: subprocess.Popen[str], stop: float, side: str) -> dict[str, Any]:
        try:
            out, err = process.communicate(timeout=max(0.0, stop - time.time()) + LATE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            return {f"{side}_error": f"exit {process.returncode}: {redacted_tail(err.strip(), 300)}"}
        report = json.loads(lines[-1])
        return {**report, f"{side}_cpu_s": report.pop("cpu_s")}

    def _write(self, flow: Flow, outcome: dict[str, Any]) -> None:
        span = (outcome.get("last_byte") or 0) - (outcome.get("first_byte") or 0)
        received = outcome.get("received_bytes", 0)
        record = {
            "kind": "flow",
            **asdict(flow),
            "offered_bps": limits.parse_rate(flow.rate),
            **outcome,
            "achieved_bps": received * 8 / span if span > 0 else 0.0,
            "cpu_s": outcome.get("sender_cpu_s", 0.0) + outcome.get("receiver_cpu_s", 0.0),
        }
        with self._lock, self.record.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def begin(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self.threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        with self._lock:
            running = [process for process in self.processes if process.poll() is None]
        for process in running:
            process.terminate()
        self.wait(LATE_SECONDS)

    def __enter__(self) -> Traffic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(testbed: Testbed, flows: list[Flow], record: Path) -> Traffic:
    """Start the flows (times relative to now); each flow's outcome is appended to `record` as it ends."""
    for flow in flows:
        check_flow(testbed, flow)
    record.parent.mkdir(parents=True, exist_ok=True)
    return Traffic(testbed, flows, record).begin()
