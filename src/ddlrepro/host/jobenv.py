"""The environment Snakemake's jobs inherit, set once while the workflow is parsed."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def expose_to_jobs(source: Path) -> None:
    """Jobs run `python -m ddlrepro`: make it this interpreter with this checkout's package.

    A rule's conda environment, when Snakemake activates one, still puts its own Python first; the package is
    then found through PYTHONPATH. Slurm jobs inherit both (sbatch exports the environment by default).
    """
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
