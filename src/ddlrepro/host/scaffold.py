"""`ddlrepro new-figure ID`: a new figure's folder (host/catalog.py), from a template that the workflow takes to a
plotted, checked and reported figure as it is: training throughput per worker against the number of workers, on
the shared throughput workload. Its author then changes the points, the summary and the plot to their paper's."""

from __future__ import annotations

import json
from pathlib import Path

from ddlrepro.host.catalog import FIGURE_ID, figure_folder, figure_ids
from ddlrepro.host.errors import UserError

MODULE = '''"""{title}.

Points: one throughput run per workers count (`workers`), of `model` on synthetic images (the shared
throughput workload: warm-up batches, then timed iterations). Summary: per workers, images/s per worker and
the scaling efficiency against the smallest run. Plot: per-worker images/s against workers.
Started by `ddlrepro new-figure`: change the points, the summary and the plot to your paper's figure, cite the
paper or artifact beside every parameter you take from it (paper.yaml), and its claims in references.yaml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlrepro.host.figures.common import throughput_point
from ddlrepro.points import Point

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

ID = "{figure}"
TITLE = {title_python}


def points(section: dict[str, Any], launcher: dict[str, Any]) -> list[Point]:
    return [throughput_point(ID, section, section["model"], workers, launcher) for workers in section["workers"]]


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per workers: per-worker img/s (mean, 95 % spread), total, efficiency against the smallest run. What the
    checks read: pandas only, no matplotlib."""
    from ddlrepro.host import summaries

    return summaries.throughput_summary(table, by=["model"])


def plot(table: pd.DataFrame, summary: pd.DataFrame, scale: str, references: list[dict[str, Any]]) -> Figure:
    from ddlrepro.host import plotting

    figure, (axis,) = plotting.new_figure(1, TITLE)
    plotting.errorbar_lines(axis, summary, "per_worker", "confidence", hue="model")
    axis.set_ylabel("throughput per worker (images/s)")
    axis.set_ylim(bottom=0)
    plotting.workers_axis(axis, summary["workers"])
    plotting.legend(axis, title="model")
    plotting.note_disturbed(axis, summary, ["model", "workers"])
    return figure
'''

SCHEMA = """description: {title_yaml}
$ref: "#/$defs/throughput_protocol"
unevaluatedProperties: false
required: [model]
properties:
  workers: {{$ref: "#/$defs/worker_counts"}}
  model: {{$ref: "#/$defs/model"}}
"""

SMOKE = """# Sizes for a 2-core CPU: a few seconds a run (say why beside each value you change).
model: smallnet
image_size: 32
workers: [1, 2]
batch_size: 8
warmup_batches: 2
iterations: 3
batches_per_iteration: 2
"""

PAPER = """# Every value with where the paper or its artifact gives it (`ours:` and why where neither does).
model: {{value: resnet50, source: "ours: the template's; name the paper's model and its section"}}
workers: {{value: [1, 2, 4, 8], source: "ours: the template's; the paper's worker counts"}}
batch_size: {{value: 32, source: "ours: the template's; the paper's per-worker batch"}}
warmup_batches: {{value: 10, source: "ours: the template's"}}
iterations: {{value: 10, source: "ours: the template's"}}
batches_per_iteration: {{value: 10, source: "ours: the template's"}}
"""

REFERENCES = """# The paper's claims this figure is checked against (schemas/references.schema.yaml in the package).
- id: every-run-measured
  claim: Every workers count trains and reports a throughput (a deterministic check of the template's).
  scale: any
  measured: {{column: per_worker, aggregate: min}}
  compare: ">"
  against: 0
"""

CAPTION = """{title}. Training throughput per worker (images/s, mean ± 1.96·std over every worker's timed iterations)
against the number of data-parallel workers, on synthetic images. Say here what the reader sees and how it was
measured; it is printed under the figure in the report.
"""

TEMPLATES = {
    "__init__.py": MODULE,
    "schema.yaml": SCHEMA,
    "smoke.yaml": SMOKE,
    "paper.yaml": PAPER,
    "references.yaml": REFERENCES,
    "caption.rst": CAPTION,
}


def new_figure(figure: str, title: str | None = None) -> Path:
    """Write figure `figure`'s folder from the templates; UserError for a bad or taken id."""
    if not FIGURE_ID.match(figure):
        raise UserError(f"{figure!r} is not a figure id: lowercase letters and digits, words joined by '-'")
    folder = figure_folder(figure)
    if figure in figure_ids() or folder.exists():
        raise UserError(f"figure {figure!r} exists already ({folder})")
    title = " ".join((title or figure.replace("-", " ").capitalize()).split())  # one line
    if '"' in title or "\\" in title:
        raise UserError("--title: no double quotes or backslashes (it becomes the module's docstring)")
    forms = {"figure": figure, "title": title, "title_python": repr(title), "title_yaml": json.dumps(f"{title}.")}
    folder.mkdir(parents=True)
    for name, template in TEMPLATES.items():
        (folder / name).write_text(template.format(**forms))
    figure_ids.cache_clear()
    return folder
