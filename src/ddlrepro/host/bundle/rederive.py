"""Re-derive every derived file of a bundle from its raw run folders with this installation's code (the functions
the workflow's rules call) and name each file that differs."""

from __future__ import annotations

import io
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, cast

import yaml

from ddlrepro.host.bundle.layout import BUNDLE_FORMAT, CAPTIONS, INPUTS, MANIFEST, figure_tables
from ddlrepro.host.bundle.safe_read import MAX_PIXELS, png_pixels
from ddlrepro.host.config import ConfigError, read_yaml, validate_config

PIXEL_TOLERANCE = 2 / 255
TABLE_TOLERANCE = 1e-9
POINT_FOLDER = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
REQUIRED_FOR_REDERIVING = ("config-used.yaml", "references.yaml", "results/checks.tsv")
# What verify does not re-derive: a forger who rehashes the manifest can change these unseen, unless the manifest's
# digest (--expect) or signature (--allowed-signers) is checked against one published elsewhere.
NOT_REDERIVED = (
    "results/provenance/*",
    "the report's record of where and when it was built",
    "each run's log.txt, provenance.json and the result.json fields its figure's table does not take",
)


def check_derived(members: dict[str, bytes]) -> list[str]:
    """Re-derive every table, figure and check from the bundled run folders and name each file that differs."""
    from ddlrepro.host.checks import collect_checks

    manifest = json.loads(members[MANIFEST])
    if manifest["format"] < BUNDLE_FORMAT:
        return [
            f"{MANIFEST}: made by an older ddlrepro (format {manifest['format']}): re-derivation would differ;"
            " use --hashes-only"
        ]
    missing = [f"{name}: missing from the bundle" for name in REQUIRED_FOR_REDERIVING if name not in members]
    if missing:
        return missing
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        try:
            scale, references, settings = bundled_inputs(members, manifest, folder)
        except ValueError as error:
            return [str(error)]
        problems = []
        for figure in manifest["figures"]:
            figure_references = references.get(figure, [])
            problems += rederive_figure(members, figure, folder / figure, scale, figure_references, settings)
        checks = [folder / figure / f"{figure}.tsv" for figure in manifest["figures"]]
        if all(path.exists() for path in checks) and checks:
            collected = folder / "checks.tsv"
            waiting = waiting_figures(members, manifest["figures"])
            collect_checks(checks, waiting, references).to_csv(collected, sep="\t", index=False)
            problems += compare_file(members, "results/checks.tsv", collected, "the checks of every figure")
            if not problems:  # the report shows what was just compared: built again only from what matched
                problems += check_report(members, manifest["figures"], folder / "report")
    return problems


REPORT = "results/report.html"


def check_report(members: dict[str, bytes], figures: list[str], folder: Path) -> list[str]:
    """Build the report again from the bundled results (already checked against their runs), its bundled captions
    and the inputs it records, and compare it with the bundled one."""
    from ddlrepro.host.report import recorded_inputs, render_report

    if REPORT not in members:
        return [f"{REPORT}: missing from the bundle"]
    inputs = recorded_inputs(members[REPORT].decode(errors="replace"))
    if inputs is None or inputs["figures"] != figures:
        return [f"{REPORT}: records no inputs for the bundle's figures (edited, or made by an older ddlrepro)"]
    results = folder / "results"
    needed = [name for figure in figures for name in figure_files(figure)] + ["results/checks.tsv"]
    missing = [name for name in needed if name not in members]
    if missing:
        return [f"{name}: missing from the bundle" for name in missing]
    for name in needed:
        target = results.joinpath(*PurePosixPath(name).parts[1:])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(members[name])
    captions = unpack_captions(members, figures, folder / "captions")
    try:
        rendered = render_report(inputs, captions, results)
    except (KeyError, ValueError, TypeError, OSError) as error:
        return [f"{REPORT}: cannot be re-derived from the bundled results ({type(error).__name__}: {error})"]
    if rendered.encode() != members[REPORT]:
        return [f"{REPORT}: differs from the report re-derived from the bundled results, captions and its inputs"]
    return []


def unpack_captions(members: dict[str, bytes], figures: list[str], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    captions = []
    for figure in figures:
        data = members.get(f"{CAPTIONS}{figure}.rst")
        if data is not None:
            captions.append(folder / f"{figure}.rst")
            captions[-1].write_bytes(data)
    return captions


def waiting_figures(members: dict[str, bytes], built: list[str]) -> dict[str, str]:
    """The figures the bundled checks.tsv lists as waiting for their data (none of their runs is bundled), each
    with what it waited for: their skipped rows are re-derived from that and the references."""
    import pandas as pd

    checks = pd.read_csv(io.BytesIO(members["results/checks.tsv"]), sep="\t", dtype=str, keep_default_na=False)
    waiting = checks[~checks["figure"].isin(built) & checks["reason"].str.startswith("waiting: ")]
    return dict(zip(waiting["figure"], waiting["reason"].str.removeprefix("waiting: "), strict=True))


def bundled_inputs(
    members: dict[str, bytes], manifest: dict[str, Any], folder: Path
) -> tuple[str, dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The scale and checks settings recorded in the bundled config, and the bundled references (each file
    validated against its schema)."""
    from ddlrepro.host.checks import checks_settings, load_references

    config = bundled_config(members["config-used.yaml"])
    if config["scale"] != manifest["scale"]:
        raise ValueError(
            f"config-used.yaml: scale {config['scale']!r} differs from the manifest's {manifest['scale']!r}"
        )
    (folder / "references.yaml").write_bytes(members["references.yaml"])
    try:
        references = load_references(folder / "references.yaml")
    except (ConfigError, yaml.YAMLError) as error:
        raise ValueError(f"references.yaml: {error}") from None
    # A simulated figure's simulation reads its config section: re-derived with the bundled one.
    return config["scale"], references, checks_settings(config) | {"figures": config["figures"]}


def bundled_config(data: bytes) -> dict[str, Any]:
    """config-used.yaml, validated against the config schema as the workflow validated it before using it."""
    try:
        config = read_yaml(data)
        validate_config(config)
    except yaml.YAMLError as error:
        raise ValueError(f"config-used.yaml: not YAML ({error})") from None
    except ConfigError as error:
        raise ValueError(f"config-used.yaml: {error}") from None
    return cast("dict[str, Any]", config)


def rederive_figure(
    members: dict[str, bytes],
    figure: str,
    folder: Path,
    scale: str,
    references: list[dict[str, Any]],
    settings: dict[str, Any],
) -> list[str]:
    """Tabulate the figure's runs, plot and check as the workflow's rules do, and compare with the bundled files."""
    import pandas as pd

    from ddlrepro.host.checks import check_figure
    from ddlrepro.host.figures import (
        is_simulated,
        render_figure,
        simulated_module,
        simulation_settings,
        write_simulated_table,
    )
    from ddlrepro.host.tables import tidy_table

    missing = [name for name in figure_files(figure) if name not in members]
    if missing:
        return [f"{name}: missing from the bundle" for name in missing]
    runs = f"results/runs/{figure}/"
    simulated = is_simulated(figure)
    section = settings["figures"][figure]
    try:
        # A simulated figure on given profiles (profiles_dir) has no runs: its table is empty.
        run_dirs = unpack_runs(members, runs, folder / "runs", required=not (simulated and section["profiles_dir"]))
        table, png, summary, checks = (folder / f"{figure}{end}" for end in (".csv", ".png", ".summary.csv", ".tsv"))
        tidy_table(run_dirs, settings["max_foreign_share"], settings["max_speed_drift"]).to_csv(table, index=False)
        outputs = (png, folder / f"{figure}.pdf", summary)
        results = [run / "result.json" for run in run_dirs]
        drawn = table
        if simulated:
            drawn = folder / f"{figure}.simulated.csv"
            inputs = unpack_inputs(members, f"{INPUTS}{figure}/", folder / "inputs")
            bundled = simulated_module(figure).with_inputs_in(section, inputs)
            write_simulated_table(figure, table, simulation_settings(figure, bundled), results, drawn)
        render_figure(figure, drawn, outputs, scale, references, results)
        derived = check_figure(figure, pd.read_csv(summary), references, scale, settings["exclude"], settings["tier"])
        derived.to_csv(checks, sep="\t", index=False)
    except (KeyError, ValueError, TypeError, OSError) as error:
        return [f"{runs}: the figure cannot be re-derived from its runs ({type(error).__name__}: {error})"]
    problems = compare_file(members, f"results/tables/{figure}.csv", table, runs)
    if drawn != table:
        problems += compare_file(members, f"results/tables/{drawn.name}", drawn, runs)
    problems += compare_file(members, f"results/tables/{figure}.summary.csv", summary, runs)
    if not same_picture(png.read_bytes(), members[f"results/figures/{figure}.png"]):
        problems.append(f"results/figures/{figure}.png: differs from the one re-rendered from {runs}")
    problems += compare_file(members, f"results/checks/{figure}.tsv", checks, runs)
    return problems


def figure_files(figure: str) -> list[str]:
    return [
        *(f"results/tables/{name}" for name in figure_tables(figure)),
        f"results/figures/{figure}.png",
        f"results/checks/{figure}.tsv",
    ]


def unpack_inputs(members: dict[str, bytes], prefix: str, target: Path) -> Path:
    """Write a simulated figure's bundled input files (simulation_members) under `target`."""
    unpack_members(members, prefix, target, lambda relative: ".." not in relative.parts, "not a plain path")
    return target


def unpack_runs(members: dict[str, bytes], prefix: str, target: Path, required: bool = True) -> list[Path]:
    """Write the figure's run folders (point ids checked) under `target`; the folders that hold a result.json
    (none is an error when they are `required`)."""

    def in_run_folder(relative: PurePosixPath) -> bool:
        return len(relative.parts) >= 2 and bool(POINT_FOLDER.fullmatch(relative.parts[0]))

    unpack_members(members, prefix, target, in_run_folder, "not inside a run folder named by a point id")
    run_dirs = sorted(result.parent for result in target.glob("*/result.json"))
    if not run_dirs and required:
        raise ValueError(f"{prefix}: no run folder with a result.json")
    return run_dirs


def unpack_members(
    members: dict[str, bytes], prefix: str, target: Path, valid: Callable[[PurePosixPath], bool], problem: str
) -> None:
    """Write the members below `prefix` under `target`; ValueError naming the first whose path is not `valid`."""
    for name, data in members.items():
        if not name.startswith(prefix):
            continue
        relative = PurePosixPath(name[len(prefix) :])
        if not valid(relative):
            raise ValueError(f"{name}: {problem}")
        path = target.joinpath(*relative.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def compare_file(members: dict[str, bytes], name: str, rederived: Path, source: str) -> list[str]:
    """The bundled table `name` against the one re-derived from `source`: the first differing row, if any."""
    import pandas as pd

    separator = "\t" if name.endswith(".tsv") else ","
    try:
        bundled = pd.read_csv(io.BytesIO(members[name]), sep=separator)
    except (ValueError, UnicodeDecodeError) as error:
        return [f"{name}: not a readable table ({error})"]
    difference = first_difference(pd.read_csv(rederived, sep=separator), bundled)
    return [f"{name}: differs from the one re-derived from {source}: {difference}"] if difference else []


def first_difference(rederived: Any, bundled: Any) -> str | None:
    """Where two tables first differ (numbers within TABLE_TOLERANCE), as a phrase naming the row; None if equal."""
    import numpy as np
    from pandas.api.types import is_numeric_dtype

    if list(rederived.columns) != list(bundled.columns):
        return f"columns {list(bundled.columns)}, re-derived {list(rederived.columns)}"
    if len(rederived) != len(bundled):
        return f"{len(bundled)} rows, re-derived {len(rederived)}"
    differs = np.zeros(rederived.shape, dtype=bool)
    for index, column in enumerate(rederived.columns):
        left, right = rederived[column], bundled[column]
        if is_numeric_dtype(left) and is_numeric_dtype(right):
            left, right = left.to_numpy(float, na_value=np.nan), right.to_numpy(float, na_value=np.nan)
            same = np.isclose(left, right, rtol=TABLE_TOLERANCE, atol=0.0, equal_nan=True)
        else:  # pandas' str dtype keeps a missing cell missing (NaN != NaN): compare those apart
            missing = left.isna().to_numpy() & right.isna().to_numpy()
            same = missing | (left.astype(str).to_numpy() == right.astype(str).to_numpy())
        differs[:, index] = ~same
    if not differs.any():
        return None
    row, index = (int(position[0]) for position in np.nonzero(differs))
    column = rederived.columns[index]
    return (
        f"first at row {row + 1}{row_label(bundled, row)}, column {column}: "
        f"{bundled[column].tolist()[row]!r} bundled, {rederived[column].tolist()[row]!r} re-derived"
    )


def row_label(table: Any, row: int) -> str:
    """The row's check id or point id, when the table has one (names the row to a reader)."""
    for key in ("check", "point_id"):
        if key in table.columns:
            return f" ({key} {table[key].iloc[row]})"
    return ""


def same_picture(rendered: bytes, bundled: bytes) -> bool:
    """Whether the bundled PNG shows what this installation draws (within PIXEL_TOLERANCE); a PNG whose header
    declares more than MAX_PIXELS, or none at all, is not decoded and differs."""
    import matplotlib.image as mpimg
    import numpy as np

    if (png_pixels(bundled) or MAX_PIXELS + 1) > MAX_PIXELS:
        return False
    try:
        left, right = mpimg.imread(io.BytesIO(rendered), "png"), mpimg.imread(io.BytesIO(bundled), "png")
    except (OSError, ValueError, SyntaxError):
        return False
    return left.shape == right.shape and float(np.abs(left - right).max()) <= PIXEL_TOLERANCE
