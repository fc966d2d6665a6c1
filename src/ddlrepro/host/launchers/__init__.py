"""Launchers turn a point into a job (`render(point, run_dir) -> JobSpec`) and run it (`execute(spec, output)`).

The registry is the config schema: each launcher's section `launcher.<name>` names its class in `x-launcher`
(`module:Class`), so adding a launcher is its module and its schema section, nothing else. A launcher is built
once from the config's `launcher` and `images` sections, its defaults filled in by the schema.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import io
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from ddlrepro.host.config import ConfigError, config_schema, validate_config
from ddlrepro.host.launch import launch_of
from ddlrepro.host.launchers.base import Launcher
from ddlrepro.points import Point

if TYPE_CHECKING:  # every shipped launcher fits the Launcher protocol: mypy checks this line (make lint)
    from ddlrepro.host.launchers.kubernetes import KubernetesLauncher
    from ddlrepro.host.launchers.local import LocalLauncher
    from ddlrepro.host.launchers.slurm import SlurmLauncher

    SHIPPED: tuple[type[Launcher], ...] = (LocalLauncher, SlurmLauncher, KubernetesLauncher)

SECTIONS = ("launcher", "images")
AUTO = "auto"  # launcher.name: the launcher where the run executes (resolved_launcher_name)


def launcher_classes() -> dict[str, str]:
    """Every launcher's name and its class (`module:Class`), as the schema declares them."""
    sections = config_schema()["properties"]["launcher"]["properties"]
    return {name: section["x-launcher"] for name, section in sections.items() if "x-launcher" in section}


def launcher_class(name: str) -> type[Launcher]:
    classes = launcher_classes()
    if name not in classes:
        raise ConfigError(f"launcher.name: {name!r} is not valid; valid values: {', '.join(sorted(classes))}")
    module, _, attribute = classes[name].partition(":")
    return cast("type[Launcher]", getattr(importlib.import_module(module), attribute))


def resolved_launcher_name(
    name: str,
    executor: str | Callable[[], str | None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The launcher `launcher.name` names; `auto`: slurm where the run executes inside a Slurm allocation
    (SLURM_JOB_ID in `environ`, this process's unless given) or Snakemake's `executor` submits to Slurm
    (slurm, or slurm-jobstep inside its job), else local. `executor` may be a function, asked only when needed."""
    if name != AUTO:
        return name
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_JOB_ID"):
        return "slurm"
    executor = executor() if callable(executor) else executor
    return "slurm" if (executor or "").startswith("slurm") else "local"


def snakemake_arguments(argv: list[str]) -> argparse.Namespace | None:
    """Snakemake's options as its own parser reads the command line `argv` (profiles included: the Snakefile is
    read before Snakemake sets its executor or dry run on the workflow); None when `argv` is not Snakemake's."""
    from snakemake.cli import parse_args

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the parser announces the profiles again
            _, args = parse_args(argv)
    except SystemExit:
        return None
    return cast("argparse.Namespace | None", args)


def snakemake_executor(argv: list[str]) -> str | None:
    """The executor Snakemake runs with (None when `argv` is not Snakemake's)."""
    args = snakemake_arguments(argv)
    return args.executor if args else None


def snakemake_dry_run(argv: list[str]) -> bool:
    """Whether Snakemake only plans (-n): then a point that would not fit here is told, not refused."""
    args = snakemake_arguments(argv)
    return bool(args and args.dryrun)


def configured_launcher(config: dict[str, Any] | None = None, image: dict[str, Any] | None = None) -> Launcher:
    """The launcher the config's `launcher.name` picks (`auto` resolved where this process runs), built from its
    `launcher` and `images` sections (what is left out takes the schema's default). `image`: the record of the
    image the workflow built, if any."""
    given = {key: copy.deepcopy(value) for key, value in (config or {}).items() if key in SECTIONS}
    sections = validate_config(given, partial=True)
    sections["launcher"]["name"] = resolved_launcher_name(sections["launcher"]["name"])
    launcher = launcher_class(sections["launcher"]["name"])
    return launcher(launcher.options_type.from_config(sections, image))


def check_points(points: dict[str, dict[str, Point]], launcher: Launcher) -> None:
    """Raise ConfigError naming every figure with a point the launcher cannot run: an elastic run it cannot host
    (naming the launchers that can), or one that cannot fit where it would start."""
    problems = point_problems(points, launcher)
    if problems:
        raise ConfigError("invalid configuration for this launcher:\n" + "\n".join(f"  - {p}" for p in problems))


def point_problems(points: dict[str, dict[str, Point]], launcher: Launcher) -> list[str]:
    """Each figure's first point the launcher cannot run, and why."""
    problems = []
    for figure, figure_points in points.items():
        try:
            for point in figure_points.values():
                check_hostable(figure, point, launcher)
                launcher.check_fits(point)
        except ConfigError as error:
            problems.append(str(error).removeprefix("invalid configuration:\n  - "))
    return problems


def check_hostable(figure: str, point: Point, launcher: Launcher) -> None:
    runtime = launch_of(point).runtime
    if runtime is None or runtime in launcher.elastic_runtimes:
        return
    hosts = [name for name in launcher_classes() if runtime in launcher_class(name).elastic_runtimes]
    raise ConfigError(
        f"{figure} needs elastic runs ({runtime}); the {launcher.name} launcher cannot host them: disable it "
        f"(figures.{figure}.enabled: false) or use {' or '.join(hosts) or 'another launcher'}"
    )
