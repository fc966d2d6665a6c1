"""References: schema-validated, evaluated into pass / fail / skipped rows with measured and reference values."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO

from ddlrepro.checks import ReferenceError, check_figure, evaluate, load_references
from ddlrepro.config import ConfigError

SUMMARY = pd.DataFrame(
    {
        "setting": ["none", "variance@1", "variance@8"],
        "workers": [2, 2, 2],
        "per_worker": [100.0, 80.0, 97.0],
        "efficiency": [1.0, 0.8, 0.97],
    }
)


def reference(**fields) -> dict:
    return {"id": "r", "claim": "a claim", "scale": "any", "measured": {"column": "per_worker"}, **fields}


def test_shipped_references_are_valid() -> None:
    references = load_references(REPO / "config" / "references.yaml")
    assert {"kungfu-fig8", "kungfu-fig9", "dlaas-scaling"} <= set(references)
    for entries in references.values():
        assert len({entry["id"] for entry in entries}) == len(entries)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"kungfu-fig99": []}, "'kungfu-fig99'"),
        ({"kungfu-fig8": [reference(value=1.0)]}, "kungfu-fig8[0]"),
        ({"kungfu-fig8": [reference(compare="~", against=1)]}, "kungfu-fig8[0]"),
    ],
)
def test_bad_references_are_named(tmp_path: Path, entry: dict, message: str) -> None:
    path = tmp_path / "references.yaml"
    path.write_text(yaml.safe_dump(entry))
    with pytest.raises(ConfigError, match=r"invalid references\.yaml") as caught:
        load_references(path)
    assert message in str(caught.value)


def test_value_with_tolerance() -> None:
    selected = {"column": "per_worker", "where": {"setting": "variance@1"}}
    passing = evaluate(reference(measured=selected, value=84.0, tolerance={"relative": 0.05}), SUMMARY, "smoke")
    failing = evaluate(reference(measured=selected, value=90.0, tolerance={"absolute": 5}), SUMMARY, "smoke")
    assert (passing["status"], passing["measured"], passing["reference"]) == ("pass", 80.0, "84 ± 4.2")
    assert failing["status"] == "fail"


def test_value_with_bounds() -> None:
    selected = {"column": "efficiency", "where": {"setting": "variance@8"}}
    assert evaluate(reference(measured=selected, value=1, bounds={"lower": 0.95}), SUMMARY, "smoke")["status"] == "pass"
    assert evaluate(reference(measured=selected, value=1, bounds={"upper": 0.9}), SUMMARY, "smoke")["status"] == "fail"


def test_relations_against_constants_and_other_measurements() -> None:
    variance = {"column": "per_worker", "where": {"setting": "variance@8"}}
    within_5_percent = {"column": "per_worker", "where": {"setting": "none"}, "factor": 0.95}
    row = evaluate(reference(measured=variance, compare=">=", against=within_5_percent), SUMMARY, "smoke")
    assert (row["status"], row["reference"]) == ("pass", ">= 95")
    lowest = {"column": "efficiency", "aggregate": "min"}
    assert evaluate(reference(measured=lowest, compare=">=", against=0.9), SUMMARY, "smoke")["status"] == "fail"


def test_paper_numbers_are_skipped_below_paper_scale() -> None:
    entry = reference(
        scale="paper",
        value=100.0,
        tolerance={"relative": 0.1},
        measured={"column": "per_worker", "where": {"setting": "none"}},
    )
    skipped = evaluate(entry, SUMMARY, "smoke")
    assert (skipped["status"], skipped["reason"]) == ("skipped", "paper-scale number, this run is at smoke scale")
    assert evaluate(entry, SUMMARY, "paper")["status"] == "pass"


def test_a_selection_without_rows_is_an_error_naming_figure_and_reference() -> None:
    entry = reference(id="big", measured={"column": "per_worker", "where": {"workers": 32}}, compare=">", against=0)
    with pytest.raises(ReferenceError, match=r"reference kungfu-fig8/big: no row with workers=32"):
        evaluate(entry, SUMMARY, "smoke", "kungfu-fig8")
    other_side = reference(
        id="ratio",
        measured={"column": "per_worker", "where": {"setting": "none"}},
        compare=">",
        against={"column": "per_worker", "where": {"setting": "variance@4"}},
    )
    with pytest.raises(ReferenceError, match=r"kungfu-fig8/ratio: no row with setting=variance@4"):
        evaluate(other_side, SUMMARY, "smoke", "kungfu-fig8")


def test_a_nan_measurement_is_an_error_not_a_skip() -> None:
    unmeasured = SUMMARY.assign(per_worker=[100.0, float("nan"), 97.0])
    entry = reference(measured={"column": "per_worker", "where": {"setting": "variance@1"}}, compare=">", against=0)
    with pytest.raises(ReferenceError, match=r"kungfu-fig8/r: per_worker is NaN"):
        evaluate(entry, unmeasured, "smoke", "kungfu-fig8")


def test_only_declared_reasons_skip() -> None:
    needs_cuda = pd.DataFrame(
        {
            "backend": ["nccl", "gloo"],
            "per_worker": [float("nan"), 50.0],
            "status": ["skipped", "ok"],
            "reason": ["skipped: needs CUDA", ""],
        }
    )
    nccl = reference(
        measured={"column": "per_worker", "where": {"backend": "nccl"}},
        compare=">",
        against={"column": "per_worker", "where": {"backend": "gloo"}},
    )
    row = evaluate(nccl, needs_cuda, "smoke", "kungfu-fig10")
    assert (row["status"], row["reason"]) == ("skipped", "skipped: needs CUDA")
    excluded = check_figure(
        "kungfu-fig10", needs_cuda, [nccl | {"id": "x", "measured": {"column": "speed"}}], "smoke", ["kungfu-fig10/x"]
    )
    assert (excluded["status"][0], excluded["reason"][0]) == ("skipped", "excluded by the config (checks.exclude)")
    with pytest.raises(ReferenceError, match=r"checks.exclude names \['kungfu-fig10/typo'\]"):
        check_figure("kungfu-fig10", needs_cuda, [nccl], "smoke", ["kungfu-fig10/typo"])


LOADED = SUMMARY.assign(foreign_share=[0.02, 0.6, 0.01], steal_share=[0.0, 0.0, 0.0], disturbed=[False, True, False])


def test_a_timing_check_behind_a_disturbed_run_is_disturbed_not_judged() -> None:
    variance_vs_none = reference(
        timing=True,
        measured={"column": "per_worker", "where": {"setting": "variance@8"}},
        compare=">=",
        against={"column": "per_worker", "where": {"setting": "variance@1"}},
    )
    row = evaluate(variance_vs_none, LOADED, "smoke", "kungfu-fig8")
    assert row["status"] == "disturbed" and row["measured"] == 97.0
    assert "foreign CPU load up to 0.60" in row["reason"]
    quiet = LOADED.assign(disturbed=False, foreign_share=0.02)
    assert evaluate(variance_vs_none, quiet, "smoke", "kungfu-fig8")["status"] == "pass"
    untimed = {key: value for key, value in variance_vs_none.items() if key != "timing"}
    assert evaluate(untimed, LOADED, "smoke", "kungfu-fig8")["status"] == "pass"
    with pytest.raises(ReferenceError, match="timing check but the summary has no"):
        evaluate(variance_vs_none, SUMMARY, "smoke", "kungfu-fig8")


def test_shipped_references_classify_absolute_numbers_as_paper_scale() -> None:
    """Every value the papers measured on their hardware (a value with tolerance, a constant with a unit such as
    KungFu's 20.39 s) applies at paper scale only; what stays `any` is a scale-free relation."""
    references = load_references(REPO / "config" / "references.yaml")
    for figure, entries in references.items():
        for entry in entries:
            absolute = "value" in entry or ("unit" in entry and not isinstance(entry.get("against"), dict))
            assert not absolute or entry["scale"] == "paper", f"{figure}/{entry['id']}"


def test_broken_references_are_errors() -> None:
    with pytest.raises(ReferenceError, match="no column"):
        evaluate(reference(measured={"column": "speed"}, compare=">", against=0), SUMMARY, "smoke")
    with pytest.raises(ReferenceError, match="3 rows match"):
        evaluate(reference(compare=">", against=0), SUMMARY, "smoke")


def test_check_figure_has_a_row_per_reference() -> None:
    entries = [
        reference(id="a", measured={"column": "efficiency", "aggregate": "max"}, compare="<=", against=1),
        reference(id="b", scale="paper", value=1, tolerance={"absolute": 0}),
    ]
    table = check_figure("kungfu-fig8", SUMMARY, entries, "smoke")
    assert list(table["check"]) == ["a", "b"]
    assert list(table["status"]) == ["pass", "skipped"]
    assert list(table["reason"]) == ["", "paper-scale number, this run is at smoke scale"]
    assert set(table["figure"]) == {"kungfu-fig8"}
