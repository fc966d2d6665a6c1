"""What the build downloads is what was published: Horovod's sdist is checked against its pinned sha256 before
anything of it builds, and every other package against the hashes its lock lists (`pip --require-hashes`)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from conftest import REPO
from packaging.utils import canonicalize_name


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


LOCKS = [REPO / "envs" / "requirements.lock", REPO / "envs" / "requirements-cuda.lock"]


def locked(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a lock file written by scripts/lock-requirements."""
    entries: dict[str, tuple[str, list[str]]] = {}
    for block in lock.read_text().split("\n")[1:]:
        if block and not block.startswith(" "):
            name, version = block.split(" ")[0].split("==")
            entries[name] = (version, [])
        elif block:
            entries[name][1].append(block.split("sha256:")[1].rstrip(" \\"))
    return entries


def test_the_locks_pin_what_requirements_asks_for_each_with_hashes() -> None:
    asked = dict(
        line.split("==")
        for line in (REPO / "envs" / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    for lock in LOCKS:
        entries = locked(lock)
        assert {canonicalize_name(name): version for name, version in asked.items()}.items() <= {
            canonicalize_name(name): version for name, (version, _) in entries.items()
        }.items(), f"{lock.name} is out of step with envs/requirements.txt: run `make lock`"
        assert all(len(digest) == 64 for _, hashes in entries.values() for digest in hashes)
        assert all(hashes for _, hashes in entries.values())
    assert "nvidia-nccl-cu13" in locked(LOCKS[1]) and "nvidia-nccl-cu13" not in locked(LOCKS[0])


def test_the_environment_holds_exactly_the_locked_releases() -> None:
    """`make env` installed the lock and nothing else (ddlrepro itself and the separately built Horovod aside)."""
    entries = {canonicalize_name(name): version for name, (version, _) in locked(LOCKS[0]).items()}
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version.split("+")[0]
        for dist in importlib.metadata.distributions()
        if canonicalize_name(dist.metadata["Name"]) not in {"ddlrepro", "horovod", "pip"}
    }
    assert installed == entries


def fake_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of a locked release's name and version whose bytes are not the published ones."""
    folder.mkdir()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}.py", "import os\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return folder


def test_make_env_refuses_a_file_whose_hash_the_lock_does_not_list(tmp_path: Path) -> None:
    recipe = subprocess.run(
        ["make", "-n", "-W", "envs/requirements.lock", ".venv/.installed"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (install,) = [line for line in recipe.splitlines() if "-r envs/requirements.lock" in line]
    assert "--require-hashes" in install.split()
    version, hashes = locked(LOCKS[0])["six"]
    lock = tmp_path / "six.lock"
    lock.write_text(f"six=={version} " + " ".join(f"--hash=sha256:{digest}" for digest in hashes) + "\n")
    links = fake_wheel(tmp_path / "links", "six", version)
    command = [sys.executable, *install.split()[1:]]
    command[command.index("envs/requirements.lock")] = str(lock)
    command += ["--dry-run", "--ignore-installed", "--no-index", "--find-links", str(links)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "DO NOT MATCH THE HASHES" in done.stderr and hashes[0] in done.stderr


def test_the_image_installs_only_hashed_files() -> None:
    script = (REPO / "containers" / "install.sh").read_text()
    installs = [line for line in script.splitlines() if line.lstrip().startswith("$pip install")]
    from_indexes = [line for line in installs if '--no-deps "$src"' not in line]
    assert len(from_indexes) == 2 and all("--require-hashes" in line for line in from_indexes)
