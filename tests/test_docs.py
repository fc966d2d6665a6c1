"""The documentation stays true: the configuration reference is generated from the schema (and changes with it),
and every link of README.md and docs/ leads to a file of the tree."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import matplotlib.image as mpimg
import numpy as np
import pytest
from conftest import REPO, undocumented_results, workflow_environment

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import Status
from ddlrepro.host.cli import COMMAND_GROUPS, flags, grouped_commands, parser, subcommands
from ddlrepro.host.config import config_schema
from ddlrepro.host.config_reference import reference_page, resolved
from ddlrepro.host.docs_pages import cli_page, figure_pages, generated_names
from ddlrepro.host.figures import FIGURES

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
WRITTEN = sorted(path for path in (REPO / "docs").rglob("*.md") if "generated" not in path.relative_to(REPO).parts)
PAGES = [REPO / "README.md", *WRITTEN, REPO / "CONTRIBUTING.md"]
CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", flags=re.DOTALL)
TREE = (
    "src/",
    "config/",
    "docs/",
    "scripts/",
    "workflow/",
    "envs/",
    "containers/",
    "profiles/",
    "tests/",
    "benchmarks/",
)
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.|…")
MADE_BY_A_TUTORIAL = "src/ddlrepro/host/figures/mypaper_fig3/"  # docs/tutorials/add-a-figure.md's new figure
FILE_SUFFIX = re.compile(r"\.(tsv|csv|yaml|yml|json|smk|npy|md|py|png|pdf|txt|html|zip|sif|sha256)$")


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


def leads_somewhere(page: Path, target: str) -> bool:
    """A link to a file of the tree, or to a page `make docs` generates (docs/generated/, absent from a checkout)."""
    path = (page.parent / target).resolve()
    generated = (REPO / "docs" / "generated").resolve()
    if path.is_relative_to(generated):
        return path.relative_to(generated).as_posix() in generated_names()
    return path.exists()


def test_every_relative_link_of_the_docs_leads_to_a_file() -> None:
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in PAGES
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://")) and not leads_somewhere(page, target)
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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it: any Sphinx or MyST warning (a broken cross-reference, a page in no
    toctree) fails the build."""
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)]
    built = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_the_docs_site_builds_without_a_warning_and_holds_every_figure(site: Path) -> None:
    for figure in FIGURES:
        page = (site / "generated" / "figures" / f"{figure}.html").read_text()
        assert "Claims checked" in page and "Paper scale" in page
    assert "ddlrepro verify" in (site / "generated" / "cli.html").read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (scripts/browser-tools)")
@pytest.mark.parametrize("page", ["index.html", "generated/figures/kungfu-fig9.html", "config-reference.html"])
def test_a_page_in_a_real_browser_is_drawn_and_stays_inside_the_window(site: Path, page: str, tmp_path: Path) -> None:
    """The widest tables (a figure's claims, every config key) scroll inside their box, not past the page."""
    screenshot = tmp_path / "page.png"
    script = REPO / "scripts" / "report-screenshot"
    done = subprocess.run(
        [str(script), str(site / page), str(screenshot), "1400,1400"], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pixels = mpimg.imread(screenshot)[:, :, :3]
    assert pixels.shape[:2] == (1400, 1400)
    assert np.all(pixels[:, 1325:1380] > 0.97), "something is drawn in the page's right margin"
    assert (pixels[:, 300:1300] < 0.5).mean() > 0.01, "the page is blank"


def test_a_figure_page_changes_with_its_references_and_settings(workflow_copy: Path) -> None:
    """The pages are written from the figure's folder: edit a claim or a paper value there and the page says so."""
    before = figure_pages(REPO)["kungfu-fig9"]
    references = figure_file("kungfu-fig9", "references.yaml", workflow_copy)
    claim = "Horovod (the paper's ring all-reduce baseline) trains ResNet-50"
    references.write_text(references.read_text().replace(claim, "An edited claim about ResNet-50", 1))
    paper = figure_file("kungfu-fig9", "paper.yaml", workflow_copy)
    paper.write_text(paper.read_text().replace("KungFu OSDI'20 Fig 9: ResNet-50 and MobileNetV2", "edited source", 1))
    written = "from pathlib import Path\nfrom ddlrepro.host.docs_pages import figure_pages\n"
    written += "print(figure_pages(Path('.'))['kungfu-fig9'])"
    done = subprocess.run(
        [sys.executable, "-c", written],
        cwd=workflow_copy,
        env=workflow_environment(workflow_copy),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    after = done.stdout
    assert claim in before and claim not in after and "An edited claim about ResNet-50" in after
    assert '| `models` | `["resnet50", "mobilenet_v2"]` | edited source |' in after


def test_the_command_line_page_shows_every_command() -> None:
    page = cli_page()
    assert all(f"### `ddlrepro {name}`" in page for names in COMMAND_GROUPS.values() for name in names)


def code_spans(page: Path) -> list[str]:
    """What a page shows as code: inline spans and the lines of its code blocks."""
    spans = []
    for block, inline in CODE.findall(page.read_text()):
        spans += block.splitlines() if block else [inline]
    return spans


def schema_has(key: str) -> bool:
    """Whether a dotted config key (`checks.tier`, `figures.kungfu-fig9.workers`) is one the schema accepts."""
    schema = config_schema()
    node: dict = schema
    for part in key.split("."):
        node = resolved(node, schema)
        if part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return False
    return True


def stale_names(page: Path) -> list[str]:
    """Commands, flags, make targets, repository paths and config keys a page shows that do not exist."""
    commands = subcommands(parser())
    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), flags=re.MULTILINE))
    top_keys = set(config_schema()["properties"])
    stale = []
    for span in code_spans(page):
        for name, rest in re.findall(r"\bddlrepro ([a-z][a-z-]+)((?: +[^ |;&]+)*)", span):
            if name not in commands:
                stale.append(f"command `ddlrepro {name}`")
                continue
            known = flags(commands[name])
            stale += [
                f"flag `ddlrepro {name} {flag}`" for flag in re.findall(r"(--[a-z-]+)", rest) if flag not in known
            ]
        stale += [
            f"make target `{target}`" for target in re.findall(r"\bmake ([a-z][a-z-]+)", span) if target not in targets
        ]
        for word in span.split():
            word = word.strip("\"'(),;:")
            made = word.startswith(MADE_BY_A_TUTORIAL)
            if word.startswith(TREE) and not (PLACEHOLDER.search(word) or made or (REPO / word.split(":")[0]).exists()):
                stale.append(f"path `{word}`")
            dotted = re.fullmatch(r"([a-z_]+)(\.[a-z0-9_-]+)+", word)
            if dotted and dotted[1] in top_keys and not FILE_SUFFIX.search(word) and not schema_has(word):
                stale.append(f"config key `{word}`")
    return stale


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_command_flag_target_path_and_key_a_page_names_exists(page: Path) -> None:
    assert not stale_names(page), stale_names(page)


def test_a_stale_name_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `ddlrepro verfy BUNDLE`, `ddlrepro verify --expct D`, `make reproduse`, edit `config/confg.yaml`,\n"
        "```\nsnakemake --config checks.tiers=quick\n```\nand set `checks.tire`; `checks.tier` is right.\n"
    )
    assert stale_names(page) == [
        "command `ddlrepro verfy`",
        "flag `ddlrepro verify --expct`",
        "make target `reproduse`",
        "path `config/confg.yaml`",
        "config key `checks.tire`",
    ]


def test_the_verdicts_the_docs_list_are_the_ones_the_checks_give() -> None:
    tiers = (REPO / "docs" / "verdicts.md").read_text().split("## Two tiers")[1].split("\n\n")[1]
    listed = {verdict.strip() for line in tiers.splitlines()[2:] for verdict in line.split("|")[-2].split(",")}
    assert listed == set(get_args(Status))
    layout = (REPO / "docs" / "results-layout.md").read_text()
    in_layout = re.search(r"its verdict \(([^)]*)\)", layout.replace("\n", " "))
    assert in_layout and {re.sub(r"\s+", "", word) for word in in_layout.group(1).split(",")} == set(get_args(Status))


def test_a_file_the_results_layout_does_not_name_is_found(tmp_path: Path) -> None:
    named = ["results/tables/kungfu-fig9.csv", "results/runs/kungfu-fig9/p-1/log.txt", "results/runs/f/p/pods/a/0.log"]
    strays = ["results/runs/kungfu-fig9/p-1/core.1234", "results/runs/kungfu-fig9/p-1/tmp/x", "results/stray.txt"]
    for path in named + strays:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert undocumented_results(tmp_path) == sorted(strays)
