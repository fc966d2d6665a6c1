"""Check a figure's summary table against the papers' numbers and claims (config/references.yaml).

Every reference gives one row of checks.tsv: pass or fail with the measured value and the reference; skipped only
for a declared reason (a paper-scale number below paper scale, a point this machine cannot run such as NCCL
without CUDA, a value the figure could not compute because a run it needs is missing: the reason in the summary's
`<column>_skipped` beside the NaN, a check the config excludes); disturbed for a timing check whose runs shared the
host with too much foreign CPU load (the summary's `disturbed` column, decided per run from
`checks.max_foreign_share`); inconclusive for a relation whose measured value's declared `noise` reaches its
threshold. A failed check is a finding. A reference that cannot be evaluated (unknown column, no matching row,
ambiguous selection, a value that was not measured) is an error naming the figure and the reference, never a skip.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pandas as pd

from ddlrepro.host.config import SCHEMAS, read_yaml, validate_against, validate_config
from ddlrepro.host.errors import UserError
from ddlrepro.host.tables import HOST_LOAD_COLUMNS, as_flags

REFERENCES_SCHEMA = SCHEMAS / "references.schema.yaml"
BENCHMARK_TARGETS_SCHEMA = SCHEMAS / "benchmark-targets.schema.yaml"  # its entries: references
COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
COLUMNS = ["figure", "check", "status", "measured", "reference", "unit", "scale", "reason", "claim", "source"]


class ReferenceError(UserError):
    """A reference cannot be evaluated against the figure's summary table."""


class DeclaredSkip(LookupError):
    """Every row a reference selects is a point the machine declared it could not run (e.g. needs CUDA)."""


def load_references(path: Path, schema: Path = REFERENCES_SCHEMA) -> dict[str, list[dict[str, Any]]]:
    """Load references.yaml (or the benchmarks' targets, `schema` BENCHMARK_TARGETS_SCHEMA) and validate it against
    its schema (ConfigError names the offending entry)."""
    references = read_yaml(path.read_text()) or {}
    validate_against(references, schema, path.name)
    return references


def checks_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The config's `checks` section with the schema's defaults filled in, by the validator that fills the whole
    config (a config the workflow validated already has them)."""
    return validate_config({"checks": copy.deepcopy(config.get("checks", {}))}, partial=True)["checks"]


def check_exclude(
    exclude: Collection[str], references: dict[str, list[dict[str, Any]]], source: str = "references.yaml"
) -> None:
    """ReferenceError naming every `checks.exclude` entry that is no '<figure>/<reference id>' in `source` (checked
    at workflow start, so a typo is caught for every figure, built or not)."""
    known = {f"{figure}/{reference['id']}" for figure, entries in references.items() for reference in entries}
    unknown = sorted(set(exclude) - known)
    if unknown:
        raise ReferenceError(f"checks.exclude names {unknown}: no such '<figure>/<reference id>' in {source}")


def selected_rows(summary: pd.DataFrame, selector: dict[str, Any], name: str) -> pd.DataFrame:
    """The summary rows a selector picks; `name` ('<figure>/<reference id>') goes into every error."""
    column = selector["column"]
    unknown = sorted({column, *selector.get("where", {})} - set(summary.columns))
    if unknown:
        raise ReferenceError(f"reference {name}: no column {unknown} in the summary; have {list(summary.columns)}")
    rows = summary
    for key, wanted in selector.get("where", {}).items():
        rows = rows[rows[key] == wanted]
    if rows.empty:
        raise ReferenceError(
            f"reference {name}: no row with {describe_where(selector)} in the summary: configure those points,"
            f" or name {name!r} under checks.exclude in the config"
        )
    if "status" in rows and (rows["status"] == "skipped").all():
        raise DeclaredSkip(str(rows["reason"].iloc[0]))
    if len(rows) > 1 and "aggregate" not in selector:
        raise ReferenceError(f"reference {name}: {len(rows)} rows match {describe_where(selector)}; add `aggregate`")
    return rows


def select(summary: pd.DataFrame, selector: dict[str, Any], name: str) -> float:
    """The single value a selector names (scaled by its `factor`); a NaN is an error naming the reference."""
    rows = selected_rows(summary, selector, name)
    column = selector["column"]
    value = float(rows[column].agg(selector.get("aggregate", "mean")))
    if math.isnan(value):
        declared = rows.get(f"{column}_skipped", pd.Series(dtype=str)).fillna("").astype(str)
        if (declared != "").any():  # the figure says why the value could not be measured (a run it needs is missing)
            raise DeclaredSkip(declared[declared != ""].iloc[0])
        raise ReferenceError(f"reference {name}: {column} is NaN (not measured) for {describe_where(selector)}")
    return value * selector.get("factor", 1.0)


def describe_where(selector: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in selector.get("where", {}).items()) or "any"


def selectors(reference: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured side and, for a relation with another measurement, the other side."""
    against = reference.get("against")
    return [reference["measured"], *([against] if isinstance(against, dict) else [])]


def host_load(summary: pd.DataFrame, reference: dict[str, Any], name: str) -> tuple[bool, str]:
    """Whether any run behind either side of a timing reference was disturbed, and the load it saw."""
    missing = sorted(set(HOST_LOAD_COLUMNS) - set(summary.columns))
    if missing:
        raise ReferenceError(f"reference {name} is a timing check but the summary has no {missing} columns")
    rows = pd.concat([selector_load(summary, selector, name) for selector in selectors(reference)])
    disturbed = as_flags(rows["disturbed"]).any()
    foreign, steal = rows["foreign_share"].max(), rows["steal_share"].max()
    return bool(disturbed), f"foreign CPU load up to {foreign:.2f} and steal {steal:.2f} of the host while measuring"


def selector_load(summary: pd.DataFrame, selector: dict[str, Any], name: str) -> pd.DataFrame:
    """The host-load columns of the rows a selector picks: the column's own (`<column>_disturbed`, ...) where the
    summary gives them (a ratio over runs other than its row's), else the row's."""
    own = {f"{selector['column']}_{column}": column for column in HOST_LOAD_COLUMNS}
    rows = selected_rows(summary, selector, name)
    return rows[list(own)].rename(columns=own) if set(own) <= set(rows.columns) else rows[HOST_LOAD_COLUMNS]


def evaluate(
    reference: dict[str, Any], summary: pd.DataFrame, scale: str, figure: str = "", excluded: bool = False
) -> dict[str, Any]:
    """One row of checks.tsv for one reference."""
    name = f"{figure}/{reference['id']}" if figure else reference["id"]
    row = {
        "check": reference["id"],
        "status": "skipped",
        "measured": None,
        "reference": None,
        "unit": reference.get("unit", ""),
        "scale": reference["scale"],
        "reason": "",
        "claim": reference["claim"],
        "source": reference.get("source", ""),
    }
    if excluded:
        return row | {"reason": "excluded by the config (checks.exclude)"}
    if reference["scale"] == "paper" and scale != "paper":
        return row | {"reason": f"paper-scale number, this run is at {scale} scale"}
    try:
        measured = select(summary, reference["measured"], name)
        passed, expected = compare_value(reference, measured, summary, name)
    except DeclaredSkip as skip:
        return row | {"reason": str(skip)}
    row |= {"status": "pass" if passed else "fail", "measured": measured, "reference": expected}
    if "noise" in reference:
        row |= inconclusive(reference, measured, summary, name)
    if reference.get("timing"):
        disturbed, load = host_load(summary, reference, name)
        row |= {"status": "disturbed", "reason": f"{load}: rerun on a quiet machine"} if disturbed else {}
    return row


def threshold(reference: dict[str, Any], summary: pd.DataFrame, name: str) -> float:
    """What a relation compares the measured value with: its constant, or the other measured value."""
    against = reference["against"]
    return against if isinstance(against, int | float) else select(summary, against, name)


def inconclusive(reference: dict[str, Any], measured: float, summary: pd.DataFrame, name: str) -> dict[str, Any]:
    """The row's `inconclusive` status and reason when the measured value's noise reaches the threshold, else {}."""
    noise, other = select(summary, reference["noise"], name), threshold(reference, summary, name)
    margin = abs(measured - other)
    if noise < margin:
        return {}
    return {
        "status": "inconclusive",
        "reason": f"noise ±{noise:.3g} reaches the threshold {other:.4g}, {margin:.3g} away: measure longer",
    }


def compare_value(reference: dict[str, Any], measured: float, summary: pd.DataFrame, name: str) -> tuple[bool, str]:
    """Whether `measured` satisfies the reference, and the reference written out for the table."""
    if "compare" in reference:
        other = threshold(reference, summary, name)
        return COMPARE[reference["compare"]](measured, other), f"{reference['compare']} {other:.4g}"
    value = reference["value"]
    if "bounds" in reference:
        lower = reference["bounds"].get("lower", float("-inf"))
        upper = reference["bounds"].get("upper", float("inf"))
        return lower <= measured <= upper, f"{value:g} in [{lower:g}, {upper:g}]"
    tolerance = reference["tolerance"]
    allowed = max(tolerance.get("relative", 0.0) * abs(value), tolerance.get("absolute", 0.0))
    return abs(measured - value) <= allowed, f"{value:g} ± {allowed:.3g}"


def check_figure(
    figure: str,
    summary: pd.DataFrame,
    references: list[dict[str, Any]],
    scale: str,
    exclude: Collection[str] = (),
) -> pd.DataFrame:
    """Every reference of `figure` evaluated; `exclude` holds '<figure>/<id>' names the config excludes."""
    unknown = sorted(
        name
        for name in exclude
        if name.startswith(f"{figure}/") and name.split("/", 1)[1] not in {r["id"] for r in references}
    )
    if unknown:
        raise ReferenceError(f"checks.exclude names {unknown}, which {figure} has no reference for")
    rows = [
        {"figure": figure, **evaluate(reference, summary, scale, figure, f"{figure}/{reference['id']}" in exclude)}
        for reference in references
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def collect_checks(paths: list[Path]) -> pd.DataFrame:
    """Every figure's checks TSV in one table (results/checks.tsv), cells kept as written."""
    tables = [pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False) for path in paths]
    return pd.concat(tables, ignore_index=True)
