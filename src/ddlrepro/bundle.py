"""Pack the results into a bundle anyone can verify, and verify one.

    ddlrepro-<git-sha>/
        MANIFEST.json        sha256 of every other file, the git state, the figures and scale
        MANIFEST.sha256      sha256 of MANIFEST.json
        code.tar.gz          the workflow code (`git archive` of HEAD)
        config-used.yaml     the configuration as the workflow used it
        references.yaml      the papers' numbers the figures were checked against
        results/...          report, checks, figures, tables, run folders, invocation provenance, image digests

`verify` checks every hash, then re-renders each figure and its summary table from the bundled tidy table (with
this installation's ddlrepro) and compares them with the bundled ones; it names every file that differs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from ddlrepro.provenance import git_state
from ddlrepro.redaction import find_secret

MANIFEST = "MANIFEST.json"
MANIFEST_DIGEST = "MANIFEST.sha256"
PIXEL_TOLERANCE = 2 / 255


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_name(git: dict[str, Any]) -> str:
    label = (git.get("sha") or "nogit")[:12]
    return f"ddlrepro-{label}{'-dirty' if git.get('dirty') else ''}"


def results_files(results: Path, figures: list[str], run_dirs: list[Path]) -> list[Path]:
    """What a bundle carries from `results/`: report, checks, every figure's files, its runs, provenance, images."""
    files = [results / "report.html", results / "checks.tsv"]
    for figure in figures:
        files += [results / "figures" / f"{figure}.png", results / "figures" / f"{figure}.pdf"]
        files += [results / "tables" / f"{figure}.csv", results / "tables" / f"{figure}.summary.csv"]
        files += [results / "checks" / f"{figure}.tsv"]
    for run_dir in run_dirs:
        files += sorted(path for path in run_dir.rglob("*") if path.is_file())
    for extra in ("provenance", "images"):
        files += sorted(path for path in (results / extra).rglob("*") if path.is_file())
    return files


def git_archive(repo: Path) -> bytes | None:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar.gz", "HEAD"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def create_bundle(
    out: Path,
    results: Path,
    figures: list[str],
    run_dirs: list[Path],
    config: dict[str, Any],
    references: Path,
    repo: Path,
) -> Path:
    """Write the bundle tarball; refuse (naming the file) if any file still holds a secret-looking value."""
    git = git_state(repo)
    members: dict[str, bytes] = {
        "config-used.yaml": yaml.safe_dump(config, sort_keys=False).encode(),
        "references.yaml": references.read_bytes(),
    }
    code = git_archive(repo)
    if code is not None:
        members["code.tar.gz"] = code
    for path in results_files(results, figures, run_dirs):
        members[f"results/{path.relative_to(results).as_posix()}"] = path.read_bytes()
    refuse_secrets(members)
    manifest = {
        "format": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git,
        "figures": figures,
        "scale": config["scale"],
        "files": {name: sha256(data) for name, data in sorted(members.items())},
    }
    members[MANIFEST] = json.dumps(manifest, indent=2).encode()
    members[MANIFEST_DIGEST] = f"{sha256(members[MANIFEST])}  {MANIFEST}\n".encode()
    write_tarball(out, bundle_name(git), members)
    return out


def refuse_secrets(members: dict[str, bytes]) -> None:
    """Raise naming the first file that holds a secret in any form (compressed members are searched unpacked)."""
    for name, data in members.items():
        found = find_secret(gzip.decompress(data) if name.endswith(".gz") else data)
        if found:
            raise ValueError(f"refusing to bundle {name}: it contains the value of a secret variable ({found})")


def write_tarball(out: Path, top: str, members: dict[str, bytes]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    partial.replace(out)


def read_bundle(bundle: Path) -> dict[str, bytes]:
    """Every regular file of the bundle by its path below the top folder."""
    members = {}
    with tarfile.open(bundle, "r:*") as tar:
        for info in tar.getmembers():
            if info.isfile():
                members[info.name.split("/", 1)[1]] = tar.extractfile(info).read()
    return members


def verify_bundle(bundle: Path, render: bool = True) -> list[str]:
    """Problems found in the bundle, one line each naming the file; empty when it verifies."""
    members = read_bundle(bundle)
    problems = check_hashes(members)
    if render and not problems:
        problems += check_rendering(members)
    return problems


def check_hashes(members: dict[str, bytes]) -> list[str]:
    if MANIFEST not in members or MANIFEST_DIGEST not in members:
        return [f"{MANIFEST} or {MANIFEST_DIGEST} is missing"]
    recorded = members[MANIFEST_DIGEST].decode(errors="replace").split()
    if not recorded or recorded[0] != sha256(members[MANIFEST]):
        return [f"{MANIFEST} does not match {MANIFEST_DIGEST} (one of the two was changed)"]
    expected = json.loads(members[MANIFEST])["files"]
    problems = [f"{name}: missing from the bundle" for name in sorted(expected.keys() - members.keys())]
    problems += [
        f"{name}: not in the manifest"
        for name in sorted(members.keys() - expected.keys() - {MANIFEST, MANIFEST_DIGEST})
    ]
    problems += [
        f"{name}: sha256 differs from the manifest"
        for name in sorted(expected.keys() & members.keys())
        if sha256(members[name]) != expected[name]
    ]
    return problems


def check_rendering(members: dict[str, bytes]) -> list[str]:
    """Re-render every figure from its bundled tidy table and compare the picture and the summary table."""
    from ddlrepro.figures import render_figure

    manifest = json.loads(members[MANIFEST])
    references = yaml.safe_load(members["references.yaml"]) or {}
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for figure in manifest["figures"]:
            table = folder / f"{figure}.csv"
            table.write_bytes(members[f"results/tables/{figure}.csv"])
            png, summary = folder / f"{figure}.png", folder / f"{figure}.summary.csv"
            render_figure(
                figure, table, png, folder / f"{figure}.pdf", summary, manifest["scale"], references.get(figure, [])
            )
            if not same_table(summary.read_bytes(), members[f"results/tables/{figure}.summary.csv"]):
                problems.append(f"results/tables/{figure}.summary.csv: differs from the one re-rendered from its table")
            if not same_picture(png.read_bytes(), members[f"results/figures/{figure}.png"]):
                problems.append(f"results/figures/{figure}.png: differs from the one re-rendered from its table")
    return problems


def same_table(rendered: bytes, bundled: bytes) -> bool:
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(pd.read_csv(io.BytesIO(rendered)), pd.read_csv(io.BytesIO(bundled)), rtol=1e-9)
    except (AssertionError, ValueError):
        return False
    return True


def same_picture(rendered: bytes, bundled: bytes) -> bool:
    import matplotlib.image as mpimg
    import numpy as np

    try:
        left, right = mpimg.imread(io.BytesIO(rendered), "png"), mpimg.imread(io.BytesIO(bundled), "png")
    except (OSError, ValueError, SyntaxError):
        return False
    return left.shape == right.shape and float(np.abs(left - right).max()) <= PIXEL_TOLERANCE
