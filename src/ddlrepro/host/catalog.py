"""The figures' folders, found on disk: one folder per figure under `host/figures/`, holding all that is its own.

A figure `kungfu-fig9` is the folder `figures/kungfu_fig9/` (its Snakemake rule's name) with:

    __init__.py      points, summarize, plot (the module; figures/__init__.py's Figure protocol)
    schema.yaml      its `figures.<id>` section of the config schema
    smoke.yaml       its section at smoke scale (this machine's sizes, each reason in a comment)
    paper.yaml       its section at paper scale, every value with its source ({value, source})
    references.yaml  the papers' numbers and claims it is checked against (schemas/references.schema.yaml)
    caption.rst      what the report and Snakemake's report say under it
    recorded.csv     a table recorded from real runs at test size (the tests draw and check it; not shipped)

Only files are read here, never a figure's module: the config schema, the references and the scale blocks are
assembled from these files before any figure code is imported (config.py and checks.py sit below figures/).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

FIGURES_FOLDER = Path(__file__).with_name("figures")
IN_CHECKOUT = Path("src", "ddlrepro", "host", "figures")  # where a checkout holds the figures' folders
FOLDER_FILES = ("__init__.py", "schema.yaml", "smoke.yaml", "paper.yaml", "references.yaml", "caption.rst")
SCALE_FILES = {"smoke": "smoke.yaml", "paper": "paper.yaml"}
FIGURE_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def natural_key(figure: str) -> list[int | str]:
    """Sort key under which `kungfu-fig9` comes before `kungfu-fig10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", figure)]


@functools.cache
def figure_ids() -> tuple[str, ...]:
    """Every figure, by id: each folder of figures/ with a schema.yaml, study by study, figure by figure."""
    folders = [path.parent.name for path in FIGURES_FOLDER.glob("*/schema.yaml")]
    return tuple(sorted((folder.replace("_", "-") for folder in folders), key=natural_key))


def figure_folder(figure: str, checkout: Path | None = None) -> Path:
    """A figure's folder in this package, or in the checkout `checkout`."""
    return (checkout / IN_CHECKOUT if checkout else FIGURES_FOLDER) / figure.replace("-", "_")


def figure_file(figure: str, name: str, checkout: Path | None = None) -> Path:
    """One of FOLDER_FILES (or recorded.csv) of a figure, in this package or in the checkout `checkout`."""
    return figure_folder(figure, checkout) / name


def caption_figure(caption: Path) -> str:
    """The figure a caption file is of: a figure folder's caption.rst, or `<figure>.rst` (a bundle's copy)."""
    return caption.parent.name.replace("_", "-") if caption.name == "caption.rst" else caption.stem


def module_name(figure: str) -> str:
    return f"ddlrepro.host.figures.{figure.replace('-', '_')}"


def missing_files(figure: str) -> list[str]:
    """Which of FOLDER_FILES a figure's folder lacks."""
    return [name for name in FOLDER_FILES if not figure_file(figure, name).is_file()]
