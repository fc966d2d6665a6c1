"""The documentation site's reference pages, generated from what the workflow itself reads so they cannot drift: one
page per figure (its caption, how it is built, every claim checked with its source, its smoke and paper settings)
and the command line from its parser. docs/conf.py writes them into docs/generated/ on every `make docs`."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ddlrepro.host import cli
from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import figure_references
from ddlrepro.host.config import folder_block, load_config
from ddlrepro.host.figures import FIGURES, figure_module
from ddlrepro.host.paper_settings import shown, sourced_table

GENERATED = "Generated from the code and configs by `make docs` (src/ddlrepro/host/docs_pages.py); do not edit."


def cell(text: str) -> str:
    """Prose as one markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def claims_table(references: list[dict[str, Any]]) -> list[str]:
    """Every reference of a figure: what is claimed, at which scale, how it is judged, and where it comes from."""
    lines = ["| id | claim | scale | judged | source |", "|---|---|---|---|---|"]
    for reference in references:
        judged = "timing, replicated" if reference.get("timing") else "deterministic, one run"
        if reference.get("thorough"):
            judged += " (`checks.tier: thorough`)"
        source = reference.get("source", "ours: the references name no source")
        row = [f"`{reference['id']}`", reference["claim"], reference["scale"], judged, source]
        lines.append("| " + " | ".join(cell(value) for value in row) + " |")
    return lines


def settings_table(settings: dict[str, Any]) -> list[str]:
    lines = ["| parameter | value |", "|---|---|"]
    return lines + [f"| `{key}` | `{shown(value)}` |" for key, value in sorted(settings.items())]


def figure_page(
    figure: str,
    caption: str,
    references: list[dict[str, Any]],
    smoke: dict[str, Any],
    paper: dict[str, Any],
) -> str:
    """One figure's reference page."""
    described = inspect.getdoc(figure_module(figure)) or ""
    lines = [f"# {figure}", "", GENERATED, "", "```{eval-rst}", caption.strip(), "```", ""]
    lines += ["## How it is built", "", described, ""]
    lines += ["## Claims checked", "", *claims_table(references), ""]
    lines += ["## Smoke scale (`make reproduce`)", "", *settings_table(smoke), ""]
    lines += ["## Paper scale (`--configfile config/paper.yaml`)", ""]
    lines += ["Each value with its source; `ours:` marks one neither the paper nor its artifact gives, with why.", ""]
    lines += [*sourced_table(paper), ""]
    return "\n".join(lines)


def figure_pages(repo: Path) -> dict[str, str]:
    """Every figure's page, from its folder (references, caption, paper settings) and the checkout's smoke config."""
    references = figure_references()
    smoke = load_config(repo / "config" / "config.yaml")["figures"]
    paper = folder_block("paper")
    pages = {}
    for figure in FIGURES:
        caption = figure_file(figure, "caption.rst").read_text()
        settings = {key: value for key, value in smoke[figure].items() if key != "enabled"}
        pages[figure] = figure_page(figure, caption, references.get(figure, []), settings, paper.get(figure, {}))
    return pages


def figures_index() -> str:
    listing = "\n".join(f"figures/{figure}" for figure in FIGURES)
    return f"# Figures\n\n{GENERATED}\n\n```{{toctree}}\n:maxdepth: 1\n\n{listing}\n```\n"


def cli_page() -> str:
    """Every `ddlrepro` command's help, in the order of the top-level help's groups."""
    top = cli.parser()
    commands = cli.subcommands(top)
    lines = ["# Command line", "", GENERATED, "", "```text", top.format_help().rstrip(), "```", ""]
    for group, names in cli.COMMAND_GROUPS.items():
        lines += [f"## {group[0].upper()}{group[1:]}", ""]
        for name in names:
            lines += [f"### `ddlrepro {name}`", "", "```text", commands[name].format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def generated_names() -> list[str]:
    """The generated pages' paths under docs/generated/ (what the hand-written pages may link to)."""
    return ["cli.md", "figures.md", *(f"figures/{figure}.md" for figure in FIGURES)]


def write_generated(repo: Path, folder: Path) -> None:
    """Writes the generated pages under `folder`, replacing what an earlier build wrote."""
    texts = [cli_page(), figures_index(), *figure_pages(repo).values()]
    for name, text in zip(generated_names(), texts, strict=True):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:  # unchanged pages keep their time: Sphinx rebuilds less
            path.write_text(text)
