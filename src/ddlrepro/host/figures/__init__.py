"""Figures: one folder each (host/catalog.py), its module declaring its points (`points`), its summary
(`summarize`) and its plot (`plot`). The registry is here.

Figure modules are imported while Snakemake builds its DAG, so they import pandas/matplotlib only inside functions.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from ddlrepro.host.catalog import figure_file, figure_ids, module_name
from ddlrepro.host.errors import UserError
from ddlrepro.host.launch import launch_of
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure as MplFigure

# Every figure: a folder of this package each (host/catalog.py lists what one holds), found on disk.
FIGURES = {figure: module_name(figure) for figure in figure_ids()}


class FigureModule(Protocol):
    """What a figure's module declares (its folder's __init__.py). Optional, where a figure needs them:
    `missing_data(section, download)` (what data it waits for), `shard_settings(section)` (its packed shards),
    `PLOTS_ONE_REPLICATE` (draws one replicate: a timeline), `ENVIRONMENTS_IN_TABLE` (compare draws it itself),
    and a simulated step: `simulate_table(table, settings, machine)`, `SIMULATION_KEYS`, `simulation_inputs`."""

    ID: str
    TITLE: str

    def points(self, section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
        """The runs the figure needs, from its config section (schema defaults filled in) and the launcher's."""

    def summarize(self, table: pd.DataFrame) -> pd.DataFrame:
        """What the checks read, from the runs' tidy table (or its simulation); no matplotlib."""

    def plot(
        self, table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]
    ) -> MplFigure:
        """The figure, drawn from the table and its summary (and the papers' numbers it draws in)."""


class SimulatedFigure(FigureModule, Protocol):
    """A figure whose plot draws a simulation of its runs' table (is_simulated): its simulated step."""

    SIMULATION_KEYS: tuple[str, ...]

    def simulation_inputs(self, section: dict[str, Any]) -> dict[str, Path]:
        """The files the simulation reads besides its runs, by the name a bundle keeps each under."""

    def with_inputs_in(self, section: dict[str, Any], folder: Path) -> dict[str, Any]:
        """The section reading its input files from `folder` (a bundle's copies)."""

    def simulate_table(self, table: pd.DataFrame, section: dict[str, Any], machine: str) -> pd.DataFrame:
        """The simulation of the runs' table."""


def simulated_module(figure: str) -> SimulatedFigure:
    if not is_simulated(figure):
        raise KeyError(f"figure {figure!r} has no simulated step")
    module: Any = importlib.import_module(FIGURES[figure])
    return cast("SimulatedFigure", module)


def figure_module(figure: str) -> FigureModule:
    if figure not in FIGURES:
        raise KeyError(f"unknown figure {figure!r}; valid figures: {', '.join(FIGURES)}")
    module: Any = importlib.import_module(FIGURES[figure])
    return cast("FigureModule", module)


def enabled_figures(config: dict[str, Any]) -> list[str]:
    return [figure for figure in FIGURES if config["figures"][figure]["enabled"]]


def waiting_for_data(config: dict[str, Any]) -> dict[str, str]:
    """Enabled figures whose input data is not here and will not be fetched, each with what it waits for (a
    figure module's `missing_data`): they are skipped, so that one figure's data never blocks the others."""
    waiting = {}
    for figure in enabled_figures(config):
        missing_data = getattr(figure_module(figure), "missing_data", None)
        if missing_data and (problem := missing_data(config["figures"][figure], config["download"])):
            waiting[figure] = problem
    return waiting


def planned_figures(config: dict[str, Any]) -> list[str]:
    """The enabled figures the workflow builds: those not waiting for data."""
    waiting = waiting_for_data(config)
    return [figure for figure in enabled_figures(config) if figure not in waiting]


def figure_points(config: dict[str, Any], replicated: Collection[str] = ()) -> dict[str, dict[str, Point]]:
    """Every planned figure's points by id (ids are unique within a figure); a figure in `replicated` (one with
    timing claims, checks.timing_figures) has each point `checks.replicates` times, replicates 0, 1, ..."""
    expanded = {}
    for figure in planned_figures(config):
        points = figure_module(figure).points(config["figures"][figure], config["launcher"])
        copies = config["checks"]["replicates"] if figure in replicated else 1
        if copies > 1 and any(launch_of(point).resumes for point in points):
            raise UserError(f"{figure}: points that resume another point's checkpoint cannot be replicated")
        replicas = [replace(point, replicate=replicate) for replicate in range(copies) for point in points]
        expanded[figure] = {point.id: point for point in replicas}
    return expanded


def previous_replicate(points: dict[str, Point], point: Point) -> list[Point]:
    """The points a replicate waits for: every point of the replicate before it (none for replicate 0)."""
    return [other for other in points.values() if other.replicate == point.replicate - 1]


def is_simulated(figure: str) -> bool:
    """A figure whose plot draws a simulation of its runs' table (its module's `simulate_table`), not the table."""
    return hasattr(figure_module(figure), "simulate_table")


def simulated_table_name(figure: str) -> str:
    """Where the workflow writes a simulated figure's simulation table, beside its runs' table."""
    return f"{figure}.simulated.csv"


def simulation_settings(figure: str, section: dict[str, Any]) -> dict[str, Any]:
    """The keys of a simulated figure's section that its simulation reads (its rule's params)."""
    return {key: section[key] for key in simulated_module(figure).SIMULATION_KEYS}


def simulation_inputs(figure: str, section: dict[str, Any]) -> dict[str, Path]:
    """The files a simulated figure's simulation reads besides its runs, by the name a bundle keeps each under."""
    return simulated_module(figure).simulation_inputs(section)


def write_simulated_table(figure: str, table: Path, settings: dict[str, Any], runs: list[Path], out: Path) -> None:
    """A simulated figure's simulation table, from its runs' tidy table and its simulation settings."""
    from ddlrepro.host.tables import read_table

    simulate_replicates(figure, read_table(table), settings, runs_machine(runs)).to_csv(out, index=False)


def simulate_replicates(figure: str, table: pd.DataFrame, settings: dict[str, Any], machine: str) -> pd.DataFrame:
    """A simulated figure's simulation of its runs' table; with replicates, one simulation per replicate's runs
    (column `replicate`): a claim on a simulation of measured profiles is a timing claim, judged over simulations
    of fresh profile runs."""
    import pandas as pd

    from ddlrepro.host.tables import by_replicate

    module, replicates = simulated_module(figure), by_replicate(table)
    if len(replicates) == 1:
        return module.simulate_table(table, settings, machine)
    simulations = [
        module.simulate_table(rows.reset_index(drop=True), settings, machine).assign(replicate=replicate)
        for replicate, rows in replicates.items()
    ]
    return pd.concat(simulations, ignore_index=True)


def figure_source(figure: str, drawn: bool = True) -> list[str]:
    """The code a figure's summary (and, `drawn`, its plot) depends on: its module, the helpers beside it,
    summaries.py (and plotting.py); for a simulated figure also the simulator's modules (editing one reruns the
    simulation)."""
    here = Path(__file__).parent
    helpers = [str(path) for path in sorted(here.glob("*.py"))]
    simulator = sorted(str(path) for path in (here.parent / "simulator").rglob("*.py")) if is_simulated(figure) else []
    shared = [here.parent / "summaries.py", *([here.parent / "plotting.py"] if drawn else [])]
    own = str(figure_file(figure, "__init__.py"))
    return [own, *helpers, *map(str, shared), *simulator]


def draw_figure(
    figure: str, table: pd.DataFrame, scale: str, references: list[dict[str, Any]], machine: str
) -> tuple[MplFigure, pd.DataFrame]:
    """A figure in the shared style (footer: scale, machine, which replicates are drawn) and the summary drawn."""
    from ddlrepro.host import plotting
    from ddlrepro.host.tables import by_replicate

    module, replicates, shown = figure_module(figure), by_replicate(table), table
    if len(replicates) > 1:  # a timeline figure draws one replicate: replicates would overlay each other
        one = getattr(module, "PLOTS_ONE_REPLICATE", False)
        shown = replicates[min(replicates)].reset_index(drop=True) if one else table
        machine += f" · {f'replicate {min(replicates)}' if one else 'all'} of {len(replicates)} replicates drawn"
    summary = module.summarize(shown)
    drawing = module.plot(shown, summary, scale, references)
    plotting.finish(drawing, scale, machine)
    return drawing, summary


def runs_machine(results: list[Path]) -> str:
    """The machine the runs behind `results` (their result.json files) ran on, from their provenance."""
    from ddlrepro.host import plotting

    provenances = [json.loads((result.parent / "provenance.json").read_text()) for result in results]
    return plotting.machine_summary(provenances)


def render_figure(
    figure: str,
    table: Path,
    outputs: tuple[Path, Path, Path | None],
    scale: str,
    references: list[dict[str, Any]],
    runs: list[Path],
) -> None:
    """Draw a figure from its tidy table and write its png and pdf `outputs` (and, where the third is a path, the
    summary CSV the checks read: write_summary)."""
    from ddlrepro.host import plotting
    from ddlrepro.host.tables import read_table

    png, pdf, summary = outputs
    runs_table = read_table(table)
    drawing, _ = draw_figure(figure, runs_table, scale, references, runs_machine(runs))
    plotting.save(drawing, str(png), str(pdf))
    if summary is not None:
        write_summary(figure, table, summary)


def write_summary(figure: str, table: Path, out: Path) -> None:
    """The summary CSV the checks read (replicate_summaries), from the figure's tidy table; no matplotlib."""
    from ddlrepro.host.tables import read_table

    replicate_summaries(figure, read_table(table)).to_csv(out, index=False)


def replicate_summaries(figure: str, table: pd.DataFrame) -> pd.DataFrame:
    """What the checks judge: with replicates, the figure's summary of each replicate's runs alone, one block per
    replicate (column `replicate`), so a relation pairs values of the same replicate; else the figure's summary."""
    import pandas as pd

    from ddlrepro.host.tables import by_replicate

    module, replicates = figure_module(figure), by_replicate(table)
    if len(replicates) == 1:
        return module.summarize(table)
    summaries = [
        module.summarize(rows.reset_index(drop=True)).assign(replicate=replicate)
        for replicate, rows in replicates.items()
    ]
    return pd.concat(summaries, ignore_index=True)
