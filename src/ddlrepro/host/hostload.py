"""How busy the host was with work that is not ours while we measured.

The host's busy CPU time comes from `/proc/stat` (user, nice, system, irq, softirq over all of its CPUs); the run's
own CPU time from the measuring process and its descendants (or any other accounting handed in, such as a Slurm
allocation's cgroup). Their difference is foreign load: another program, a compile, a second Snakemake job. Steal
is time a hypervisor gave this VM's CPUs to someone else. Both are reported as a share of the host's CPU capacity
over the measured wall time, so 0.5 on a 2-core host means one core's worth of foreign work.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

PROC_STAT = Path("/proc/stat")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class CpuCounters:
    """One reading of the host's CPU time and the run's own, in seconds."""

    wall: float
    busy: float
    steal: float
    own: float
    cpus: int


def read_host_cpu(stat: Path = PROC_STAT) -> tuple[float, float, int]:
    """(busy seconds, steal seconds, CPU count) summed over every CPU of the host, from `/proc/stat`."""
    lines = stat.read_text().splitlines()
    fields = dict(zip(STAT_FIELDS, (int(value) for value in lines[0].split()[1:]), strict=False))
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(fields.get(name, 0) for name in BUSY_FIELDS) / ticks, fields.get("steal", 0) / ticks, cpus


def process_tree_cpu(pid: int | None = None) -> float:
    """CPU seconds of a process, of its children it has waited for (and theirs), and of its live descendants.

    A child reaped during the measurement adds its whole lifetime's CPU: measure in a process that has no older
    children left to reap (the workflow starts every run in a fresh process)."""
    root = psutil.Process(pid)
    times = root.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in root.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:
            continue
        total += child_times.user + child_times.system
    return total


class WatchedProcesses:
    """CPU seconds spent, while watched, by every process named one of `names` or running one of `modules` (`python
    -m module`), and their descendants: a reader of own CPU for ForeignLoadMeter where the measured work runs in
    processes this one did not start and cannot wait for (a local Slurm cluster's slurmd, slurmstepd and the ranks
    they start, its testbed's helpers: daemonised, reaped by init).

    A thread samples them every `period_s`; a process counts from its CPU when first seen (0 if it started while
    watched) to its last sample, so at most `period_s` of each process's last moments is missed. What started while
    watched is what was not running at the start, not what psutil dates after it: its dates come from the boot
    time, which can be half a second off the wall clock (measured in this VM)."""

    def __init__(self, names: set[str], modules: frozenset[str] = frozenset(), period_s: float = 0.2) -> None:
        self.names, self.modules, self.period_s = names, modules, period_s
        self.first: dict[tuple[int, float], float] = {}
        self.last: dict[tuple[int, float], float] = {}
        self.running_before: set[tuple[int, float]] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="watched-processes", daemon=True)

    def __enter__(self) -> WatchedProcesses:
        self.running_before = {
            (process.pid, process.info["create_time"]) for process in psutil.process_iter(["create_time"])
        }
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def __call__(self) -> float:
        self._sample()
        with self._lock:
            return sum(self.last[key] - self.first[key] for key in self.last)

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        for process in self._watched():
            try:
                times, created = process.cpu_times(), process.create_time()
            except psutil.Error:
                continue
            key, cpu = (process.pid, created), times.user + times.system
            with self._lock:
                self.first.setdefault(key, cpu if key in self.running_before else 0.0)
                self.last[key] = cpu

    def _watched(self) -> list[psutil.Process]:
        """The matching processes and their descendants, less this process's own (process_tree_cpu counts those;
        a daemon that leaves this tree counts from then, from 0 if it started while watched)."""
        attributes = ["name", "cmdline"] if self.modules else ["name"]
        roots = [process for process in psutil.process_iter(attributes) if self._matches(process.info)]
        found = {process.pid: process for process in roots}
        for root in roots:
            try:
                found |= {child.pid: child for child in root.children(recursive=True)}
            except psutil.Error:
                continue
        ours = {child.pid for child in psutil.Process().children(recursive=True)}
        return [process for pid, process in found.items() if pid not in ours]

    def _matches(self, info: dict[str, Any]) -> bool:
        if info["name"] in self.names:
            return True
        command = info.get("cmdline") or []
        return any(flag == "-m" and module in self.modules for flag, module in itertools.pairwise(command))


@dataclass(frozen=True)
class HostLoad:
    """Foreign and steal load over one measured interval, as shares of the host's CPU capacity."""

    wall_s: float
    cpus: int
    host_busy_s: float
    own_s: float
    steal_s: float

    @property
    def foreign_s(self) -> float:
        return max(0.0, self.host_busy_s - self.own_s)

    @property
    def capacity_s(self) -> float:
        return max(self.wall_s * self.cpus, 1e-9)

    @property
    def foreign_share(self) -> float:
        return self.foreign_s / self.capacity_s

    @property
    def steal_share(self) -> float:
        return self.steal_s / self.capacity_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "foreign_s": self.foreign_s,
            "foreign_share": self.foreign_share,
            "steal_share": self.steal_share,
        }


CALIBRATION_ITERATIONS = 100_000  # about 10 ms of one core here: cheap enough to run before and after every run
CALIBRATION_ROUNDS = 3
# The loop runs in a process of its own (python -S: no site, ~20 ms to start): in the measuring process it would
# share the GIL with that process's threads (a run's output readers, servers) and read their activity as speed.
CALIBRATION_SCRIPT = """
import sys, time
def fastest(rounds, iterations):
    best = float("inf")
    for _ in range(rounds):
        started, total = time.perf_counter(), 0
        for value in range(iterations):
            total += value * value % 7
        best = min(best, time.perf_counter() - started)
    return best
rounds, iterations = int(sys.argv[1]), int(sys.argv[2])
print(iterations / fastest(rounds, iterations) / 1e6)
"""


def machine_speed(rounds: int = CALIBRATION_ROUNDS, iterations: int = CALIBRATION_ITERATIONS) -> float:
    """The machine-speed index: million iterations per second of a fixed single-threaded integer loop in a fresh
    process, the best of `rounds` (the least interrupted). Taken before and after a run, it shows the host's speed
    moving while the run measured, which CPU-time accounting cannot see (a busy neighbour VM without steal, a
    clock change)."""
    command = [sys.executable, "-S", "-c", CALIBRATION_SCRIPT, str(rounds), str(iterations)]
    return float(subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout)


class ForeignLoadMeter:
    """Measures foreign load between `start()` and `stop()` (or over a `with` block: `meter.load` afterwards).

    `own_cpu`: the CPU seconds so far of everything that belongs to the measurement; by default this process and
    its descendants, which must have been waited for (or still be alive) when `stop()` reads them."""

    def __init__(self, own_cpu: Callable[[], float] = process_tree_cpu, stat: Path = PROC_STAT) -> None:
        self.own_cpu = own_cpu
        self.stat = stat
        self._start: CpuCounters | None = None
        self.load: HostLoad | None = None

    def _read(self) -> CpuCounters:
        busy, steal, cpus = read_host_cpu(self.stat)
        return CpuCounters(time.monotonic(), busy, steal, self.own_cpu(), cpus)

    def start(self) -> ForeignLoadMeter:
        self._start = self._read()
        return self

    def stop(self) -> HostLoad:
        if self._start is None:
            raise RuntimeError("ForeignLoadMeter.stop() before start()")
        end, begin = self._read(), self._start
        self.load = HostLoad(
            wall_s=end.wall - begin.wall,
            cpus=end.cpus,
            host_busy_s=end.busy - begin.busy,
            own_s=end.own - begin.own,
            steal_s=end.steal - begin.steal,
        )
        return self.load

    def __enter__(self) -> ForeignLoadMeter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
