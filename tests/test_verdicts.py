"""Timing claims judged over replicates: every `scale: any` timing check of the figures' references.yaml, on replicate
summaries built from the recorded real runs of tests/data/tables (the figure's own summary code; the checked value
shifted to where the claim holds, where it is false by a margin, and where the noise straddles its line), gives
pass, fail and inconclusive; and the interval, the band and the headline behave as documented."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import (
    Interval,
    check_figure,
    claim_band,
    evaluate,
    figure_references,
    headline,
    load_references,
    select,
    selectors,
    timing_figures,
    unjudged,
)
from ddlrepro.host.figures import draw_figure
from ddlrepro.host.tables import read_table

REFERENCES = figure_references()
TIMING = [
    (figure, reference)
    for figure, entries in REFERENCES.items()
    for reference in entries
    if reference.get("timing") and not unjudged(reference, "smoke", "thorough")
]


def recorded_summary(figure: str) -> pd.DataFrame:
    """The figure's summary of its recorded real runs, as quiet runs (host load cleared)."""
    drawing, summary = draw_figure(
        figure, read_table(figure_file(figure, "recorded.csv")), "smoke", [], "recorded runs"
    )
    plt.close(drawing)
    quiet = {column: 0.0 for column in summary.columns if column.endswith(("foreign_share", "steal_share"))}
    flags = {column: False for column in summary.columns if column.endswith("disturbed")}
    return summary.assign(**quiet, **flags)


def with_rows(summary: pd.DataFrame, reference: dict) -> pd.DataFrame:
    """`summary` with a row for each side of the reference: a side the recorded runs lack (they ran a smaller
    config, or on a machine without CUDA) gets a copy of a recorded row under its `where` values, judged as run."""
    for selector in selectors(reference):
        where = selector.get("where", {})
        if not selected(summary, where).any():
            summary = pd.concat([summary, summary.iloc[[0]].assign(**where)], ignore_index=True)
        if "status" in summary:
            summary.loc[selected(summary, where), "status"] = "ok"
        summary[selector["column"]] = summary[selector["column"]].astype(float).fillna(1.0)
    return summary


def selected(summary: pd.DataFrame, where: dict) -> pd.Series:
    rows = pd.Series(True, index=summary.index)
    for key, wanted in where.items():
        rows &= summary[key] == wanted
    return rows


def with_statistic(summary: pd.DataFrame, reference: dict, value: float) -> pd.DataFrame:
    """`summary` with the checked statistic set to `value`: the measured rows' column rescaled so that measured
    (or measured ÷ against, for a relation with another measured value) equals it."""
    measured, against = reference["measured"], reference["against"]
    rows = selected(summary, measured.get("where", {}))
    other = select(summary, against, "test") if isinstance(against, dict) else 1.0
    changed = summary.copy()
    changed.loc[rows, measured["column"]] = value * other / measured.get("factor", 1.0)
    if isinstance(against, dict):  # the against side must not be what we changed
        assert select(changed, against, "test") == pytest.approx(other)
    return changed


def replicates(summary: pd.DataFrame, reference: dict, values: list[float]) -> pd.DataFrame:
    return pd.concat(
        [with_statistic(summary, reference, value).assign(replicate=r) for r, value in enumerate(values)],
        ignore_index=True,
    )


def cases(reference: dict) -> dict[str, list[float]]:
    """Statistic values per replicate where the claim holds, where it is false by a margin, and straddling."""
    band = claim_band(reference)
    above = math.isfinite(band.lower)
    edge = band.lower if above else band.upper
    step = 0.2 * abs(edge) if edge else 0.2
    side = 1 if above else -1
    return {
        "pass": [edge + side * step * k for k in (1.0, 1.1, 1.2)],
        "fail": [edge - side * step * k for k in (1.0, 1.1, 1.2)],
        "inconclusive": [edge - step, edge, edge + step],
    }


@pytest.mark.parametrize(("figure", "reference"), TIMING, ids=[f"{f}/{r['id']}" for f, r in TIMING])
def test_every_timing_claim_passes_fails_and_is_inconclusive_on_recorded_runs(figure: str, reference: dict) -> None:
    summary = with_rows(recorded_summary(figure), reference)
    for expected, values in cases(reference).items():
        judged = evaluate(reference, replicates(summary, reference, values), "smoke", figure)
        assert judged["status"] == expected, (expected, values, judged)
        assert judged["n"] == 3 and judged["low"] <= judged["measured"] <= judged["high"]


def test_every_timing_claim_states_its_effect_or_band() -> None:
    for figure, entries in REFERENCES.items():
        for reference in entries:
            if reference.get("timing"):
                assert "effect" in reference or "value" in reference, f"{figure}/{reference['id']}"


def test_one_replicate_is_inconclusive_with_what_would_settle_it() -> None:
    figure, reference = next((f, r) for f, r in TIMING if f == "kungfu-fig8" and r["id"] == "noise-scale-cheap")
    row = evaluate(reference, with_rows(recorded_summary(figure), reference), "smoke", figure)
    assert row["status"] == "inconclusive" and row["n"] == 1 and math.isnan(row["low"])
    assert "no interval" in row["reason"]


def test_an_undecided_claim_names_n_its_interval_the_replicates_needed_and_the_command() -> None:
    figure, reference = next((f, r) for f, r in TIMING if f == "kungfu-fig8" and r["id"] == "noise-scale-cheap")
    summary = with_rows(recorded_summary(figure), reference)
    edge = claim_band(reference).lower
    table = replicates(summary, reference, [edge - 0.02, edge + 0.03, edge + 0.04])
    checks = check_figure(figure, table, [reference], "smoke")
    row = checks.iloc[0]
    assert row["status"] == "inconclusive", row["reason"]
    assert row["reason"].startswith(f"n=3: 95 % bounds [{row['low']:.4g}, {row['high']:.4g}]")
    needed = int(row["reason"].split("about ")[1].split(" replicates")[0])
    assert needed > 3
    command = "snakemake kungfu_fig8 --forcerun run_point --config"
    assert f"{command} 'checks={{replicates: {needed}}}'" in row["reason"]


def test_the_interval_is_reproducible_and_one_sided_95() -> None:
    values = [0.91, 0.97, 0.93, 0.99, 0.95]
    first, second = Interval.of(values), Interval.of(list(values))
    assert first == second  # a fixed seed: the same replicates, the same verdict
    assert min(values) < first.low < first.mean < first.high < max(values)
    assert first.low < first.mean < first.high
    assert Interval.of([1.0, 1.0, 1.0]) == Interval(1.0, 1.0, 1.0, 3, 0.0)


@pytest.mark.parametrize(
    ("compare", "effect", "lower", "upper"),
    [
        (">", {"relative": 0.05}, 1.05, math.inf),  # a claimed difference: must clear the line by the effect
        (">=", {"relative": 0.05}, 0.95, math.inf),  # "at least": holds up to the effect
        ("<", {"relative": 0.05}, -math.inf, 0.95),
        ("<=", {"relative": 0.05}, -math.inf, 1.05),
    ],
)
def test_the_band_moves_the_line_by_the_effect(compare: str, effect: dict, lower: float, upper: float) -> None:
    band = claim_band({"compare": compare, "against": {"column": "x"}, "effect": effect})
    assert (band.lower, band.upper) == pytest.approx((lower, upper))


def test_deterministic_checks_must_hold_on_every_replicate() -> None:
    reference = {"id": "r", "claim": "c", "scale": "any", "measured": {"column": "x"}, "compare": ">=", "against": 1}
    summary = pd.DataFrame({"x": [1, 0, 1], "replicate": [0, 1, 2]})
    row = evaluate(reference, summary, "smoke")
    assert (row["status"], row["n"], row["measured"]) == ("fail", 3, 0)
    assert "replicate(s) [1] of 3" in row["reason"]
    assert evaluate(reference, summary.assign(x=1), "smoke")["status"] == "pass"


def test_a_replicate_without_the_value_is_left_out_and_says_why() -> None:
    reference = {"id": "r", "claim": "c", "scale": "any", "timing": True, "measured": {"column": "x"}}
    reference |= {"compare": "<=", "against": 1, "effect": {"absolute": 0.25}}
    why = "settled at its largest size: no next worker to weigh"
    quiet = {"foreign_share": 0.0, "steal_share": 0.0, "disturbed": False}
    summary = pd.DataFrame({"x": [0.5, None, 0.6, 0.55], "x_skipped": ["", why, "", ""], "replicate": range(4)})
    row = evaluate(reference, summary.assign(**quiet), "smoke")
    assert (row["status"], row["n"]) == ("pass", 3) and f"replicate(s) [1] left out: {why}" in row["reason"]
    none = summary.assign(x=float("nan"), x_skipped=why, **quiet)
    skipped = evaluate(reference, none, "smoke")
    assert (skipped["status"], skipped["reason"]) == ("skipped", why)


def test_the_headline_counts_each_tier() -> None:
    thorough = "judged at checks.tier thorough, which replicates its figure's runs (snakemake kungfu_fig9 ...)"
    checks = pd.DataFrame(
        {
            "tier": ["deterministic"] * 3 + ["timing"] * 5,
            "status": ["pass", "pass", "skipped", "pass", "inconclusive", "fail", "skipped", "skipped"],
            "reason": ["", "", "no CUDA", "", "n = 2", "", "paper-scale number", thorough],
        }
    )
    assert headline(checks) == (
        "2 deterministic checks pass; 1 timing claims pass, 1 inconclusive, 1 fail (3 skipped); "
        "1 more timing claims at checks.tier thorough"
    )


def test_a_timing_reference_without_an_effect_is_refused(tmp_path: Path) -> None:
    from ddlrepro.host.config import ConfigError

    entry = {"id": "r", "claim": "c", "scale": "any", "timing": True, "measured": {"column": "x"}}
    path = tmp_path / "references.yaml"
    path.write_text(json.dumps({"kungfu-fig8": [entry | {"compare": ">=", "against": 1}]}))
    with pytest.raises(ConfigError, match="effect"):
        load_references(path)


def test_the_quick_tier_skips_thorough_claims_naming_the_command_and_replicates_only_the_rest() -> None:
    figure, reference = next((f, r) for f, r in TIMING if f == "kungfu-fig8" and r["id"] == "noise-scale-cheap")
    summary = with_rows(recorded_summary(figure), reference)
    quick = check_figure(figure, summary, [reference], "smoke", tier="quick").iloc[0]
    assert quick["status"] == "skipped"
    assert quick["reason"].endswith("(snakemake kungfu_fig8 --config 'checks={tier: thorough}')")
    assert check_figure(figure, summary, [reference], "smoke", tier="thorough").iloc[0]["status"] == "inconclusive"
    replicated = timing_figures(REFERENCES, "smoke", tier="quick")
    assert replicated == {"easyscale-fig14"}  # the one figure whose timing claims quick judges
    assert replicated < timing_figures(REFERENCES, "smoke", tier="thorough")


def test_only_a_timing_claim_can_be_thorough(tmp_path: Path) -> None:
    from ddlrepro.host.config import ConfigError

    entry = {"id": "r", "claim": "c", "scale": "any", "measured": {"column": "x"}, "value": 1}
    entry["tolerance"] = {"absolute": 0.1}
    path = tmp_path / "references.yaml"
    path.write_text(json.dumps({"kungfu-fig8": [entry | {"thorough": True}]}))
    with pytest.raises(ConfigError, match="timing"):
        load_references(path)
    path.write_text(json.dumps({"kungfu-fig8": [entry | {"thorough": True, "timing": True}]}))
    assert load_references(path)["kungfu-fig8"][0]["thorough"]
