"""What the build downloads is what was published: Horovod's sdist is checked against its pinned sha256 before
anything of it builds."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import REPO


def fake_sdist(folder: Path) -> Path:
    """An sdist of the pinned name and version that is not the published one (a setup.py that builds)."""
    source = folder / "src" / "horovod-0.28.1"
    source.mkdir(parents=True)
    (source / "setup.py").write_text('from setuptools import setup\nsetup(name="horovod", version="0.28.1")\n')
    links = folder / "links"
    links.mkdir()
    with tarfile.open(links / "horovod-0.28.1.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="horovod-0.28.1")
    return links


def test_a_horovod_sdist_that_is_not_the_published_one_is_refused(tmp_path: Path) -> None:
    links = fake_sdist(tmp_path)
    # pip finds only our folder (no index); build isolation off: the venv's setuptools reads the fake's metadata
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "PIP_NO_BUILD_ISOLATION": "0"}
    command = [str(REPO / "scripts" / "horovod"), "fetch", sys.executable, str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "does not have the published sha256" in done.stderr and "refusing to build it" in done.stderr
