"""Pack the results into a bundle (refusing any file that holds a secret), sign its manifest, write it."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import yaml

from ddlrepro.host.bundle.layout import (
    BUNDLE_FORMAT,
    CAPTIONS,
    DIGEST_SUFFIX,
    INPUTS,
    MANIFEST,
    MANIFEST_DIGEST,
    SIGNATURE,
    SIGNING_NAMESPACE,
    SSH_KEYGEN_TIMEOUT_S,
    BundleError,
    figure_tables,
    sha256,
)
from ddlrepro.host.catalog import figure_file
from ddlrepro.host.provenance import git_state
from ddlrepro.host.redaction import find_secret, with_secret_variables


def bundle_name(git: dict[str, Any]) -> str:
    label = (git.get("sha") or "nogit")[:12]
    return f"ddlrepro-{label}{'-dirty' if git.get('dirty') else ''}"


def results_files(results: Path, figures: list[str], run_dirs: list[Path]) -> list[Path]:
    """What a bundle carries from `results/`: report, checks, every figure's files, its runs, provenance, images."""
    files = [results / "report.html", results / "checks.tsv"]
    for figure in figures:
        files += [results / "figures" / f"{figure}.png", results / "figures" / f"{figure}.pdf"]
        files += [results / "tables" / name for name in figure_tables(figure)]
        files += [results / "checks" / f"{figure}.tsv"]
    for run_dir in run_dirs:
        files += sorted(path for path in run_dir.rglob("*") if path.is_file())
    for extra in ("provenance", "images"):
        files += sorted(path for path in (results / extra).rglob("*") if path.is_file())
    return files


def caption_members(figures: list[str], repo: Path) -> dict[str, bytes]:
    """The figures' captions as the checkout holds them (what the report rule gave the report)."""
    captions = {figure: figure_file(figure, "caption.rst", repo) for figure in figures}
    return {f"{CAPTIONS}{figure}.rst": path.read_bytes() for figure, path in captions.items() if path.is_file()}


def simulation_members(figures: list[str], config: dict[str, Any]) -> dict[str, bytes]:
    """The files simulated figures read outside results/ (a user's trace, the artifact's profiles), under
    inputs/<figure>/, so that the bundle re-derives them anywhere."""
    from ddlrepro.host.figures import is_simulated, simulation_inputs

    return {
        f"{INPUTS}{figure}/{name}": path.read_bytes()
        for figure in figures
        if is_simulated(figure)
        for name, path in simulation_inputs(figure, config["figures"][figure]).items()
    }


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
    members |= simulation_members(figures, config)
    members |= caption_members(figures, repo)
    refuse_secrets(members, scan_environment(run_dirs))
    manifest = {
        "format": BUNDLE_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git,
        "figures": figures,
        "scale": config["scale"],
        "files": {name: sha256(data) for name, data in sorted(members.items())},
    }
    members[MANIFEST] = json.dumps(manifest, indent=2).encode()
    members[MANIFEST_DIGEST] = f"{sha256(members[MANIFEST])}  {MANIFEST}\n".encode()
    sign_key = (config.get("bundle") or {}).get("sign_key")
    if sign_key:
        members[SIGNATURE] = sign_manifest(members[MANIFEST], Path(sign_key))
    write_tarball(out, bundle_name(git), members)
    digest_file(out).write_text(f"{sha256(members[MANIFEST])}\n")
    return out


def digest_file(bundle: Path) -> Path:
    """Where `snakemake bundle` writes the manifest's digest: beside the tarball, to be published elsewhere."""
    return bundle.with_name(bundle.name.removesuffix(".tar.gz") + DIGEST_SUFFIX)


def sign_manifest(manifest: bytes, key: Path) -> bytes:
    """An `ssh-keygen -Y sign` signature of MANIFEST.json with the private key (or agent-held key) `key`."""
    key = key.expanduser()  # the config's `~/.ssh/id_ed25519` reaches here unexpanded: no shell in between
    with tempfile.TemporaryDirectory() as scratch:
        message = Path(scratch) / MANIFEST
        message.write_bytes(manifest)
        command = ["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", SIGNING_NAMESPACE, str(message)]
        try:
            subprocess.run(
                command,
                capture_output=True,
                text=True,
                check=True,
                stdin=subprocess.DEVNULL,
                timeout=SSH_KEYGEN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise BundleError(
                f"bundle.sign_key {key}: ssh-keygen did not sign within {SSH_KEYGEN_TIMEOUT_S} s"
                " (waiting for a passphrase or an unreachable agent?)"
            ) from None
        except FileNotFoundError:
            raise BundleError("bundle.sign_key is set but ssh-keygen is not installed") from None
        except subprocess.CalledProcessError as failure:
            raise BundleError(f"bundle.sign_key {key}: ssh-keygen could not sign: {failure.stderr.strip()}") from None
        return message.with_name(SIGNATURE).read_bytes()


def scan_environment(run_dirs: list[Path]) -> dict[str, str]:
    """This environment, in which the secret variables the runs saw (their provenance names them) are secrets too;
    one not set here cannot be looked for, which is said on stderr."""
    names: set[str] = set()
    for run_dir in run_dirs:
        provenance = run_dir / "provenance.json"
        if provenance.is_file():
            names |= set(json.loads(provenance.read_text()).get("secret_variables", []))
    unset = sorted(name for name in names if name not in os.environ)
    if unset:
        print(
            f"bundle: the runs saw secret variable(s) {', '.join(unset)}, not set here: their values cannot be looked"
            " for in the bundle (set them when bundling)",
            file=sys.stderr,
        )
    return with_secret_variables(names)


def refuse_secrets(members: dict[str, bytes], environ: dict[str, str] | None = None) -> None:
    """Raise naming the first file that holds a secret in any form (compressed members are searched unpacked)."""
    for name, data in members.items():
        found = find_secret(unpacked(data) if name.endswith(".gz") else data, environ)
        if found:
            raise BundleError(f"refusing to bundle {name}: it contains the value of a secret variable ({found})")


def unpacked(data: bytes) -> bytes:
    """A `.gz` file's content; the bytes as they are when it is not gzip after all (they are searched then)."""
    try:
        return gzip.decompress(data)
    except (gzip.BadGzipFile, EOFError, zlib.error):
        return data


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
