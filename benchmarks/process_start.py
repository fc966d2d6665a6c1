"""Process start: the CPU time a rank takes to load its libraries, with its entry point's collector paused
(`ddlrepro.startup`: no garbage collection until they are loaded, then `gc.freeze`) and with Python's collector
as it comes.

Each round starts two child processes per kind of rank, one each way in alternating order, that load what that rank
loads before it trains (its entry module, then its workload and the workload's `libraries`, by the rank's own
`load_workload`) and leave as a rank does (`ddlrepro.shutdown.leave`); the parent reads each child's CPU time
(user + system, from `wait4`). Kinds: a torch rank (the throughput workload: torch, and torch._dynamo, which its first
optimizer loads) and a TensorFlow rank (the parameter-server workload: torch and TensorFlow). The figure per kind is
the mean over the rounds of (CPU paused ÷ CPU as it comes) in the same round, judged with its 95 % bounds over the
rounds, fixed before the run.

    python benchmarks/process_start.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from functools import partial

from _common import BenchmarkRecord, paired_round

from ddlrepro.host.hostload import ForeignLoadMeter

CHILD = """
import sys
from ddlrepro import startup

if sys.argv[1] == "paused":
    startup.pause_collection()
import json

from ddlrepro.rank.workloads.__main__ import load_workload
from ddlrepro.shutdown import leave

load_workload(sys.argv[2], json.loads(sys.argv[3]))
leave()
"""
# kind: (what it is, its workload, the point's parameters that choose its libraries)
RANKS = {
    "torch": ("a torch rank (throughput: torch, torch._dynamo)", "throughput", {}),
    "tensorflow": ("a TensorFlow rank (parameter servers: torch, TensorFlow)", "ps", {}),
}


def start_cpu_seconds(kind: str, collector: str) -> float:
    """User + system CPU seconds of one child loading `kind`'s libraries (`collector`: paused or as-it-comes)."""
    _, workload, params = RANKS[kind]
    with tempfile.TemporaryFile("w+") as stderr:  # TensorFlow's start-up notices, shown only if the child fails
        command = [sys.executable, "-c", CHILD, collector, workload, json.dumps(params)]
        child = subprocess.Popen(command, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)
        if os.waitstatus_to_exitcode(status):
            stderr.seek(0)
            sys.exit(
                f"the {kind} child ({collector}) failed: exit {os.waitstatus_to_exitcode(status)}\n{stderr.read()}"
            )
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="paired rounds per kind, fixed before the run")
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record:
        for kind, (what, _, _) in RANKS.items():
            seconds: dict[str, list[float]] = {"as-it-comes": [], "paused": []}
            with ForeignLoadMeter() as meter:
                for index in range(args.rounds):
                    plain, paused = paired_round(
                        index,
                        partial(start_cpu_seconds, kind, "as-it-comes"),
                        partial(start_cpu_seconds, kind, "paused"),
                    )
                    seconds["as-it-comes"].append(plain)
                    seconds["paused"].append(paused)
            ratios = [paused / plain for paused, plain in zip(seconds["paused"], seconds["as-it-comes"], strict=True)]
            for collector, values in seconds.items():
                label = f"{what}: CPU to load, collector {collector.replace('-', ' ')} (median)"
                record.add(f"{kind}-{collector}", label, statistics.median(values), "s", meter.load)
            label = f"{what}: CPU to load, collector paused ÷ as it comes (mean of the rounds)"
            record.add(f"{kind}-ratio", label, statistics.fmean(ratios), "", meter.load, round_values=ratios)


if __name__ == "__main__":
    main()
