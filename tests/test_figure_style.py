"""Every figure, drawn from a small table recorded from real runs (tests/data/tables/, the tiny workflow), reads
as a figure in a paper: no two texts overlap, no legend covers data, panels lettered, the scale and the machine in
a footer, and disturbed runs marked."""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.collections import Collection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from ddlrepro.host import plotting
from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import figure_references
from ddlrepro.host.figures import FIGURES, draw_figure
from ddlrepro.host.tables import read_table

MACHINE = "1 host; AMD EPYC, 2 cores; no GPU; torch 2.13.0+cpu"
# An axis label ends with its unit in parentheses, or counts something (workers, steps, mini-batches).
UNIT = re.compile(r"\([^()]+\)$|^number of |^training step$|^mini-batch$")
OVERLAP_PX = 1.0  # touching edges are not an overlap
# The figures whose values are timings: every one marks values from disturbed runs.
TIMING_FIGURES = [figure for figure in FIGURES if figure != "easyscale-fig9"]


def drawn(figure: str, table=None) -> Figure:
    references = figure_references().get(figure, [])
    table = read_table(figure_file(figure, "recorded.csv")) if table is None else table
    drawing, _ = draw_figure(figure, table, "smoke", references, MACHINE)
    drawing.canvas.draw()
    return drawing


def visible(text: Text) -> bool:
    return text.get_visible() and bool(text.get_text().strip())


def axis_texts(axis: Axis) -> list[Text]:
    """An axis's label, offset text, and the tick labels it draws (those in its view interval)."""
    if not axis.get_visible():
        return []
    low, high = sorted(axis.get_view_interval())
    coordinate = 0 if axis.axis_name == "x" else 1
    ticks = [
        label
        for label in axis.get_ticklabels(which="both")
        if low - 1e-9 * abs(low) <= label.get_position()[coordinate] <= high + 1e-9 * abs(high)
    ]
    return [axis.label, axis.get_offset_text(), *ticks]


def texts(figure: Figure) -> list[Text]:
    """Every text drawn: suptitle and footer, panel titles, axis labels, tick labels, annotations, legend texts."""
    found = list(figure.texts)
    for panel in figure.axes:
        for child in panel.get_children():
            if isinstance(child, Text):
                found.append(child)
            elif isinstance(child, Legend):
                found += [child.get_title(), *child.get_texts()]
            elif isinstance(child, Axis):
                found += axis_texts(child)
    return [text for text in found if visible(text)]


def numeric(label: str) -> bool:
    if label.startswith("$"):  # mathtext: powers on a log axis
        return True
    try:
        float(label.replace("−", "-"))
    except ValueError:
        return False
    return True


def categorical(axis: Axis) -> bool:
    """An axis of named categories has no unit to state."""
    return not all(numeric(label.get_text()) for label in axis.get_ticklabels())


def overlap(a: Bbox, b: Bbox) -> bool:
    return (
        a.x0 < b.x1 - OVERLAP_PX and b.x0 < a.x1 - OVERLAP_PX and a.y0 < b.y1 - OVERLAP_PX and b.y0 < a.y1 - OVERLAP_PX
    )


def data_points(panel: Axes) -> np.ndarray:
    """The display coordinates of a panel's data: its lines' vertices and points along their segments, markers
    and error bars, and the corners and centres of its bars."""
    points = []
    for line in panel.get_lines():
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        if line.get_linestyle() not in ("None", "none", "") and len(xy) > 1:
            steps = np.linspace(0, 1, 25)[:, None, None]
            xy = (xy[:-1] + steps * (xy[1:] - xy[:-1])).reshape(-1, 2)
        points.append(xy)
    for collection in panel.collections:
        if isinstance(collection, Collection) and len(collection.get_offsets()):
            points.append(collection.get_offset_transform().transform(collection.get_offsets()))
        for path in collection.get_paths():
            points.append(collection.get_transform().transform(path.vertices))
    for patch in panel.patches:
        if isinstance(patch, Rectangle):
            box = patch.get_window_extent()
            points.append(np.array([[box.x0, box.y1], [box.x1, box.y1], [(box.x0 + box.x1) / 2, box.y1]]))
    found = np.concatenate(points) if points else np.empty((0, 2))
    return found[np.isfinite(found).all(axis=1)]


def describe(text: Text) -> str:
    return repr(text.get_text().replace("\n", " ")[:50])


@pytest.mark.parametrize("figure_id", list(FIGURES))
def test_no_two_texts_overlap(figure_id: str) -> None:
    drawing = drawn(figure_id)
    boxes = [(text, text.get_window_extent()) for text in texts(drawing)]
    clashes = [
        f"{describe(a)} × {describe(b)}" for (a, box_a), (b, box_b) in combinations(boxes, 2) if overlap(box_a, box_b)
    ]
    plt.close(drawing)
    assert not clashes, f"{figure_id}: overlapping texts: " + "; ".join(clashes)


@pytest.mark.parametrize("figure_id", list(FIGURES))
def test_no_legend_covers_data(figure_id: str) -> None:
    drawing = drawn(figure_id)
    legends = [panel.get_legend() for panel in drawing.axes if panel.get_legend()] + list(drawing.legends)
    covered = []
    for legend in legends:
        box = legend.get_window_extent()
        for panel in drawing.axes:
            xy = data_points(panel)
            inside = (xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0) & (xy[:, 1] < box.y1)
            if inside.any():
                covered.append(f"legend {[t.get_text() for t in legend.get_texts()][:3]} covers {inside.sum()} points")
    plt.close(drawing)
    assert not covered, f"{figure_id}: " + "; ".join(covered)


@pytest.mark.parametrize("figure_id", list(FIGURES))
def test_shared_style(figure_id: str) -> None:
    """Panels lettered (a), (b), ... in order; every axis label says its unit or is a count; footer with the scale
    and machine; texts inside the figure."""
    drawing = drawn(figure_id)
    panels = [panel for panel in drawing.axes if panel.get_title(loc="left")]
    letters = [panel.get_title(loc="left").split(" ", 1)[0] for panel in panels]
    assert letters == [f"({chr(ord('a') + index)})" for index in range(len(panels))]
    assert drawing.get_layout_engine() is not None and "Constrained" in type(drawing.get_layout_engine()).__name__
    footer = drawing.get_supxlabel()
    assert f"scale: smoke · machine: {MACHINE}" in footer
    assert "/tmp" not in footer and str(Path.home()) not in footer
    figure_box = drawing.bbox
    outside = [describe(t) for t in texts(drawing) if not figure_box.contains(*t.get_window_extent().p0)]
    outside += [describe(t) for t in texts(drawing) if not figure_box.contains(*t.get_window_extent().p1)]
    assert not outside, f"{figure_id}: texts cut off by the figure's edge: {outside}"
    for panel in drawing.axes:
        for axis in (panel.xaxis, panel.yaxis):
            label = axis.get_label_text()
            if label and not categorical(axis):
                assert UNIT.search(label), f"{figure_id}: axis label without a unit: {label!r}"
    plt.close(drawing)


@pytest.mark.parametrize("figure_id", TIMING_FIGURES)
def test_disturbed_runs_are_marked(figure_id: str) -> None:
    """With every run disturbed, every bar of a timing is hatched or every timing point ringed, and the footer
    says so."""
    table = read_table(figure_file(figure_id, "recorded.csv"))
    table = table.assign(disturbed=True, foreign_share=0.6)
    drawing = drawn(figure_id, table)
    footer = drawing.get_supxlabel()
    assert "Disturbed by foreign CPU load up to 0.60" in footer
    hatched = [patch for panel in drawing.axes for patch in panel.patches if patch.get_hatch()]
    rings = [
        collection
        for panel in drawing.axes
        for collection in panel.collections
        if len(collection.get_offsets()) and not len(collection.get_facecolors())
    ]
    assert hatched or rings, f"{figure_id}: disturbed values drawn without a mark"
    plt.close(drawing)


def test_machine_summary_names_no_host() -> None:
    provenance = {
        "launcher_host": {"hostname": "node-17.secret.example", "cpu_model": "AMD EPYC", "cpu_usable": 2},
        "hostnames": ["node-17.secret.example", "node-18.secret.example"],
        "gpus": ["NVIDIA H100"],
        "torch": {"version": "2.13.0+cpu"},
    }
    summary = plotting.machine_summary([provenance, provenance])
    assert summary == "2 hosts; AMD EPYC, 2 cores; NVIDIA H100; torch 2.13.0+cpu"
    assert plotting.machine_summary([]) == "unknown"


def test_every_figure_has_a_recorded_table() -> None:
    assert [figure for figure in FIGURES if not figure_file(figure, "recorded.csv").is_file()] == []
