"""Shared drawing for figures (matplotlib; the analysis their summaries share is summaries.py). Imported only when a
figure is drawn."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import matplotlib

matplotlib.use("Agg")

import textwrap
from string import ascii_lowercase

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib import ticker
from matplotlib.container import BarContainer

from ddlrepro.host.tables import as_flags

REFERENCE_STYLE: dict[str, Any] = {"color": "black", "marker": "*", "markersize": 11, "linestyle": "none", "zorder": 5}
# matplotlib's own copies of seaborn's whitegrid theme, notebook context and colour-blind-safe palette (Okabe–Ito-like):
# seaborn's look without importing seaborn, whose scipy.stats cost every plot job 0.9 s here.
STYLE = ["seaborn-v0_8-whitegrid", "seaborn-v0_8-notebook", "seaborn-v0_8-colorblind"]
COLOURS = matplotlib.style.library["seaborn-v0_8-colorblind"]["axes.prop_cycle"].by_key()["color"]
FOOTER_POINTS = 8
NOTE_WIDTH = 40  # characters per line of a skipped-points note
# Disturbed values (runs that shared the host with foreign CPU load): hatched bars, ringed points; by shape, not
# colour, so that they read in grey and to colour-blind readers.
DISTURBED_HATCH = "xx"
DISTURBED_RING: dict[str, Any] = {"s": 160, "facecolors": "none", "edgecolors": "black", "linewidths": 1.2, "zorder": 6}


def drawn_references(references: list[dict[str, Any]], column: str, key: str, scale: str) -> pd.DataFrame:
    """The references to draw on a panel of `column`: (series, the `key` of their selector, value).

    References with a `series` label are drawn; those with a unit (absolute numbers of the papers' hardware) only
    at paper scale, unitless ones (efficiencies, ratios) at every scale.
    """
    rows = [
        {"series": r["series"], key: r["measured"].get("where", {}).get(key), "value": r["value"]}
        for r in references
        if "series" in r and r["measured"]["column"] == column and (scale == "paper" or "unit" not in r)
    ]
    return pd.DataFrame(rows, columns=["series", key, "value"])


def new_figure(
    panels: int, title: str, panel_size: tuple[float, float] = (5.2, 4.2), table_below: bool = False
) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of `panels` panels side by side in the shared style: constrained layout, colour-blind-safe palette,
    panels lettered (a), (b), ... in their top left corner (`panel_title` adds a title after the letter).
    `table_below`: the last panel gets a row of its own under the others, as wide as the figure (for a table)."""
    plt.style.use(STYLE)
    width, height = panel_size
    if table_below:
        top = [str(index) for index in range(panels - 1)]
        size = (width * len(top), height * 1.6)
        mosaic = [top, ["table"] * len(top)]
        layout: Any = mosaic  # a list of rows of names, which subplot_mosaic's stubs type more narrowly
        figure, named = plt.subplot_mosaic(layout, figsize=size, height_ratios=[1, 0.6], layout="constrained")
        axes = [named[name] for name in [*top, "table"]]
    else:
        figure, grid = plt.subplots(1, panels, figsize=(width * panels, height), squeeze=False, layout="constrained")
        axes = list(grid[0])
    figure.suptitle(title, fontsize="large")
    for letter, axis in zip(ascii_lowercase, axes, strict=False):
        axis.set_title(f"({letter})", loc="left", fontweight="bold")
    return figure, axes


def panel_title(axis: plt.Axes, title: str) -> None:
    """Title a panel after its letter: `(b) resnet20`."""
    letter = axis.get_title(loc="left").split(" ", 1)[0]
    axis.set_title(f"{letter} {title}", loc="left", fontweight="bold", fontsize="medium")


def legend(axis: plt.Axes, **options: Any) -> None:
    """The panel's legend outside its data area, to the right of the panel (constrained layout makes room)."""
    axis.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small", **options)


def add_footer(figure: plt.Figure, line: str) -> None:
    """Add a line to the figure's footer (below every panel; constrained layout makes room)."""
    width_chars = int(figure.get_figwidth() * 72 / (FOOTER_POINTS * 0.6))
    lines = [*filter(None, figure.get_supxlabel().split("\n")), *textwrap.wrap(line, width_chars)]
    figure.supxlabel("\n".join(lines), x=0.005, ha="left", fontsize=FOOTER_POINTS, color="dimgrey")


def finish(figure: plt.Figure, scale: str, machine: str) -> None:
    """The footer's last line: the scale of the runs and the machine they ran on."""
    add_footer(figure, f"scale: {scale} · machine: {machine}")


def machine_summary(provenances: list[dict[str, Any]]) -> str:
    """What the runs ran on, without host names or paths: hosts, CPU model and cores, GPUs, torch."""
    if not provenances:
        return "unknown"
    hosts = max(len(p.get("hostnames") or []) for p in provenances) or 1
    cpus = sorted({f"{p['launcher_host']['cpu_model']}, {p['launcher_host']['cpu_usable']} cores" for p in provenances})
    gpus = sorted({gpu for p in provenances for gpu in p.get("gpus") or []})
    torch = sorted({p["torch"]["version"] for p in provenances if p.get("torch", {}).get("version")})
    parts = [f"{hosts} host{'s' if hosts > 1 else ''}", " / ".join(cpus), ", ".join(gpus) if gpus else "no GPU"]
    return "; ".join([*parts, *([f"torch {' / '.join(torch)}"] if torch else [])])


def integer_ticks(axis: Any) -> None:
    """Ticks at integers only, on an axis (`axes.xaxis`) whose locator is matplotlib's linear one (AutoLocator)."""
    locator = axis.get_major_locator()
    if not isinstance(locator, ticker.MaxNLocator):
        raise TypeError(f"integer ticks need a linear axis's locator, not {type(locator).__name__}")
    locator.set_params(integer=True)


def workers_axis(axis: plt.Axes, workers: Iterable[int], label: str = "number of workers") -> None:
    """Log-2 axis ticked at the measured worker counts."""
    ticks = sorted(set(int(n) for n in workers))
    axis.set_xscale("log", base=2)
    axis.set_xticks(ticks, [str(n) for n in ticks])
    axis.set_xticks([], minor=True)
    axis.set_xlabel(label)


def errorbar_lines(axis: plt.Axes, summary: pd.DataFrame, y: str, err: str, hue: str) -> None:
    """One line with error bars per `hue` against workers; values from disturbed runs ringed."""
    for name, rows in summary.groupby(hue, sort=True):
        axis.errorbar(rows["workers"], rows[y], yerr=rows[err], marker="o", capsize=4, label=str(name))
    ring_disturbed(axis, summary["workers"], summary[y], summary["disturbed"])


def grouped_bars(
    axis: plt.Axes, data: pd.DataFrame, x: str, y: str, hue: str, colours: dict[Any, Any] | None = None
) -> None:
    """Bars of `y` per `x` category, one bar per `hue` side by side, in the order the rows come; the bars of
    disturbed rows (a `disturbed` column) hatched."""
    categories, groups = list(dict.fromkeys(data[x])), list(dict.fromkeys(data[hue]))
    colours = colours or palette(groups)
    width = 0.8 / len(groups)
    for index, group in enumerate(groups):
        rows = data[data[hue] == group]
        positions = [categories.index(category) - 0.4 + width * (index + 0.5) for category in rows[x]]
        bars = axis.bar(positions, rows[y], width=width, color=colours[group], label=str(group))
        hatch_disturbed(bars, as_flags(rows["disturbed"]))
    axis.set_xticks(range(len(categories)), categories)
    axis.set_xlabel(x)


def save(figure: plt.Figure, png: str, pdf: str) -> None:
    figure.savefig(png, dpi=130)
    figure.savefig(pdf)
    plt.close(figure)


def note_skipped(axis: plt.Axes, skipped: pd.DataFrame, by: list[str]) -> None:
    """Say on the panel which points were skipped and why: never leave a gap that reads as a measurement."""
    if skipped.empty:
        return
    lines = [" / ".join(str(row[key]) for key in by) + f": {row['reason']}" for _, row in skipped.iterrows()]
    wrapped = [textwrap.fill(line, NOTE_WIDTH, subsequent_indent="  ") for line in lines]  # within one panel
    axis.text(
        0.02,
        0.98,
        "\n".join(wrapped),
        transform=axis.transAxes,
        va="top",
        fontsize="small",
        color="firebrick",
        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "firebrick"},
    )


def note_skipped_slot(axis: plt.Axes, position: float, reason: str) -> None:
    """Write why a bar is missing up its empty slot, from the bottom of the panel whatever its y range."""
    axis.annotate(
        reason,
        (position, 0.02),
        xycoords=axis.get_xaxis_transform(),
        ha="center",
        va="bottom",
        rotation=90,
        color="firebrick",
    )


def note_disturbed(axis: plt.Axes, summary: pd.DataFrame, label: list[str]) -> None:
    """Say in the footer which plotted values came from runs disturbed by foreign CPU load (hatched bars, ringed
    points): they are flagged, not judged; the report gives the command that reruns them."""
    if "disturbed" not in summary:
        return
    rows = summary[as_flags(summary["disturbed"])]
    if rows.empty:
        return
    values = "; ".join(", ".join(f"{key}={row[key]}" for key in label) for _, row in rows.iterrows())
    figure = axis.get_figure(root=True)
    if figure is None:
        return
    add_footer(
        figure,
        f"Disturbed by foreign CPU load up to {rows['foreign_share'].max():.2f} (hatched bars, ringed points;"
        f" rerun on a quiet machine): {values}",
    )


def hatch_disturbed(bars: BarContainer, disturbed: Iterable[bool]) -> None:
    """Hatch the bars whose runs were disturbed."""
    for bar, flagged in zip(bars, disturbed, strict=True):
        if flagged:
            bar.set_hatch(DISTURBED_HATCH)
            bar.set_edgecolor("black")


def ring_disturbed(axis: plt.Axes, x: Iterable[Any], y: Iterable[float], disturbed: Iterable[bool]) -> None:
    """Ring the plotted points whose runs were disturbed."""
    flagged = [(px, py) for px, py, flag in zip(x, y, disturbed, strict=True) if flag]
    if flagged:
        xs, ys = zip(*flagged, strict=True)
        axis.scatter(xs, ys, **DISTURBED_RING)


def palette(keys: Iterable[Any]) -> dict[Any, str]:
    """One colour of the shared palette per key, in order (repeating after its ten)."""
    return {key: COLOURS[index % len(COLOURS)] for index, key in enumerate(keys)}


def sequential(name: str, count: int) -> list[tuple[float, float, float, float]]:
    """`count` colours evenly inside colour map `name`, its two ends left out (as seaborn samples a map)."""
    colour_map = matplotlib.colormaps[name]
    return [colour_map((index + 1) / (count + 1)) for index in range(count)]
