"""Verify a bundle: every hash against the manifest, the manifest against its published digest or signature, then
every derived file re-derived (rederive.py)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

from ddlrepro.host.bundle.layout import (
    BUNDLE_FORMAT,
    MANIFEST,
    MANIFEST_DIGEST,
    SIGNATURE,
    SIGNING_NAMESPACE,
    SSH_KEYGEN_TIMEOUT_S,
    BundleError,
    sha256,
)
from ddlrepro.host.bundle.rederive import check_derived
from ddlrepro.host.bundle.safe_read import read_bundle
from ddlrepro.host.config import config_schema
from ddlrepro.host.figures import FIGURES


def verify_bundle(
    bundle: Path, render: bool = True, expect: str | None = None, allowed_signers: Path | None = None
) -> list[str]:
    """Problems found in the bundle, one line each naming the file; empty when it verifies. BundleError when the
    file cannot be read safely as a bundle at all."""
    return verify_members(read_bundle(bundle), render, expect, allowed_signers)


def verify_members(
    members: dict[str, bytes], render: bool = True, expect: str | None = None, allowed_signers: Path | None = None
) -> list[str]:
    """`verify_bundle` on a bundle already read (`read_bundle`): the bundle is read once."""
    problems = check_hashes(members)
    if not problems and expect is not None:
        problems += check_expected_digest(members, expect)
    if not problems and allowed_signers is not None:
        problems += check_signature(members, allowed_signers)
    if render and not problems:
        problems += check_derived(members)
    return problems


def manifest_digest(members: dict[str, bytes]) -> str:
    return sha256(members[MANIFEST])


def check_hashes(members: dict[str, bytes]) -> list[str]:
    if MANIFEST not in members or MANIFEST_DIGEST not in members:
        return [f"{MANIFEST} or {MANIFEST_DIGEST} is missing"]
    recorded = members[MANIFEST_DIGEST].decode(errors="replace").split()
    if not recorded or recorded[0] != manifest_digest(members):
        return [f"{MANIFEST} does not match {MANIFEST_DIGEST} (one of the two was changed)"]
    problems = check_manifest(members[MANIFEST])
    if problems:
        return problems
    expected = json.loads(members[MANIFEST])["files"]
    problems = [f"{name}: missing from the bundle" for name in sorted(expected.keys() - members.keys())]
    problems += [
        f"{name}: not in the manifest"
        for name in sorted(members.keys() - expected.keys() - {MANIFEST, MANIFEST_DIGEST, SIGNATURE})
    ]
    problems += [
        f"{name}: sha256 differs from the manifest"
        for name in sorted(expected.keys() & members.keys())
        if sha256(members[name]) != expected[name]
    ]
    return problems


def manifest_schema() -> dict[str, Any]:
    """What MANIFEST.json must hold: figure ids and scale are checked before either becomes a file name or an input."""
    scales = config_schema()["properties"]["scale"]["enum"]
    return {
        "type": "object",
        "required": ["format", "figures", "scale", "files"],
        "properties": {
            "format": {"enum": list(range(1, BUNDLE_FORMAT + 1))},
            "figures": {"type": "array", "items": {"enum": list(FIGURES)}, "uniqueItems": True},
            "scale": {"enum": scales},
            "files": {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
        },
    }


def check_manifest(manifest: bytes) -> list[str]:
    """MANIFEST.json against its schema: every violation, naming the key."""
    try:
        content = json.loads(manifest)
    except ValueError as error:
        return [f"{MANIFEST}: not JSON ({error})"]
    errors = jsonschema.Draft202012Validator(manifest_schema()).iter_errors(content)
    return [
        f"{MANIFEST}: {'/'.join(map(str, error.absolute_path)) or 'top level'}: {error.message}"
        for error in sorted(errors, key=lambda error: list(map(str, error.absolute_path)))
    ]


def check_expected_digest(members: dict[str, bytes], expect: str) -> list[str]:
    """The outside anchor: MANIFEST.json's digest must be the one published beside the bundle."""
    # A line pasted from <bundle>.manifest.sha256 or `sha256sum MANIFEST.json` ("<hex>  MANIFEST.json") is fine too.
    wanted = (expect.split() or [""])[0].lower().removeprefix("sha256:")
    actual = manifest_digest(members)
    if actual != wanted:
        return [f"{MANIFEST}: sha256 is {actual}, not the expected {wanted} (the bundle is not the one published)"]
    return []


def check_signature(members: dict[str, bytes], allowed_signers: Path) -> list[str]:
    """MANIFEST.json must carry an `ssh-keygen -Y sign` signature by a key listed in `allowed_signers`."""
    if not allowed_signers.is_file():
        return [f"{allowed_signers}: no such allowed_signers file"]
    if SIGNATURE not in members:
        return [f"{SIGNATURE}: missing (the bundle is not signed)"]
    with tempfile.TemporaryDirectory() as scratch:
        signature = Path(scratch) / SIGNATURE
        signature.write_bytes(members[SIGNATURE])
        found = ssh_keygen(["-Y", "find-principals", "-s", str(signature), "-f", str(allowed_signers)])
        principals = found.stdout.decode().split() if found.returncode == 0 else []
        for principal in principals:
            check = ["-Y", "verify", "-f", str(allowed_signers), "-I", principal, "-n", SIGNING_NAMESPACE]
            if ssh_keygen([*check, "-s", str(signature)], members[MANIFEST]).returncode == 0:
                return []
    if not principals:
        return [f"{SIGNATURE}: not made by any key in {allowed_signers}"]
    return [f"{SIGNATURE}: does not match {MANIFEST} (signed by a key in {allowed_signers}, but not this manifest)"]


def ssh_keygen(arguments: list[str], message: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["ssh-keygen", *arguments], input=message, capture_output=True, timeout=SSH_KEYGEN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise BundleError(
            f"--allowed-signers: ssh-keygen {' '.join(arguments[:2])} did not finish within {SSH_KEYGEN_TIMEOUT_S} s"
        ) from None
    except FileNotFoundError:
        raise BundleError("--allowed-signers needs ssh-keygen (OpenSSH ≥ 8.2), which is not installed") from None
