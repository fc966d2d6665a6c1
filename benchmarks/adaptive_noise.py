"""The noise-scale monitor's cost on KungFu Fig 8's own model (MobileNetV2, 32 px, batch 32, 2 workers × 1 thread),
the measurement of benchmarks/monitor_overhead.py (paired rounds in the same two processes), every step and every
8th step. (Micro-batches, `noise-scale@1/k4`, need a model without BatchNorm: pass `--model` and `--settings`.)

    python benchmarks/adaptive_policies.py --parts noise [--rounds 20]
"""

from __future__ import annotations

import argparse

import monitor_overhead
from _common import BenchmarkRecord

SETTINGS = ["none", "noise-scale@1", "noise-scale@8"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    monitor_overhead.add_arguments(parser, SETTINGS)
    parser.set_defaults(model="mobilenet_v2", image_size=32)


def measure(record: BenchmarkRecord, args: argparse.Namespace) -> None:
    monitor_overhead.measure(record, args)
