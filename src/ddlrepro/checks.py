"""Check a figure's summary table against the papers' numbers and claims (config/references.yaml).

Every reference gives one row: pass, fail or skipped (with the reason), the measured value and the reference.
A failed check is a finding; a reference that cannot be evaluated (unknown column, ambiguous selection) is an
error in the references and raises.
"""

from __future__ import annotations

import math
import operator
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ddlrepro.config import REPO_ROOT, validate_against

REFERENCES_SCHEMA = REPO_ROOT / "workflow" / "schemas" / "references.schema.yaml"
COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
COLUMNS = ["figure", "check", "status", "measured", "reference", "unit", "scale", "reason", "claim", "source"]


class ReferenceError(ValueError):
    """A reference cannot be evaluated against the figure's summary table."""


class NotMeasured(LookupError):
    """The run has no row that a reference selects (e.g. a paper-scale worker count at smoke scale)."""


def load_references(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Load references.yaml and validate it against its schema (ConfigError names the offending entry)."""
    references = yaml.safe_load(path.read_text()) or {}
    validate_against(references, REFERENCES_SCHEMA, path.name)
    return references


def select(summary: pd.DataFrame, selector: dict[str, Any], reference_id: str) -> float:
    """The single value a selector names; NotMeasured when no row matches."""
    column = selector["column"]
    unknown = sorted({column, *selector.get("where", {})} - set(summary.columns))
    if unknown:
        raise ReferenceError(
            f"reference {reference_id!r}: no column {unknown} in the summary; have {list(summary.columns)}"
        )
    rows = summary
    for key, wanted in selector.get("where", {}).items():
        rows = rows[rows[key] == wanted]
    if rows.empty:
        raise NotMeasured(f"no row with {describe_where(selector)} in this run")
    if "status" in rows and (rows["status"] == "skipped").all():
        raise NotMeasured(str(rows["reason"].iloc[0]))
    if len(rows) > 1 and "aggregate" not in selector:
        raise ReferenceError(
            f"reference {reference_id!r}: {len(rows)} rows match {describe_where(selector)}; add `aggregate`"
        )
    value = float(rows[column].agg(selector.get("aggregate", "mean")))
    if math.isnan(value):
        raise NotMeasured(f"{column} was not measured for {describe_where(selector)} in this run")
    return value * selector.get("factor", 1.0)


def describe_where(selector: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in selector.get("where", {}).items()) or "any"


def evaluate(reference: dict[str, Any], summary: pd.DataFrame, scale: str) -> dict[str, Any]:
    """One row of checks.tsv for one reference."""
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
    if reference["scale"] == "paper" and scale != "paper":
        return row | {"reason": f"paper-scale number, this run is at {scale} scale"}
    try:
        measured = select(summary, reference["measured"], reference["id"])
        passed, expected = compare_value(reference, measured, summary)
    except NotMeasured as missing:
        return row | {"reason": str(missing)}
    return row | {"status": "pass" if passed else "fail", "measured": measured, "reference": expected}


def compare_value(reference: dict[str, Any], measured: float, summary: pd.DataFrame) -> tuple[bool, str]:
    """Whether `measured` satisfies the reference, and the reference written out for the table."""
    if "compare" in reference:
        against = reference["against"]
        other = against if isinstance(against, int | float) else select(summary, against, reference["id"])
        return COMPARE[reference["compare"]](measured, other), f"{reference['compare']} {other:.4g}"
    value = reference["value"]
    if "bounds" in reference:
        lower = reference["bounds"].get("lower", float("-inf"))
        upper = reference["bounds"].get("upper", float("inf"))
        return lower <= measured <= upper, f"{value:g} in [{lower:g}, {upper:g}]"
    tolerance = reference["tolerance"]
    allowed = max(tolerance.get("relative", 0.0) * abs(value), tolerance.get("absolute", 0.0))
    return abs(measured - value) <= allowed, f"{value:g} ± {allowed:.3g}"


def check_figure(figure: str, summary: pd.DataFrame, references: list[dict[str, Any]], scale: str) -> pd.DataFrame:
    rows = [{"figure": figure, **evaluate(reference, summary, scale)} for reference in references]
    return pd.DataFrame(rows, columns=COLUMNS)


def collect_checks(paths: list[Path]) -> pd.DataFrame:
    """Every figure's checks TSV in one table (results/checks.tsv), cells kept as written."""
    tables = [pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False) for path in paths]
    return pd.concat(tables, ignore_index=True)
