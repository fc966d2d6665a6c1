"""A figure of one's own (issue 38 item 2, issue 39's tutorial): docs/tutorials/add-a-figure.md's commands, run in
order on a copy of the checkout, take a scaffolded figure to a plotted and checked figure with its recorded table,
and the report shows it; nothing outside the figure's folder changes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, WORKFLOW_PARTS, copy_workflow, snakemake, workflow_environment

from ddlrepro.host.catalog import FOLDER_FILES, figure_folder
from ddlrepro.host.figures import FIGURES

TUTORIAL = REPO / "docs" / "tutorials" / "add-a-figure.md"
FIGURE = "mypaper-fig3"


def tutorial_commands() -> list[str]:
    """The commands of the tutorial's console blocks (`$ ` lines), in order."""
    blocks = re.findall(r"```console\n(.*?)```", TUTORIAL.read_text(), flags=re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def test_the_tutorial_names_the_figure_it_builds() -> None:
    commands = tutorial_commands()
    assert commands[0].startswith(f"python -m ddlrepro new-figure {FIGURE} ")
    assert f"snakemake --cores all {FIGURE.replace('-', '_')}" in commands


def test_a_bad_or_taken_figure_id_is_refused(workflow_copy: Path) -> None:
    for figure, problem in (("My_Figure", "is not a figure id"), ("kungfu-fig9", "exists already")):
        done = subprocess.run(
            ["python", "-m", "ddlrepro", "new-figure", figure],
            cwd=workflow_copy,
            env=workflow_environment(workflow_copy),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and problem in done.stderr, done.stderr
    assert not figure_folder("My_Figure", workflow_copy).exists()


@pytest.mark.slow
def test_a_new_figure_is_one_folder_the_workflow_builds_checks_and_reports(tmp_path: Path) -> None:
    with_tests = [part for part in WORKFLOW_PARTS if not part.startswith("tests/")] + ["tests"]
    workdir = copy_workflow(tmp_path / "checkout", commit=True, parts=with_tests)
    environment = workflow_environment(workdir)
    for command in tutorial_commands():
        done = subprocess.run(
            ["bash", "-c", command], cwd=workdir, env=environment, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"

    folder = figure_folder(FIGURE, workdir)
    assert sorted(path.name for path in folder.iterdir() if path.is_file()) == sorted([*FOLDER_FILES, "recorded.csv"])
    checks = pd.read_csv(workdir / "results" / "checks" / f"{FIGURE}.tsv", sep="\t")
    assert dict(zip(checks["check"], checks["status"], strict=True)) == {"every-run-measured": "pass"}
    assert (workdir / "results" / "figures" / f"{FIGURE}.png").stat().st_size > 10_000
    recorded = pd.read_csv(folder / "recorded.csv")
    assert set(recorded["workers"]) == {1, 2} and (recorded["figure"] == FIGURE).all()

    others = {"figures": {figure: {"enabled": False} for figure in FIGURES}}
    (tmp_path / "only-mine.yaml").write_text(yaml.safe_dump(others))
    report = snakemake(workdir, "--configfile", str(tmp_path / "only-mine.yaml"), "--", "results/report.html")
    assert report.returncode == 0, report.stderr[-3000:]
    page = (workdir / "results" / "report.html").read_text()
    assert "My paper Fig 3: throughput vs workers" in page and "every-run-measured" in page

    changed = subprocess.run(
        ["git", "-C", str(workdir), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    outside = [line for line in changed if not line[3:].startswith(str(folder.relative_to(workdir)) + "/")]
    assert changed and outside == []
