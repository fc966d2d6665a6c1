"""Process exit: how long a rank's process takes to end once its work is done, by its entry point's way out
(`ddlrepro.shutdown.leave`: atexit handlers, then `os._exit`, no finalization) and by Python's own exit.

Each round starts two child processes, one of each kind in alternating order, that do what every rank does before
training (load torch, build the smoke model and its optimizer, which loads torch._dynamo), print the time and
return; the parent takes the time from that line to the child's exit. The figure is the median over rounds of
(exit with ÷ exit without) in the same round; the seconds are the medians of each.

    python benchmarks/process_exit.py [--rounds 10] [--model resnet20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from _common import BenchmarkRecord

from ddlrepro.host.hostload import ForeignLoadMeter

CHILD = """
import sys, time
import torch
from ddlrepro.rank.models import build_model
from ddlrepro.shutdown import leave

model = build_model(sys.argv[1])
torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
print(time.time(), flush=True)
if sys.argv[2] == "with":
    leave()
"""


def exit_seconds(model: str, kind: str) -> float:
    """Seconds from the child's last line to its exit (`kind`: with or without the last call)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, model, kind], stdout=subprocess.PIPE, text=True)
    printed = float(child.stdout.readline())
    child.wait()
    if child.returncode:
        sys.exit(f"the {kind} child failed (exit {child.returncode})")
    return time.time() - printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--model", default="resnet20")
    args = parser.parse_args()
    with BenchmarkRecord(__file__, args) as record:
        seconds: dict[str, list[float]] = {"with": [], "without": []}
        with ForeignLoadMeter() as meter:
            for round_ in range(args.rounds):
                for kind in ("with", "without") if round_ % 2 else ("without", "with"):
                    seconds[kind].append(exit_seconds(args.model, kind))
        ratios = [after / before for after, before in zip(seconds["with"], seconds["without"], strict=True)]
        record.add(
            "exit-without", "a rank's exit, Python's own", statistics.median(seconds["without"]), "s", meter.load
        )
        record.add(
            "exit-with",
            "a rank's exit, by ddlrepro.shutdown.leave",
            statistics.median(seconds["with"]),
            "s",
            meter.load,
        )
        record.add("exit-ratio", "exit with ÷ without (same round, median)", statistics.median(ratios), "", meter.load)


if __name__ == "__main__":
    main()
