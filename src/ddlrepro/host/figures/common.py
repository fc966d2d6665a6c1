"""Point expansion shared by figures. Imported while Snakemake builds its DAG: keep it free of heavy imports."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from ddlrepro.host.config import ConfigError
from ddlrepro.host.testbed.limits import TestbedError, parse_rate
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd

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


def host_ceiling_point(
    figure: str, section: dict[str, Any], model: str, workers: int, launcher: dict[str, Any], **extra: Any
) -> Point:
    """`workers` independent trainings of `model` at once, each its own plain model (the throughput workload's
    `independent`): the host's parallel ceiling for that many processes, with no communication at all."""
    return throughput_point(figure, section, model, workers, launcher, independent=True, **extra)


def consistent_point(figure: str, section: dict[str, Any], launcher: dict[str, Any], **params: Any) -> Point:
    """A consistent-training run (workload `consistent`) of the section's model, one worker per placement entry.

    Every such run uses the section's fixed thread count: bitwise consistency on CPU needs the same kernels, and
    so the same intra-op threads, in every placement.
    """
    return Point(
        figure=figure,
        workload="consistent",
        workers=len(params["placement"]),
        threads_per_worker=section["threads_per_worker"],
        params={
            "model": section["model"],
            "batch_size": section["batch_size"],
            "learning_rate": section["learning_rate"],
            "backend": launcher["backend"],
            "sample_interval_s": launcher["sample_interval_s"],
            **({"warmup_steps": section["warmup_steps"]} if "warmup_steps" in section else {}),
            **params,
        },
    )


def require(condition: bool, figure: str, key: str, problem: str) -> None:
    """A check the schema cannot express; the error names the key path, like a schema error."""
    if not condition:
        raise ConfigError(f"invalid configuration:\n  - figures.{figure}.{key}: {problem}")


def check_rate(figure: str, section: dict[str, Any], key: str = "link_rate") -> None:
    """A rate the section may give (e.g. 200mbit) parses, else an error naming `figures.<figure>.<key>`."""
    if key in section:
        try:
            parse_rate(section[key])
        except TestbedError as error:
            require(False, figure, key, str(error))


def is_ceiling(table: pd.DataFrame) -> pd.Series:
    """The rows of host-ceiling runs (host_ceiling_point)."""
    import pandas as pd

    column = table.get("independent")
    return column.eq(True) if column is not None else pd.Series(False, index=table.index)


def with_efficiency_vs_ceiling(summary: pd.DataFrame, table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`efficiency_vs_ceiling`: each row's per-worker rate ÷ the host-ceiling runs' at the same `keys` and workers
    (NaN, with why in `efficiency_vs_ceiling_skipped`, where no such run was configured), its host load over both
    runs (`efficiency_vs_ceiling_disturbed`, ...), and the ceiling itself (`host_ceiling_per_worker`)."""
    from ddlrepro.host import summaries
    from ddlrepro.host.tables import as_flags

    rows = table[is_ceiling(table) & (table["status"] == "ok")]
    if rows.empty:
        why = "no host-ceiling run (independent processes) in the table"
        return summary.assign(efficiency_vs_ceiling=math.nan, efficiency_vs_ceiling_skipped=why)
    ceiling = summaries.throughput_summary(rows, by=keys).set_index([*keys, "workers"])
    ceiling = ceiling[["per_worker", "foreign_share", "steal_share", "disturbed"]].add_prefix("ceiling_")
    joined = summary.join(ceiling, on=[*keys, "workers"])
    return summary.assign(
        host_ceiling_per_worker=joined["ceiling_per_worker"],
        efficiency_vs_ceiling=joined["per_worker"] / joined["ceiling_per_worker"],
        efficiency_vs_ceiling_skipped=("no host-ceiling run at " + summary["workers"].astype(str) + " workers").where(
            joined["ceiling_per_worker"].isna(), ""
        ),
        efficiency_vs_ceiling_disturbed=as_flags(joined["disturbed"]) | as_flags(joined["ceiling_disturbed"]),
        efficiency_vs_ceiling_foreign_share=joined[["foreign_share", "ceiling_foreign_share"]].max(axis=1),
        efficiency_vs_ceiling_steal_share=joined[["steal_share", "ceiling_steal_share"]].max(axis=1),
    )
