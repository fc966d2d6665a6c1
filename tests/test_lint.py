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


def test_the_package_type_checks() -> None:
    """mypy over the package (pyproject.toml's [tool.mypy]: every host function typed, untyped bodies checked)."""
    done = run(str(BIN / "mypy"), "--no-incremental")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found")


def test_the_type_checker_catches_a_wrong_type(tmp_path: Path) -> None:
    """The configuration checks what it says: a host function returning the wrong type is an error."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def size() -> int:\n    return 'two'\n")
    done = run(str(BIN / "mypy"), "--no-incremental", str(wrong))
    assert done.returncode == 1 and 'Incompatible return value type (got "str", expected "int")' in done.stdout
