"""The code stays formatted and the workflow lint-clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, SNAKEMAKE, workflow_environment

BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=REPO, env=workflow_environment(REPO), capture_output=True, text=True, timeout=120
    )


def test_snakemake_lint_is_clean() -> None:
    done = run(SNAKEMAKE, "--lint")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Congratulations, your workflow is in a good condition!" in done.stdout + done.stderr


def test_python_is_ruff_clean_and_formatted() -> None:
    for command in (["check"], ["format", "--check"]):
        done = run(str(BIN / "ruff"), *command, "src", "tests", "benchmarks")
        assert done.returncode == 0, done.stdout + done.stderr


def test_snakefiles_are_snakefmt_formatted() -> None:
    done = run(str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/rules")
    assert done.returncode == 0, done.stdout + done.stderr


def test_import_contracts_hold() -> None:
    """pyproject.toml's import-linter contracts: rank code never imports host code, and no import loop."""
    done = run(str(BIN / "lint-imports"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout
