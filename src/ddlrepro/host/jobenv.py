"""The environment Snakemake's jobs run in: checked while the workflow is parsed, never changed by it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ddlrepro


def jobs_package_problem() -> str | None:
    """Why the `python` first on PATH, which every job runs (`python -m ddlrepro ...`), would not run the ddlrepro
    this process imported (its command line, with what that needs at start); None when it would."""
    python = shutil.which("python")
    if python is None:
        return "no `python` on PATH, and every job runs `python -m ddlrepro`"
    found = subprocess.run(
        [python, "-c", "import ddlrepro.host.cli; print(ddlrepro.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if found.returncode != 0:
        problem = (found.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the jobs' python ({python}, first on PATH) cannot import ddlrepro ({problem})"
    theirs, ours = Path(found.stdout.strip()).resolve().parent, Path(ddlrepro.__file__).resolve().parent
    if theirs != ours:
        return f"the jobs' python ({python}, first on PATH) imports ddlrepro from {theirs}, the workflow from {ours}"
    return None
