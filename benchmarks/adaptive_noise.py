"""The noise-scale monitor's cost on KungFu Fig 8's own model (MobileNetV2, 32 px, batch 32, 2 workers × 1 thread),
the measurement of benchmarks/monitor_overhead.py (paired rounds in the same two processes), every step and every
8th step. (Micro-batches, `noise-scale@1/k4`, need a model without BatchNorm: pass `--model` and `--settings`.)

What the monitor costs here, every step (2 workers, MobileNetV2's 3.5 M parameters, a 136 ms step). It reads
|G_small|² and |G_big|² from DDP's gradient buckets in a communication hook, before and after each bucket's
all-reduce (ddlrepro.rank.monitors), about 1.7 ms of CPU a step (per call, thread CPU time): two passes over
14 MB at this VM's memory bandwidth, 1.2 % of the step. It read them from the gradients once the backward pass was
done, out of cache (3.8 ms: the local norm 2.0 ms, the all-reduced 1.8 ms); side by side in the same two
processes (plain, that, this; 20 rounds) it cost 2.22 % of plain DDP's rate and the hook 1.47 %, a paired
difference of 0.75 ± 0.47 % (standard error). Both passes are the estimator's (the local and the all-reduced
gradient are different tensors at different moments), so the 2 % target sits near what the estimator costs on
this model.
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
