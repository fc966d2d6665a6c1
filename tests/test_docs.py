"""The documentation stays true: the configuration reference is generated from the schema (and changes with it),
and every link of README.md and docs/ leads to a file of the tree."""

from __future__ import annotations

import copy
import re

import pytest
from conftest import REPO

from ddlrepro.host.cli import COMMAND_GROUPS, grouped_commands, parser
from ddlrepro.host.config import config_schema
from ddlrepro.host.config_reference import reference_page

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_configuration_reference_is_current() -> None:
    """config/README.md is what `ddlrepro config-reference --out config/README.md` writes today."""
    assert (REPO / "config" / "README.md").read_text() == reference_page()


def test_the_reference_changes_when_the_schema_does() -> None:
    schema = copy.deepcopy(config_schema())
    checks = schema["properties"]["checks"]["properties"]
    checks["patience_s"] = {"type": "number", "default": 7, "description": "A key added to the schema."}
    page = reference_page(schema)
    assert "| `checks.patience_s` | number | `7` | A key added to the schema. |" in page
    assert page != reference_page()


def test_every_relative_link_of_the_docs_leads_to_a_file() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "CONTRIBUTING.md"]
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://")) and not (page.parent / target).exists()
    ]
    assert not broken, broken


def test_the_readme_is_a_front_page() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_the_top_level_help_lists_every_command_once_in_its_group() -> None:
    """Building the parser fails when a command is in no group, or a group names no command (grouped_commands)."""
    text = parser().format_help()
    listed = re.findall(r"^  ([a-z][a-z-]+)  +\S", text, flags=re.MULTILINE)
    assert listed == [name for names in COMMAND_GROUPS.values() for name in names], text
    assert all(f"\n{title}:\n" in text for title in COMMAND_GROUPS), text
    with pytest.raises(RuntimeError, match="COMMAND_GROUPS and the commands differ"):
        grouped_commands({"run-point": "run one point"})
