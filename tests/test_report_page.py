"""The HTML report as a reader sees it, built from tables recorded from real runs (tests/data/tables/): numbers
to meaningful digits, captions rendered, wide tables scrolling inside their box; and, where Debian's chromium is
installed, the page as a real browser lays it out (scripts/report-screenshot)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO

from ddlrepro.host import plotting
from ddlrepro.host.catalog import figure_file
from ddlrepro.host.checks import check_figure, figure_references
from ddlrepro.host.figures import FIGURES as ALL_FIGURES
from ddlrepro.host.figures import draw_figure
from ddlrepro.host.report import INPUTS_MARK, ReportRequest, caption_html, recorded_inputs, render_report, write_report
from ddlrepro.host.tables import read_table

# kungfu-fig7 first: its summary is the widest table, and it lands in the screenshot's first 2000 pixels.
FIGURES = ["kungfu-fig7", "kungfu-fig8", "kungfu-fig9", "dlaas-scaling"]
DECIMAL = re.compile(r"\d+\.\d+")


def significant_digits(number: str) -> int:
    return len(number.replace(".", "").lstrip("0"))


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """results/ with the figures, summaries and checks of FIGURES, and the report built from them."""
    results = tmp_path_factory.mktemp("results")
    (results / "tables").mkdir()
    (results / "figures").mkdir()
    references = figure_references()
    exclude = yaml.safe_load((REPO / "tests" / "configs" / "tiny.yaml").read_text())["checks"]["exclude"]
    checks = []
    for figure in FIGURES:
        shutil.copy(figure_file(figure, "recorded.csv"), results / "tables" / f"{figure}.csv")
        drawing, summary = draw_figure(
            figure, read_table(figure_file(figure, "recorded.csv")), "smoke", references.get(figure, []), "1 host"
        )
        plotting.save(drawing, str(results / "figures" / f"{figure}.png"), str(results / "figures" / f"{figure}.pdf"))
        summary.to_csv(results / "tables" / f"{figure}.summary.csv", index=False)
        summary = pd.read_csv(results / "tables" / f"{figure}.summary.csv")
        checks.append(check_figure(figure, summary, references.get(figure, []), "smoke", exclude))
    pd.concat(checks).to_csv(results / "checks.tsv", sep="\t", index=False)
    out = results / "report.html"
    captions = [figure_file(figure, "caption.rst") for figure in FIGURES]
    write_report(out, ReportRequest(FIGURES, "smoke", "local", captions, results, repository=REPO))
    return out


def test_the_report_records_its_inputs_and_is_built_again_from_them_alone(report: Path) -> None:
    html = report.read_text()
    inputs = recorded_inputs(html)
    assert inputs is not None and inputs["figures"] == list(FIGURES) and inputs["scale"] == "smoke"
    captions = [figure_file(figure, "caption.rst") for figure in FIGURES]
    assert render_report(inputs, captions, report.parent) == html
    tampered = html.replace(INPUTS_MARK + " ", INPUTS_MARK + " AAAA", 1)
    assert recorded_inputs(tampered) is None and recorded_inputs(html + "<p>more</p>") is None


def test_measured_numbers_shown_to_meaningful_digits(report: Path) -> None:
    html = report.read_text()
    checks = pd.read_csv(report.parent / "checks.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert max(significant_digits(number) for number in DECIMAL.findall(" ".join(checks["measured"]))) > 10
    shown = DECIMAL.findall(re.sub(r"data:image/png;base64,[^\"]+", "", html))
    assert shown and max(significant_digits(number) for number in shown) <= 4, sorted(shown, key=significant_digits)[
        -3:
    ]


def test_captions_rendered_from_restructuredtext(report: Path) -> None:
    html = report.read_text()
    assert "``" not in html
    assert re.search(r'<span class="docutils literal">(<span class="pre">)?step:size,...</span>', html)
    assert "<em>inplace-cold</em>" in html


@pytest.mark.parametrize("figure", list(ALL_FIGURES))
def test_every_caption_is_valid_restructuredtext(figure: str) -> None:
    assert caption_html(figure_file(figure, "caption.rst")).startswith("<p>")


def test_caption_cannot_bring_a_script(tmp_path: Path) -> None:
    caption = tmp_path / "evil.rst"
    caption.write_text("Fine text.\n\n.. raw:: html\n\n   <script>alert(1)</script>\n")
    with pytest.raises(ValueError, match=r"evil\.rst"):
        caption_html(caption)
    caption.write_text("A <script>alert(1)</script> in text.\n")
    assert "<script" not in caption_html(caption)


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("`click <javascript:alert(1)>`_", "caption link 'javascript:alert(1)'"),
        ("`local <file:///etc/passwd>`_", "caption link 'file:///etc/passwd'"),
        (".. image:: https://example.invalid/track.png", "caption image 'https://example.invalid/track.png'"),
    ],
    ids=["javascript-link", "file-link", "remote-image"],
)
def test_a_caption_links_only_to_http_and_shows_only_inline_images(tmp_path: Path, text: str, refused: str) -> None:
    caption = tmp_path / "evil.rst"
    caption.write_text(f"Fine text.\n\n{text}\n")
    with pytest.raises(ValueError, match=re.escape(f"{caption}: {refused}")):
        caption_html(caption)
    caption.write_text("See `the paper <https://example.invalid/paper.pdf>`_ and `above <#top>`_.\n")
    assert 'href="https://example.invalid/paper.pdf"' in caption_html(caption)


def test_the_page_forbids_scripts_and_remote_fetches(report: Path) -> None:
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', report.read_text())
    assert policy, "no Content-Security-Policy"
    directives = dict(part.strip().split(" ", 1) for part in policy.group(1).split(";"))
    assert directives["default-src"] == "'none'" and directives["img-src"] == "data:"
    assert "script-src" not in directives  # default-src 'none' covers scripts


def test_every_table_scrolls_inside_its_box(report: Path) -> None:
    html = report.read_text()
    tables = [match.start() for match in re.finditer(r"<table", html)]
    assert len(tables) >= 2 * len(FIGURES) - 1
    for start in tables:
        assert html[:start].rstrip().endswith('<div class="scroll table-box">'), html[start - 200 : start]
    assert re.search(r"\.scroll, pre \{[^}]*overflow-x: auto", html)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)")
def test_page_in_a_real_browser_stays_inside_the_window(report: Path, tmp_path: Path) -> None:
    """Nothing runs past the page's right margin: the widest table and the rerun command scroll inside their box."""
    screenshot = tmp_path / "report.png"
    script = REPO / "scripts" / "report-screenshot"
    done = subprocess.run(
        [str(script), str(report), str(screenshot), "1280,2000"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pixels = mpimg.imread(screenshot)
    assert pixels.shape[:2] == (2000, 1280)
    right_margin = pixels[:, 1230:1265, :3]
    assert np.all(right_margin > 0.97), "something is drawn in the page's right margin"
    body = pixels[:, 100:1180, :3]
    assert (body < 0.5).mean() > 0.01, "the page is blank"
