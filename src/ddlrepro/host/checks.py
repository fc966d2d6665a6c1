"""Check a figure's summary table against the papers' numbers and claims (each figure folder's references.yaml).

Every reference gives one row of checks.tsv, in one of two tiers (docs/verdicts.md). A deterministic check (bits,
bytes, counts, fault outcomes, policy invariants) passes or fails on one run, and on every replicate where the
figure has several. A timing check (`timing: true`) is judged over the figure's replicates (the summary's
`replicate` column; a relation's two sides paired within a replicate): pass or fail only when a one-sided 95 %
percentile-bootstrap bound of the replicates' mean clears the band its line and stated effect make, else
inconclusive, naming n, the interval and the replicates that would settle it; a replicate whose runs shared the
host with too much foreign CPU load (the summary's `disturbed` column, decided per run from
`checks.max_foreign_share`) is left out, and with none left the check is disturbed. Skipped only for a declared
reason (a paper-scale number below paper scale, a point this machine cannot run such as NCCL without CUDA, a value
the figure could not compute because a run it needs is missing: the reason in the summary's `<column>_skipped`
beside the NaN, a check the config excludes). A failed check is a finding. A reference that cannot be evaluated
(unknown column, no matching row, ambiguous selection, a value that was not measured) is an error naming the
figure and the reference, never a skip.
"""

from __future__ import annotations

import copy
import functools
import math
import operator
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

import numpy as np
import pandas as pd

from ddlrepro.host.catalog import figure_file, figure_ids
from ddlrepro.host.config import SCHEMAS, read_yaml, read_yaml_file, validate_against, validate_config
from ddlrepro.host.errors import UserError
from ddlrepro.host.tables import HOST_LOAD_COLUMNS, as_flags, by_replicate

Status = Literal["pass", "fail", "inconclusive", "disturbed", "skipped"]
"""A check's verdict (docs/verdicts.md): pass and fail are decided; the rest say why not."""
Verdict = Literal["pass", "fail", "inconclusive"]
"""What a timing claim's interval says against its band."""
STATUSES: tuple[Status, ...] = get_args(Status)
REFERENCES_SCHEMA = SCHEMAS / "references.schema.yaml"
BENCHMARK_TARGETS_SCHEMA = SCHEMAS / "benchmark-targets.schema.yaml"  # its entries: references
COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
COLUMNS = [
    "figure",
    "check",
    "tier",
    "status",
    "measured",
    "low",
    "high",
    "n",
    "band_lower",
    "band_upper",
    "reference",
    "unit",
    "scale",
    "reason",
    "claim",
    "source",
]
CONFIDENCE = 0.95  # each of a timing claim's bounds is one-sided at this level
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 20231112  # fixed: the same replicates give the same bounds on every machine and every run
MAX_SUGGESTED_REPLICATES = 50  # the schema's maximum of checks.replicates
THOROUGH_ONLY = "judged at checks.tier thorough"  # the reason a claim marked `thorough` is skipped at quick


class ReferenceError(UserError):
    """A reference cannot be evaluated against the figure's summary table."""


class DeclaredSkip(LookupError):
    """Every row a reference selects is a point the machine declared it could not run (e.g. needs CUDA)."""


@functools.cache
def references_schema() -> dict[str, Any]:
    """schemas/references.schema.yaml with the figure ids the folders hold (catalog.py)."""
    schema = read_yaml(REFERENCES_SCHEMA.read_text())
    schema["propertyNames"]["enum"] = list(figure_ids())
    return cast("dict[str, Any]", schema)


def load_references(path: Path, schema: Path = REFERENCES_SCHEMA) -> dict[str, list[dict[str, Any]]]:
    """Load a references file (figure id → references; or the benchmarks' targets, `schema`
    BENCHMARK_TARGETS_SCHEMA) and validate it against its schema (ConfigError names the offending entry)."""
    references = read_yaml(path.read_text()) or {}
    validate_against(references, schema, path.name, references_schema() if schema == REFERENCES_SCHEMA else None)
    return references


def figure_references() -> dict[str, list[dict[str, Any]]]:
    """Every figure's own references (its folder's references.yaml), each file validated on its own so that a
    problem names it."""
    references: dict[str, list[dict[str, Any]]] = {}
    for figure in figure_ids():
        path = figure_file(figure, "references.yaml")
        own = {figure: read_yaml_file(path) or []}
        validate_against(own, REFERENCES_SCHEMA, str(path), references_schema())
        references |= own
    return references


def configured_references(setting: str | None) -> dict[str, list[dict[str, Any]]]:
    """The references a configuration checks against (its `references`): a file's, or null for the figures' own."""
    return load_references(Path(setting)) if setting else figure_references()


def references_text(references: dict[str, list[dict[str, Any]]]) -> str:
    """`references` as one references file (what rule gather_references writes and the bundle keeps)."""
    import yaml

    return yaml.safe_dump(references, sort_keys=False, allow_unicode=True, width=120)


def checks_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The config's `checks` section with the schema's defaults filled in, by the validator that fills the whole
    config (a config the workflow validated already has them)."""
    return cast(
        "dict[str, Any]", validate_config({"checks": copy.deepcopy(config.get("checks", {}))}, partial=True)["checks"]
    )


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
    rows = summary
    for key, wanted in selector.get("where", {}).items():
        rows = rows[rows[key] == wanted] if key in summary else rows
    # Before the missing column: rows whose runs were all skipped never fill the columns those runs would have.
    if "status" in rows and not rows.empty and (rows["status"] == "skipped").all():
        raise DeclaredSkip(str(rows["reason"].iloc[0]))
    if unknown:
        raise ReferenceError(f"reference {name}: no column {unknown} in the summary; have {list(summary.columns)}")
    if rows.empty:
        raise ReferenceError(
            f"reference {name}: no row with {describe_where(selector)} in the summary: configure those points,"
            f" or name {name!r} under checks.exclude in the config"
        )
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
    return cast("float", value * selector.get("factor", 1.0))


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
    load = f"foreign CPU load up to {foreign:.2f} and steal {steal:.2f} of the host while measuring"
    return bool(disturbed), f"{load} (or its speed moved, where checks.max_speed_drift is set)"


def selector_load(summary: pd.DataFrame, selector: dict[str, Any], name: str) -> pd.DataFrame:
    """The host-load columns of the rows a selector picks: the column's own (`<column>_disturbed`, ...) where the
    summary gives them (a ratio over runs other than its row's), else the row's."""
    own = {f"{selector['column']}_{column}": column for column in HOST_LOAD_COLUMNS}
    rows = selected_rows(summary, selector, name)
    return rows[list(own)].rename(columns=own) if set(own) <= set(rows.columns) else rows[HOST_LOAD_COLUMNS]


def unjudged(reference: dict[str, Any], scale: str, tier: str, figure: str = "") -> str:
    """Why a reference is not judged at `scale` and `tier` ("" when it is): a paper-scale number only at paper
    scale; a claim marked `thorough` only at checks.tier thorough, where its figure's points are replicated."""
    if reference["scale"] == "paper" and scale != "paper":
        return f"paper-scale number, this run is at {scale} scale"
    if reference.get("thorough") and tier != "thorough":
        command = f" ({thorough_command(figure)})" if figure else ""
        return f"{THOROUGH_ONLY}, which replicates its figure's runs{command}"
    return ""


def timing_figures(
    references: dict[str, list[dict[str, Any]]], scale: str, exclude: Collection[str] = (), tier: str = "thorough"
) -> set[str]:
    """The figures with a timing claim judged at `scale` and `tier`: their points run `checks.replicates` times."""
    return {
        figure
        for figure, entries in references.items()
        for reference in entries
        if reference.get("timing")
        and not unjudged(reference, scale, tier)
        and f"{figure}/{reference['id']}" not in exclude
    }


def skipped(reference: dict[str, Any], reason: str) -> dict[str, Any]:
    """A reference's row of checks.tsv (figure aside), skipped for `reason` until judged."""
    return dict.fromkeys(COLUMNS[1:]) | {
        "check": reference["id"],
        "tier": "timing" if reference.get("timing") else "deterministic",
        "status": "skipped",
        "unit": reference.get("unit", ""),
        "scale": reference["scale"],
        "reason": reason,
        "claim": reference["claim"],
        "source": reference.get("source", ""),
    }


def evaluate(
    reference: dict[str, Any],
    summary: pd.DataFrame,
    scale: str,
    figure: str = "",
    excluded: bool = False,
    rerun: str = "",
    benchmark: bool = False,
    tier: str = "thorough",
) -> dict[str, Any]:
    """One row of checks.tsv for one reference; `rerun`, the command that runs the figure's points again;
    `benchmark`: a benchmark's target, over its one summary (judge_timing); `tier`: checks.tier."""
    name = f"{figure}/{reference['id']}" if figure else reference["id"]
    row = skipped(reference, "")
    if excluded:
        return row | {"reason": "excluded by the config (checks.exclude)"}
    if reason := unjudged(reference, scale, tier, figure):
        return row | {"reason": reason}
    replicates = by_replicate(summary)
    try:
        if reference.get("timing"):
            return row | judge_timing(reference, replicates, name, rerun, benchmark)
        return row | judge_deterministic(reference, replicates, name)
    except DeclaredSkip as skip:
        return row | {"reason": str(skip)}


def judge_deterministic(reference: dict[str, Any], replicates: dict[int, pd.DataFrame], name: str) -> dict[str, Any]:
    """A deterministic claim holds on one run; with replicates it must hold on every one (a flip is a finding)."""
    outcomes = {}
    for replicate, summary in replicates.items():
        measured = select(summary, reference["measured"], name)
        outcomes[replicate] = (measured, *compare_value(reference, measured, summary, name))
    failed = [replicate for replicate, (_, passed, _) in outcomes.items() if not passed]
    measured, _, expected = outcomes[failed[0] if failed else min(outcomes)]
    status = {"status": "fail" if failed else "pass", "measured": measured, "reference": expected, "n": len(outcomes)}
    if failed and len(outcomes) > 1:
        status["reason"] = f"fails in replicate(s) {failed} of {len(outcomes)} (measured: replicate {failed[0]}'s)"
    return status


def judge_timing(
    reference: dict[str, Any], replicates: dict[int, pd.DataFrame], name: str, rerun: str, benchmark: bool
) -> dict[str, Any]:
    """A timing claim judged over its undisturbed replicates: pass or fail only when a one-sided 95 % bound of the
    replicates' mean clears the band the claim's line and effect (or tolerance) make, else inconclusive. A
    benchmark's target is judged on its one value, as the benchmark measured it (a ratio of paired rounds in one
    run), with its own 95 % interval where it declares a `noise`. A replicate whose value the figure declares
    missing (e.g. fig6's run that settled at its largest size: no next worker to weigh) is left out, saying why;
    with none left the claim is skipped for that reason."""
    values, disturbed, loads, missing = [], {}, [], {}
    for replicate, summary in replicates.items():
        try:
            statistic = replicate_statistic(reference, summary, name)
        except DeclaredSkip as skip:
            missing[replicate] = str(skip)
            continue
        is_disturbed, load = host_load(summary, reference, name)
        if is_disturbed:
            disturbed[replicate] = statistic
            loads.append(load)
        else:
            values.append(statistic)
    band = claim_band(reference)
    if not values and not disturbed:
        raise DeclaredSkip(next(iter(missing.values())))
    if not values:
        unjudged = float(np.mean(list(disturbed.values())))  # shown, not judged
        reason = f"{loads[0]}: rerun on a quiet machine"
        return {"status": "disturbed", "measured": unjudged, "reference": band.text, "n": 0, "reason": reason}
    if benchmark:
        (summary,) = replicates.values()
        noise = noise_statistic(reference, summary, name) if "noise" in reference else 0.0
        interval = Interval.declared(values[0], noise)
    else:
        interval = Interval.of(values)
    status = band.verdict(interval)
    judged: dict[str, Any] = {"status": status, "measured": interval.mean, "low": interval.low, "high": interval.high}
    judged |= {"n": interval.n, "band_lower": band.lower, "band_upper": band.upper, "reference": band.text}
    reasons = [band.undecided(interval, rerun)] if status == "inconclusive" else []
    reasons += [f"replicate(s) {list(disturbed)} left out, disturbed ({loads[0]})"] if disturbed else []
    reasons += [f"replicate(s) {list(missing)} left out: {next(iter(missing.values()))}"] if missing else []
    return judged | {"reason": "; ".join(reasons)}


def noise_statistic(reference: dict[str, Any], summary: pd.DataFrame, name: str) -> float:
    """A benchmark's declared 95 % half-width of its measured value, in the units the claim is judged in."""
    noise = select(summary, reference["noise"], name)
    against = reference["against"]
    return noise / select(summary, against, name) if isinstance(against, dict) else noise


def replicate_statistic(reference: dict[str, Any], summary: pd.DataFrame, name: str) -> float:
    """What a timing claim is judged on in one replicate: the measured value, or for a relation with another
    measured value the ratio measured ÷ against (both from the same replicate: paired)."""
    measured = select(summary, reference["measured"], name)
    against = reference.get("against")
    return measured / select(summary, against, name) if isinstance(against, dict) else measured


@dataclass(frozen=True)
class Interval:
    """The replicates' mean and its one-sided 95 % bounds (percentile bootstrap, a fixed seed: the same values give
    the same bounds everywhere). With one replicate there is no bound: low and high are NaN."""

    mean: float
    low: float
    high: float
    n: int
    spread: float  # the replicates' standard deviation (NaN for one)

    @classmethod
    def declared(cls, value: float, half_width: float) -> Interval:
        """One value with its own 95 % half-width (a benchmark's paired rounds), as an interval."""
        return cls(value, value - half_width, value + half_width, 1, math.nan)

    @classmethod
    def of(cls, values: list[float]) -> Interval:
        data = np.asarray(values, dtype=float)
        mean = float(data.mean())
        if len(data) < 2:
            return cls(mean, math.nan, math.nan, len(data), math.nan)
        if np.ptp(data) == 0:
            return cls(mean, mean, mean, len(data), 0.0)
        from scipy.stats import bootstrap  # here: importing scipy.stats takes most of a second

        result = bootstrap(
            (data,),
            np.mean,
            confidence_level=1 - 2 * (1 - CONFIDENCE),  # two one-sided 95 % bounds = a two-sided 90 % interval
            method="percentile",
            n_resamples=BOOTSTRAP_RESAMPLES,
            rng=np.random.default_rng(BOOTSTRAP_SEED),
        )
        low, high = result.confidence_interval
        return cls(mean, float(low), float(high), len(data), float(data.std(ddof=1)))


@dataclass(frozen=True)
class Band:
    """Where a timing claim holds: above `lower` and/or below `upper` (the line moved by the stated effect)."""

    lower: float
    upper: float
    text: str

    def verdict(self, interval: Interval) -> Verdict:
        if math.isnan(interval.low):
            return "inconclusive"
        if self.lower <= interval.low and interval.high <= self.upper:
            return "pass"
        if interval.high < self.lower or interval.low > self.upper:
            return "fail"
        return "inconclusive"

    def undecided(self, interval: Interval, rerun: str) -> str:
        """Why an interval decides nothing, and how many replicates would (n ≈ ((1.645 + 0.84)·σ / m)², m the
        distance of the mean from the band's edge nearest it: one-sided 95 %, 80 % power), with the command."""
        if math.isnan(interval.low):
            return f"{interval.n} replicate: no interval (set checks.replicates ≥ 3)"
        bounds = f"n={interval.n}: 95 % bounds [{interval.low:.4g}, {interval.high:.4g}] reach the line ({self.text})"
        if math.isnan(interval.spread):
            return f"{bounds}: the value's own noise; measure longer"
        margin = min(abs(interval.mean - edge) for edge in (self.lower, self.upper) if math.isfinite(edge))
        needed = math.ceil(((1.645 + 0.84) * interval.spread / margin) ** 2) if margin > 0 else math.inf
        if needed > MAX_SUGGESTED_REPLICATES:
            return f"{bounds}; the mean is too near the line for {MAX_SUGGESTED_REPLICATES} replicates to settle it"
        needed = max(needed, interval.n + 1)
        command = f": {rerun.format(replicates=needed)}" if rerun else ""
        return f"{bounds}; about {needed} replicates would settle it{command}"


def claim_band(reference: dict[str, Any]) -> Band:
    """A timing claim's band: for a value reference its tolerance or bounds; for a relation its line moved by the
    effect, towards the claim for a strict one (it claims a difference), away from it for a non-strict one."""
    if "compare" not in reference:
        lower, upper = value_band(reference)
        return Band(lower, upper, f"{lower:.4g} to {upper:.4g} ({reference['value']:g} from the paper)")
    compare, against, effect = reference["compare"], reference["against"], reference.get("effect", {})
    line = 1.0 if isinstance(against, dict) else float(against)
    shift = effect.get("relative", 0.0) * abs(line) + effect.get("absolute", 0.0)
    edge = line + (shift if compare in (">", "<=") else -shift)  # > and <= move up, >= and < down
    side = "measured ÷ against" if isinstance(against, dict) else "measured"
    above = compare in (">", ">=")
    text = f"{side} {compare} {line:.4g}, effect {shift:.3g}: {'above' if above else 'below'} {edge:.4g}"
    if above:
        return Band(edge, math.inf, text)
    return Band(-math.inf, edge, text)


def value_band(reference: dict[str, Any]) -> tuple[float, float]:
    """A value reference's accepted range: its bounds, or value ± max(relative·|value|, absolute)."""
    value = reference["value"]
    if "bounds" in reference:
        return reference["bounds"].get("lower", -math.inf), reference["bounds"].get("upper", math.inf)
    tolerance = reference["tolerance"]
    allowed = max(tolerance.get("relative", 0.0) * abs(value), tolerance.get("absolute", 0.0))
    return value - allowed, value + allowed


def threshold(reference: dict[str, Any], summary: pd.DataFrame, name: str) -> float:
    """What a relation compares the measured value with: its constant, or the other measured value."""
    against = reference["against"]
    return against if isinstance(against, int | float) else select(summary, against, name)


def compare_value(reference: dict[str, Any], measured: float, summary: pd.DataFrame, name: str) -> tuple[bool, str]:
    """Whether `measured` satisfies the reference, and the reference written out for the table."""
    if "compare" in reference:
        other = threshold(reference, summary, name)
        return COMPARE[reference["compare"]](measured, other), f"{reference['compare']} {other:.4g}"
    value, (lower, upper) = reference["value"], value_band(reference)
    if "bounds" in reference:
        return lower <= measured <= upper, f"{value:g} in [{lower:g}, {upper:g}]"
    return lower <= measured <= upper, f"{value:g} ± {upper - value:.3g}"


def check_figure(
    figure: str,
    summary: pd.DataFrame,
    references: list[dict[str, Any]],
    scale: str,
    exclude: Collection[str] = (),
    tier: str = "thorough",
) -> pd.DataFrame:
    """Every reference of `figure` evaluated at checks.tier `tier`; `exclude` holds '<figure>/<id>' names the config
    excludes."""
    unknown = sorted(
        name
        for name in exclude
        if name.startswith(f"{figure}/") and name.split("/", 1)[1] not in {r["id"] for r in references}
    )
    if unknown:
        raise ReferenceError(f"checks.exclude names {unknown}, which {figure} has no reference for")
    rerun = rerun_command(figure)
    rows = [
        {
            "figure": figure,
            **evaluate(reference, summary, scale, figure, f"{figure}/{reference['id']}" in exclude, rerun, tier=tier),
        }
        for reference in references
    ]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"n": "Int64"})


def rerun_command(figure: str) -> str:
    """The command that runs all of `figure`'s points again, fresh, with `{replicates}` replicates each (with the
    profile and config files the results were built with: the report's rerun command shows them)."""
    rule = figure.replace("-", "_")
    return f"snakemake {rule} --forcerun run_point --config 'checks={{{{replicates: {{replicates}}}}}}'"


def thorough_command(figure: str) -> str:
    """The command that judges `figure`'s thorough-tier claims: the replicates its runs lack, then the checks."""
    return f"snakemake {figure.replace('-', '_')} --config 'checks={{tier: thorough}}'"


def collect_checks(
    paths: list[Path], waiting: dict[str, str] | None = None, references: dict[str, list[dict[str, Any]]] | None = None
) -> pd.DataFrame:
    """Every figure's checks TSV in one table (results/checks.tsv), cells kept as written; a figure `waiting` for
    its data (figures.waiting_for_data) adds each of its `references` as skipped, with what it waits for."""
    tables = [pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False) for path in paths]
    for figure, reason in (waiting or {}).items():
        rows = [
            {"figure": figure, **skipped(reference, f"waiting: {reason}")}
            for reference in (references or {}).get(figure, [])
        ]
        tables.append(pd.DataFrame(rows, columns=COLUMNS).fillna(""))
    return pd.concat(tables, ignore_index=True)


def headline(checks: pd.DataFrame) -> str:
    """The answer in one line: "N deterministic checks pass; M timing claims pass, K inconclusive, F fail"."""
    counts = checks.groupby(["tier", "status"]).size()

    def count(tier: str, status: str) -> int:
        return int(counts.get((tier, status), 0))

    deterministic = f"{count('deterministic', 'pass')} deterministic checks pass"
    deterministic += f", {count('deterministic', 'fail')} fail" if count("deterministic", "fail") else ""
    timing = ", ".join(
        f"{count('timing', status)} {status}"
        for status in ("inconclusive", "fail", "disturbed")
        if status != "disturbed" or count("timing", status)
    )
    skipped = checks["status"] == "skipped"
    thorough = int((skipped & checks["reason"].str.startswith(THOROUGH_ONLY)).sum())
    more = f"; {thorough} more timing claims at checks.tier thorough" if thorough else ""
    timing += f" ({int(skipped.sum())} skipped){more}"
    return f"{deterministic}; {count('timing', 'pass')} timing claims pass, {timing}"
