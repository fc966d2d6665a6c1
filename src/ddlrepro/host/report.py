"""A self-contained HTML report: a summary of the checks against the papers, then every built figure with its
caption, summary table and checks, and where it was built."""

from __future__ import annotations

import base64
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import jinja2
import pandas as pd

from ddlrepro.host.catalog import caption_figure
from ddlrepro.host.checks import headline
from ddlrepro.host.figures import FIGURES, figure_module
from ddlrepro.host.provenance import git_state, host_inventory
from ddlrepro.host.redaction import redact
from ddlrepro.host.tables import as_flags

CHECK_COLUMNS = ["check", "tier", "status", "measured", "low", "high", "n", "reference", "unit", "reason", "claim"]
INTERVAL_SVG = (120, 14)  # width and height of a timing check's drawing: its interval against the band it must clear
SIGNIFICANT_DIGITS = 4  # what the report shows; the CSV and TSV files keep full precision
EMPTY = pd.Series(dtype=float)  # a column a table made before it existed lacks
DECIMAL = re.compile(r"\d+\.\d+(?:[eE][-+]?\d+)?")


def figure_entry(figure: str, results: Path, checks: pd.DataFrame, caption: Path | None) -> dict[str, Any]:
    """One figure's section, with the text of its caption file (the workflow's `<figure>.rst`) when it has one."""
    summary = pd.read_csv(results / "tables" / f"{figure}.summary.csv")
    own_checks = checks[checks["figure"] == figure]
    runs = figure_runs(figure, results)
    return {
        "id": figure,
        "title": figure_module(figure).TITLE,
        "caption": caption_html(caption) if caption else "",
        "png": base64.b64encode((results / "figures" / f"{figure}.png").read_bytes()).decode(),
        "summary": summary.to_html(index=False, float_format=significant, border=0),
        "checks": [
            row | {"drawing": interval_drawing(own_checks.loc[index])}
            for index, row in readable_checks(own_checks[CHECK_COLUMNS]).to_dict("index").items()
        ],
        "runs": len(runs),
        "speed": significant(runs["machine_speed"].median()) if runs.get("machine_speed", EMPTY).notna().any() else "",
    }


def figure_runs(figure: str, results: Path) -> pd.DataFrame:
    """One row per run of the figure's runs table: its point, load and speed columns."""
    return pd.read_csv(results / "tables" / f"{figure}.csv").drop_duplicates("point_id")


def machine_speed_index(figures: list[str], results: Path) -> dict[str, Any]:
    """The machine-speed index over every run that measured it (hostload.machine_speed): median, range, how many
    runs, and the largest move between a run's before and after."""
    runs = pd.concat([figure_runs(figure, results) for figure in figures], ignore_index=True)
    speeds = runs.get("machine_speed", EMPTY).dropna()
    if speeds.empty:
        return {}
    drift = runs["speed_drift"].abs().dropna()
    return {
        "median": significant(speeds.median()),
        "low": significant(speeds.min()),
        "high": significant(speeds.max()),
        "runs": len(speeds),
        "largest_drift": f"{drift.max():.1%}",
    }


def significant(number: float) -> str:
    return f"{number:.{SIGNIFICANT_DIGITS}g}"


def rounded_numbers(text: str) -> str:
    """`text` with every decimal number in it (a measured value, `>= 0.8`, a range) rounded for reading."""
    return DECIMAL.sub(lambda match: significant(float(match.group())), text)


def readable_checks(checks: pd.DataFrame) -> pd.DataFrame:
    """Checks with their measured and reference numbers rounded for reading."""
    columns = [column for column in ("measured", "low", "high", "reference") if column in checks]
    return checks.assign(**{column: checks[column].map(rounded_numbers) for column in columns})


def interval_drawing(check: pd.Series) -> str:
    """A timing check's interval (low to high, its mean a dot) against the band it must lie in (shaded): an SVG
    made of numbers only; empty for a check without an interval."""
    numbers = pd.to_numeric(check.reindex(["low", "high", "measured", "band_lower", "band_upper"]), errors="coerce")
    low, high, mean, lower, upper = numbers.tolist()
    if check.get("tier") != "timing" or not all(map(math.isfinite, (low, high, mean))):
        return ""
    edges = [edge for edge in (lower, upper) if math.isfinite(edge)]
    left, right = min(low, *edges), max(high, *edges)
    pad = (right - left) * 0.15 or abs(right) * 0.1 or 1.0
    width, height = INTERVAL_SVG

    def x(value: float) -> float:
        clipped = min(max(value, left - pad), right + pad)
        return cast("float", round((clipped - left + pad) / (right - left + 2 * pad) * width, 1))

    band = f'<rect x="{x(lower)}" y="0" width="{x(upper) - x(lower)}" height="{height}" fill="#d6efd9"/>'
    interval = f'<line x1="{x(low)}" x2="{x(high)}" y1="7" y2="7" stroke="#222" stroke-width="2"/>'
    dot = f'<circle cx="{x(mean)}" cy="7" r="2.5" fill="#222"/>'
    return f'<svg width="{width}" height="{height}" role="img">{band}{interval}{dot}</svg>'


CAPTION_SETTINGS = {
    "raw_enabled": False,
    "file_insertion_enabled": False,
    "halt_level": 2,
    "report_level": 5,
    "_disable_config": True,
}


def caption_html(path: Path) -> str:
    """A caption's reStructuredText as an HTML fragment. Raw HTML and file inclusion are off, links go to http(s)
    or within the page, images are inline (`data:`), so a caption cannot bring a script or a remote fetch into the
    report (the page's Content-Security-Policy says the same); a caption breaking that, or one docutils warns
    about, is an error naming its file."""
    from docutils.core import publish_doctree, publish_parts
    from docutils.utils import SystemMessage

    text = path.read_text()
    try:
        refuse_unsafe_targets(publish_doctree(text, source_path=str(path), settings_overrides=CAPTION_SETTINGS), path)
        parts = publish_parts(text, source_path=str(path), writer="html5", settings_overrides=CAPTION_SETTINGS)
    except SystemMessage as error:
        raise ValueError(f"{path}: caption is not valid reStructuredText: {error}") from error
    return cast("str", parts["body"])


def refuse_unsafe_targets(doctree: Any, path: Path) -> None:
    """Refuse a caption's link other than http(s) or in-page (`javascript:`, `file:`, ...) and a non-inline image."""
    from urllib.parse import urlsplit

    from docutils import nodes

    for reference in doctree.findall(nodes.reference):
        uri = reference.get("refuri", "")
        if uri and urlsplit(uri).scheme.lower() not in ("http", "https") and not uri.startswith("#"):
            raise ValueError(f"{path}: caption link {uri[:80]!r}: only http(s) and in-page (#) links are allowed")
    for image in doctree.findall(nodes.image):
        if not image.get("uri", "").startswith("data:"):
            raise ValueError(f"{path}: caption image {image.get('uri', '')[:80]!r}: only inline (data:) images")


def disturbed_runs(figures: list[str], results: Path, checks: pd.DataFrame) -> pd.DataFrame:
    """The runs, of figures with a disturbed check, that saw more foreign load than the threshold or whose machine
    speed moved (speed_drift NaN where the run predates the measurement)."""
    flagged = set(checks.loc[checks["status"] == "disturbed", "figure"])
    columns = ["figure", "point_id", "foreign_share", "steal_share", "speed_drift"]
    runs = [figure_runs(figure, results) for figure in figures if figure in flagged]
    runs = [table[as_flags(table["disturbed"])] for table in runs if "disturbed" in table]
    return pd.concat(runs, ignore_index=True).reindex(columns=columns) if runs else pd.DataFrame(columns=columns)


def rerun_advice(runs: pd.DataFrame, results: Path, options: str = "") -> dict[str, Any]:
    """The disturbed runs and the one Snakemake command that reruns only them and what depends on them
    (`--forcerun` of their result.json files, named from the checkout as the workflow names them; `options`: the
    profile and config files the results were built with, after the targets since --configfile takes several
    values)."""
    shown = Path(results.name)
    targets = [str(shown / "runs" / row.figure / row.point_id / "result.json") for row in runs.itertuples()]
    command = " ".join(["snakemake --cores all --forcerun", *targets, *([options] if options else [])])
    return {"points": runs.to_dict("records"), "command": command if targets else ""}


# The report records what it was built from beyond the results (the settings, and where and when it was built), so
# that `ddlrepro verify` can build it again from a bundle and compare (bundle/rederive.py's check_report).
INPUTS_MARK = "ddlrepro-report-inputs"
RECORDED_INPUTS = re.compile(rf"<!-- {INPUTS_MARK} ([A-Za-z0-9+/=]+) -->\n?\Z")
INPUT_TYPES = {
    "figures": list,
    "scale": str,
    "launcher": str,
    "git": dict,
    "built": str,
    "host": dict,
    "rerun_options": str,
}


def report_inputs(
    figures: list[str], scale: str, launcher: str, rerun_options: str = "", repository: Path = Path(".")
) -> dict[str, Any]:
    """Everything the report shows that its results folder does not hold."""
    return {
        "figures": figures,
        "scale": scale,
        "launcher": launcher,
        "git": git_state(repository),
        "built": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": host_inventory(),
        "rerun_options": rerun_options,
    }


def recorded_inputs(html: str) -> dict[str, Any] | None:
    """The inputs a report records at its end, or None when it records none in the expected shape."""
    found = RECORDED_INPUTS.search(html)
    if not found:
        return None
    try:
        inputs = json.loads(base64.b64decode(found.group(1), validate=True))
    except ValueError:
        return None
    shaped = isinstance(inputs, dict) and set(inputs) == set(INPUT_TYPES)
    if not shaped or not all(isinstance(inputs[key], kind) for key, kind in INPUT_TYPES.items()):
        return None
    return inputs if all(figure in FIGURES for figure in inputs["figures"]) else None


def render_report(inputs: dict[str, Any], captions: list[Path], results: Path) -> str:
    """The report page for `inputs` (report_inputs) and the results under `results`, each figure captioned by the
    file of `captions` that is its own (catalog.caption_figure); the inputs recorded at its end."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("ddlrepro.host", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
    )
    figures = inputs["figures"]
    meta = {key: inputs[key] for key in ("scale", "launcher", "git", "built", "host")}
    meta["speed"] = machine_speed_index(figures, results)
    caption_files = {caption_figure(path): path for path in captions}
    checks = pd.read_csv(results / "checks.tsv", sep="\t", dtype=str, keep_default_na=False)
    html = environment.get_template("report.html.j2").render(
        meta=meta,
        headline=headline(checks),
        counts=checks["status"].value_counts().to_dict(),
        failed=readable_checks(checks[checks["status"] == "fail"]).to_dict("records"),
        undecided=readable_checks(checks[checks["status"] == "inconclusive"]).to_dict("records"),
        rerun=rerun_advice(disturbed_runs(figures, results, checks), results, inputs["rerun_options"]),
        figures=[figure_entry(figure, results, checks, caption_files.get(figure)) for figure in figures],
        disabled=[figure for figure in FIGURES if figure not in figures],
    )
    stamp = base64.b64encode(json.dumps(inputs, sort_keys=True).encode()).decode()
    return redact(f"{html.rstrip()}\n<!-- {INPUTS_MARK} {stamp} -->\n")


@dataclass(frozen=True)
class ReportRequest:
    """What a report is of: `figures` built under `results` at `scale` by `launcher`, each captioned by its own
    file of `captions` (catalog.caption_figure), the code version from the checkout `repository`, and the
    Snakemake options its rerun command repeats."""

    figures: list[str]
    scale: str
    launcher: str
    captions: list[Path]
    results: Path = Path("results")
    rerun_options: str = ""
    repository: Path = Path(".")


def write_report(out: Path, request: ReportRequest) -> None:
    inputs = report_inputs(request.figures, request.scale, request.launcher, request.rerun_options, request.repository)
    out.write_text(render_report(inputs, request.captions, request.results))
