"""Point expansion shared by figures. Imported while Snakemake builds its DAG: keep it free of heavy imports."""

from __future__ import annotations

import os
from typing import Any

from ddlrepro.points import Point

PROTOCOL_KEYS = ["batch_size", "image_size", "warmup_batches", "iterations", "batches_per_iteration"]


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_worker(launcher: dict[str, Any], workers: int) -> int:
    """Threads of each worker: the configured number, or usable cores ÷ workers (at least 1) for `auto`."""
    setting = launcher["threads_per_worker"]
    return max(1, usable_cores() // workers) if setting == "auto" else int(setting)


def throughput_point(
    figure: str, section: dict[str, Any], model: str, workers: int, launcher: dict[str, Any], **extra: Any
) -> Point:
    """A throughput run of `model` on `workers` workers with the section's protocol; `extra` adds parameters."""
    return Point(
        figure=figure,
        workload="throughput",
        workers=workers,
        threads_per_worker=threads_per_worker(launcher, workers),
        params={
            "model": model,
            **{key: section[key] for key in PROTOCOL_KEYS if key in section},
            "backend": launcher["backend"],
            "sample_interval_s": launcher["sample_interval_s"],
            **extra,
        },
    )


def throughput_points(figure: str, section: dict[str, Any], models: list[str], launcher: dict[str, Any]) -> list[Point]:
    """One throughput point per (model, number of workers) of a figure's section."""
    return [
        throughput_point(figure, section, model, workers, launcher)
        for model in models
        for workers in section["workers"]
    ]
