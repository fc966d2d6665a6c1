"""Size sanity at validation: every point must fit where its launcher will start it, before any job runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddlrepro.host.config import schema_default
from ddlrepro.points import Point


def check_sizes(points: dict[str, dict[str, Point]], launcher: dict[str, Any]) -> None:
    """Raise ConfigError for the first point that cannot fit this machine (local) or the declared cluster limits."""
    check = _checker(launcher)
    for figure_points in points.values():
        for point in figure_points.values():
            check(point)


def _checker(launcher: dict[str, Any]) -> Callable[[Point], None]:
    if launcher["name"] == "slurm":
        from ddlrepro.host.launchers.slurm import check_cluster_limits

        return lambda point: check_cluster_limits(point, launcher["slurm"])
    if launcher["name"] == "kubernetes":
        from ddlrepro.host.launchers.kubernetes import check_cluster_limits as check_pods

        return lambda point: check_pods(point, launcher["kubernetes"])
    from ddlrepro.host.launchers.local import check_fits_machine

    factor = launcher.get("oversubscription", schema_default("launcher", "oversubscription"))
    return lambda point: check_fits_machine(point, factor)
