"""Typed placements: which emulated device type (launcher.device_types; rank/devicetypes.py) each process runs on.

A placement entry is a count of ESTs (the default type) or [count, type]. A point's params carry `device_types`
(one resolved type per process) only when some process is not on the default type (native ISA, the figure's
threads, no quota), so an untyped run stays the same point whatever way it was written; with D2 they also carry
`kernels`, the reference type whose kernels every process runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from ddlrepro.host.figures.common import consistent_point, require
from ddlrepro.rank.devicetypes import DEFAULT_TYPE, ISA_ENVIRONMENT

if TYPE_CHECKING:
    import pandas as pd

    from ddlrepro.points import Point

ISA_ORDER = list(ISA_ENVIRONMENT)  # most basic first


def resolve(name: str, types: dict[str, Any], threads: int) -> dict[str, Any]:
    """A type by name as a point records it: {name, isa, threads, cpu_quota} (threads null = `threads`)."""
    if name == DEFAULT_TYPE:
        return {"name": DEFAULT_TYPE, "isa": "native", "threads": threads, "cpu_quota": 1.0}
    spec = types[name]
    return {"name": name, "isa": spec["isa"], "threads": spec["threads"] or threads, "cpu_quota": spec["cpu_quota"]}


def parse_placement(placement: list[Any], types: dict[str, Any], figure: str, key: str) -> tuple[list[int], list[str]]:
    """ESTs per process and each process's type name (`default` for a bare count); errors name `key`."""
    counts, names = [], []
    for index, entry in enumerate(placement):
        count, name = (entry, DEFAULT_TYPE) if isinstance(entry, int) else entry
        require(
            name in types or name == DEFAULT_TYPE,
            figure,
            f"{key}[{index}]",
            f"unknown device type {name!r}; launcher.device_types defines {', '.join(sorted(types)) or 'none'}",
        )
        counts.append(count)
        names.append(name)
    return counts, names


def is_default(resolved: dict[str, Any], threads: int) -> bool:
    return cast("bool", resolved["isa"] == "native" and resolved["threads"] == threads and resolved["cpu_quota"] >= 1)


def most_basic(names: list[str], types: dict[str, Any], threads: int) -> str:
    """The type with the lowest ISA, then the fewest threads (D2's default reference)."""
    resolved = [resolve(name, types, threads) for name in names]
    return cast("str", min(resolved, key=lambda spec: (ISA_ORDER.index(spec["isa"]), spec["threads"]))["name"])


def typed_params(names: list[str], types: dict[str, Any], threads: int, kernels: str | None) -> dict[str, Any]:
    """`device_types` (and, with D2, `kernels`) for processes on types `names`; {} when all run the default type."""
    resolved = [resolve(name, types, threads) for name in names]
    if kernels is None and all(is_default(spec, threads) for spec in resolved):
        return {}
    params: dict[str, Any] = {"device_types": resolved}
    if kernels is not None:
        reference = resolve(kernels, types, threads)
        params["kernels"] = {"name": reference["name"], "isa": reference["isa"], "threads": reference["threads"]}
    return params


def point_threads(params: dict[str, Any], threads: int) -> int:
    """The most threads any process of a typed point runs (what the launcher must fit on the machine)."""
    if params.get("kernels"):
        return cast("int", params["kernels"]["threads"])
    return max((spec["threads"] for spec in params.get("device_types", [])), default=threads)


def quota_status(table: pd.DataFrame) -> str:
    """Whether the typed runs' CPU quotas were applied: `applied`, `not applied: <why>`, or `none wanted`."""
    records = table[table["metric"] == "cpu_quota_cores"]
    details = records["detail"].dropna().astype(str) if "detail" in records else records["metric"].iloc[0:0]
    wanted = details[details != "none wanted"]
    failed = wanted[wanted != "applied"]
    if len(failed):
        return cast("str", failed.iloc[0])
    return "applied" if len(wanted) else "none wanted"


def typed_point(
    figure: str,
    section: dict[str, Any],
    launcher: dict[str, Any],
    names: list[str],
    kernels: str | None = None,
    **params: Any,
) -> Point:
    """A consistent-training run (common.consistent_point) whose processes emulate the device types `names`, one
    each, at the section's threads per worker."""
    threads = section["threads_per_worker"]
    typing = typed_params(names, launcher["device_types"], threads, kernels)
    point = consistent_point(figure, section, launcher, **params, **typing)
    return replace(point, threads_per_worker=point_threads(typing, threads))
