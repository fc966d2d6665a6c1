"""Pack the results into a bundle anyone can verify, and verify one.

    ddlrepro-<git-sha>/
        MANIFEST.json        sha256 of every other file, the git state, the figures and scale
        MANIFEST.sha256      sha256 of MANIFEST.json
        MANIFEST.json.sig    (with `bundle.sign_key`) an `ssh-keygen -Y sign` signature of MANIFEST.json
        code.tar.gz          the workflow code (`git archive` of HEAD)
        config-used.yaml     the configuration as the workflow used it
        references.yaml      the papers' numbers the figures were checked against
        results/...          report, checks, figures, tables, run folders, invocation provenance, image digests
        inputs/<figure>/...  files a simulated figure read outside results/ (a user's trace, the artifact's profiles)

Beside the tarball, `<bundle>.manifest.sha256` holds MANIFEST.json's digest: published elsewhere, it is the anchor
`verify --expect` compares with. `verify` reads the tarball without extracting it (refusing links, devices, absolute
or `..` names, duplicates, members outside the top folder), checks every hash, then re-derives every derived file
from the raw run folders with this installation's code (the functions the workflow's rules call): each figure's
tidy table, its summary table and picture, its checks and `checks.tsv`; it names every file that differs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import yaml

from ddlrepro.host.catalog import figure_file
from ddlrepro.host.config import ConfigError, config_schema, read_yaml, validate_config
from ddlrepro.host.errors import UserError
from ddlrepro.host.figures import FIGURES
from ddlrepro.host.provenance import git_state
from ddlrepro.host.redaction import find_secret, with_secret_variables

MANIFEST = "MANIFEST.json"
MANIFEST_DIGEST = "MANIFEST.sha256"
SIGNATURE = "MANIFEST.json.sig"
SIGNING_NAMESPACE = "ddlrepro-bundle"
DIGEST_SUFFIX = ".manifest.sha256"
# 2: the tables carry the host-load columns (foreign_share, steal_share, disturbed); a format-1 bundle's do not.
BUNDLE_FORMAT = 2
PIXEL_TOLERANCE = 2 / 255
TABLE_TOLERANCE = 1e-9
POINT_FOLDER = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
INPUTS = "inputs/"  # files a simulated figure read outside results/, per figure
# verify reads bundles from others, every member into memory: each read is on a budget, checked before (or while)
# what it bounds is read, so a small hostile file cannot make it read, allocate or print without end.
MAX_COMPRESSED_BYTES = 2**30  # the tarball as stored (gzip, the one compression a bundle uses)
MAX_BUNDLE_BYTES = 2 * 2**30  # its members unpacked, all together ...
MAX_RATIO, RATIO_FLOOR_BYTES = 100, 64 * 2**20  # ... and at most 100 × the stored size (or 64 MiB): no gzip bomb
MAX_MEMBERS = 100_000
MAX_NAME_BYTES = 4096  # a member's path, a GNU long name included
MAX_PAX_HEADER_BYTES = 64 * 2**10
MAX_PIXELS = 64 * 2**20  # a bundled PNG's width × height, read from its header before it is decoded
GZIP_MAGIC = b"\x1f\x8b"
SHOWN_NAME_CHARACTERS = 120  # of a refused member's name in an error
REQUIRED_FOR_REDERIVING = ("config-used.yaml", "references.yaml", "results/checks.tsv")
# What verify does not re-derive: a forger who rehashes the manifest can change these unseen, unless the manifest's
# digest (--expect) or signature (--allowed-signers) is checked against one published elsewhere.
NOT_REDERIVED = (
    "results/provenance/*",
    "the report's record of where and when it was built",
    "each run's log.txt, provenance.json and the result.json fields its figure's table does not take",
)
SSH_KEYGEN_TIMEOUT_S = 60


class BundleError(UserError):
    """A bundle cannot be made, signed or read safely; the message names the file (and the member)."""


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
        files += [results / "tables" / name for name in figure_tables(figure)]
        files += [results / "checks" / f"{figure}.tsv"]
    for run_dir in run_dirs:
        files += sorted(path for path in run_dir.rglob("*") if path.is_file())
    for extra in ("provenance", "images"):
        files += sorted(path for path in (results / extra).rglob("*") if path.is_file())
    return files


def figure_tables(figure: str) -> list[str]:
    """A figure's tables in results/tables: its runs', a simulated figure's simulation, its summary."""
    from ddlrepro.host.figures import is_simulated, simulated_table_name

    simulated = [simulated_table_name(figure)] if is_simulated(figure) else []
    return [f"{figure}.csv", *simulated, f"{figure}.summary.csv"]


CAPTIONS = "report/captions/"  # the captions the report was built with, per figure (check_report)


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


def read_bundle(bundle: Path) -> dict[str, bytes]:
    """Every regular file of the bundle by its path below the top folder, read in memory in one pass over the stream
    (nothing is extracted); BundleError, naming the bundle, for anything but a complete gzip tarball of plain files
    under one top folder within the budgets (MAX_* above)."""
    try:
        size = bundle.stat().st_size
        if size > MAX_COMPRESSED_BYTES:
            raise BundleError(f"{bundle}: {size} bytes, more than verify reads (MAX_COMPRESSED_BYTES in {__name__})")
        with bundle.open("rb") as stored:
            if stored.read(2) != GZIP_MAGIC:
                raise BundleError(f"{bundle}: not a gzip tarball (a bundle is a .tar.gz)")
            stored.seek(0)
            budget = unpacked_budget(size)
            with gzip.GzipFile(fileobj=stored) as unpacked_stream:
                budgeted = BudgetedStream(bundle, unpacked_stream, budget + 1024 * MAX_MEMBERS)
                with tarfile.open(fileobj=budgeted, mode="r|", tarinfo=GuardedTarInfo) as tar:
                    return read_members(bundle, tar, budget)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise BundleError(f"{bundle}: not a readable bundle tarball ({type(error).__name__}: {error})") from None


def unpacked_budget(stored_bytes: int) -> int:
    """How many bytes a bundle stored in `stored_bytes` may unpack to (MAX_BUNDLE_BYTES, MAX_RATIO)."""
    return min(MAX_BUNDLE_BYTES, max(RATIO_FLOOR_BYTES, MAX_RATIO * stored_bytes))


def read_members(bundle: Path, tar: tarfile.TarFile, budget: int) -> dict[str, bytes]:
    """The stream's files, each member checked (`refused_member`) and counted against `budget` before its data is
    read."""
    members: dict[str, bytes] = {}
    top, total, count = None, 0, 0
    for info in tar:
        count += 1
        if count > MAX_MEMBERS:
            raise BundleError(f"{bundle}: more than {MAX_MEMBERS} members (MAX_MEMBERS in {__name__})")
        top = top if top is not None else (PurePosixPath(info.name).parts or ("",))[0]
        reason = refused_member(info, top)
        if reason:
            raise BundleError(f"{bundle}: member {shown(info.name)} {reason}")
        if not info.isfile():
            continue
        name = "/".join(PurePosixPath(info.name).parts[1:])
        if name in members:
            raise BundleError(
                f"{bundle}: member {shown(info.name)} appears twice (which copy counts would be ambiguous)"
            )
        total += info.size
        if total > budget:
            raise BundleError(
                f"{bundle}: its files hold more than {budget} bytes unpacked, more than verify reads of a bundle"
                f" this size (MAX_BUNDLE_BYTES, MAX_RATIO in {__name__})"
            )
        members[name] = tar.extractfile(info).read()  # type: ignore[union-attr]  # a file member has data
    if count == 0:
        raise BundleError(f"{bundle}: empty tarball, not a bundle")
    return members


def shown(name: str) -> str:
    """A member's name for an error message: quoted, and cut (a hostile name may be kilobytes)."""
    return repr(name if len(name) <= SHOWN_NAME_CHARACTERS else name[:SHOWN_NAME_CHARACTERS] + "…")


class BudgetedStream(io.RawIOBase):
    """The unpacked tar stream, refusing (BundleError) to deliver more than `budget` bytes in all."""

    def __init__(self, bundle: Path, stream: Any, budget: int) -> None:
        self.bundle, self.stream, self.budget, self.delivered = bundle, stream, budget, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        wanted = self.budget + 1 - self.delivered if size < 0 else min(size, self.budget + 1 - self.delivered)
        data = self.stream.read(wanted)
        self.delivered += len(data)
        if self.delivered > self.budget:
            raise BundleError(
                f"{self.bundle}: unpacks to more than {self.budget} bytes, more than verify reads"
                f" (MAX_BUNDLE_BYTES in {__name__})"
            )
        return data


class GuardedTarInfo(tarfile.TarInfo):
    """tarfile's member headers, with the sizes of a GNU long name and a pax header checked before they are read."""

    def _proc_gnulong(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.size > MAX_NAME_BYTES:
            raise BundleError(f"a member's long name declares {self.size} bytes (MAX_NAME_BYTES = {MAX_NAME_BYTES})")
        return super()._proc_gnulong(tarfile)  # type: ignore[misc]

    def _proc_pax(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.size > MAX_PAX_HEADER_BYTES:
            raise BundleError(
                f"a member's pax header declares {self.size} bytes (MAX_PAX_HEADER_BYTES = {MAX_PAX_HEADER_BYTES})"
            )
        return super()._proc_pax(tarfile)  # type: ignore[misc]


def refused_member(info: tarfile.TarInfo, top: str) -> str | None:
    """Why a member is refused, or None for a plain file or folder inside the top folder."""
    path = PurePosixPath(info.name)
    if path.is_absolute():
        return "has an absolute path"
    if ".." in path.parts:
        return "has '..' in its path"
    if info.issym() or info.islnk():
        return f"is a link (to {shown(info.linkname)}); a bundle holds only plain files"
    if not (info.isfile() or info.isdir()):
        return "is a device, FIFO or other special file; a bundle holds only plain files"
    if not path.parts or path.parts[0] != top or (info.isfile() and len(path.parts) < 2):
        return f"is outside the bundle's top folder {top!r}"
    return None


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
        principals = found.stdout.split() if found.returncode == 0 else []
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


def check_derived(members: dict[str, bytes]) -> list[str]:
    """Re-derive every table, figure and check from the bundled run folders and name each file that differs."""
    from ddlrepro.host.checks import collect_checks

    manifest = json.loads(members[MANIFEST])
    if manifest["format"] < BUNDLE_FORMAT:
        return [
            f"{MANIFEST}: made by an older ddlrepro (format {manifest['format']}): re-derivation would differ;"
            " use --hashes-only"
        ]
    missing = [f"{name}: missing from the bundle" for name in REQUIRED_FOR_REDERIVING if name not in members]
    if missing:
        return missing
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        try:
            scale, references, settings = bundled_inputs(members, manifest, folder)
        except ValueError as error:
            return [str(error)]
        problems = []
        for figure in manifest["figures"]:
            figure_references = references.get(figure, [])
            problems += rederive_figure(members, figure, folder / figure, scale, figure_references, settings)
        checks = [folder / figure / f"{figure}.tsv" for figure in manifest["figures"]]
        if all(path.exists() for path in checks) and checks:
            collected = folder / "checks.tsv"
            waiting = waiting_figures(members, manifest["figures"])
            collect_checks(checks, waiting, references).to_csv(collected, sep="\t", index=False)
            problems += compare_file(members, "results/checks.tsv", collected, "the checks of every figure")
            if not problems:  # the report shows what was just compared: built again only from what matched
                problems += check_report(members, manifest["figures"], folder / "report")
    return problems


REPORT = "results/report.html"


def check_report(members: dict[str, bytes], figures: list[str], folder: Path) -> list[str]:
    """Build the report again from the bundled results (already checked against their runs), its bundled captions
    and the inputs it records, and compare it with the bundled one."""
    from ddlrepro.host.report import recorded_inputs, render_report

    if REPORT not in members:
        return [f"{REPORT}: missing from the bundle"]
    inputs = recorded_inputs(members[REPORT].decode(errors="replace"))
    if inputs is None or inputs["figures"] != figures:
        return [f"{REPORT}: records no inputs for the bundle's figures (edited, or made by an older ddlrepro)"]
    results = folder / "results"
    needed = [name for figure in figures for name in figure_files(figure)] + ["results/checks.tsv"]
    missing = [name for name in needed if name not in members]
    if missing:
        return [f"{name}: missing from the bundle" for name in missing]
    for name in needed:
        target = results.joinpath(*PurePosixPath(name).parts[1:])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(members[name])
    captions = unpack_captions(members, figures, folder / "captions")
    try:
        rendered = render_report(inputs, captions, results)
    except (KeyError, ValueError, TypeError, OSError) as error:
        return [f"{REPORT}: cannot be re-derived from the bundled results ({type(error).__name__}: {error})"]
    if rendered.encode() != members[REPORT]:
        return [f"{REPORT}: differs from the report re-derived from the bundled results, captions and its inputs"]
    return []


def unpack_captions(members: dict[str, bytes], figures: list[str], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    captions = []
    for figure in figures:
        data = members.get(f"{CAPTIONS}{figure}.rst")
        if data is not None:
            captions.append(folder / f"{figure}.rst")
            captions[-1].write_bytes(data)
    return captions


def waiting_figures(members: dict[str, bytes], built: list[str]) -> dict[str, str]:
    """The figures the bundled checks.tsv lists as waiting for their data (none of their runs is bundled), each
    with what it waited for: their skipped rows are re-derived from that and the references."""
    import pandas as pd

    checks = pd.read_csv(io.BytesIO(members["results/checks.tsv"]), sep="\t", dtype=str, keep_default_na=False)
    waiting = checks[~checks["figure"].isin(built) & checks["reason"].str.startswith("waiting: ")]
    return dict(zip(waiting["figure"], waiting["reason"].str.removeprefix("waiting: "), strict=True))


def bundled_inputs(
    members: dict[str, bytes], manifest: dict[str, Any], folder: Path
) -> tuple[str, dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The scale and checks settings recorded in the bundled config, and the bundled references (each file
    validated against its schema)."""
    from ddlrepro.host.checks import checks_settings, load_references

    config = bundled_config(members["config-used.yaml"])
    if config["scale"] != manifest["scale"]:
        raise ValueError(
            f"config-used.yaml: scale {config['scale']!r} differs from the manifest's {manifest['scale']!r}"
        )
    (folder / "references.yaml").write_bytes(members["references.yaml"])
    try:
        references = load_references(folder / "references.yaml")
    except (ConfigError, yaml.YAMLError) as error:
        raise ValueError(f"references.yaml: {error}") from None
    # A simulated figure's simulation reads its config section: re-derived with the bundled one.
    return config["scale"], references, checks_settings(config) | {"figures": config["figures"]}


def bundled_config(data: bytes) -> dict[str, Any]:
    """config-used.yaml, validated against the config schema as the workflow validated it before using it."""
    try:
        config = read_yaml(data)
        validate_config(config)
    except yaml.YAMLError as error:
        raise ValueError(f"config-used.yaml: not YAML ({error})") from None
    except ConfigError as error:
        raise ValueError(f"config-used.yaml: {error}") from None
    return config


def rederive_figure(
    members: dict[str, bytes],
    figure: str,
    folder: Path,
    scale: str,
    references: list[dict[str, Any]],
    settings: dict[str, Any],
) -> list[str]:
    """Tabulate the figure's runs, plot and check as the workflow's rules do, and compare with the bundled files."""
    import pandas as pd

    from ddlrepro.host.checks import check_figure
    from ddlrepro.host.figures import (
        figure_module,
        is_simulated,
        render_figure,
        simulation_settings,
        write_simulated_table,
    )
    from ddlrepro.host.tables import tidy_table

    missing = [name for name in figure_files(figure) if name not in members]
    if missing:
        return [f"{name}: missing from the bundle" for name in missing]
    runs = f"results/runs/{figure}/"
    simulated = is_simulated(figure)
    section = settings["figures"][figure]
    try:
        # A simulated figure on given profiles (profiles_dir) has no runs: its table is empty.
        run_dirs = unpack_runs(members, runs, folder / "runs", required=not (simulated and section["profiles_dir"]))
        table, png, summary, checks = (folder / f"{figure}{end}" for end in (".csv", ".png", ".summary.csv", ".tsv"))
        tidy_table(run_dirs, settings["max_foreign_share"], settings["max_speed_drift"]).to_csv(table, index=False)
        outputs = (png, folder / f"{figure}.pdf", summary)
        results = [run / "result.json" for run in run_dirs]
        drawn = table
        if simulated:
            drawn = folder / f"{figure}.simulated.csv"
            inputs = unpack_inputs(members, f"{INPUTS}{figure}/", folder / "inputs")
            bundled = figure_module(figure).with_inputs_in(section, inputs)
            write_simulated_table(figure, table, simulation_settings(figure, bundled), results, drawn)
        render_figure(figure, drawn, outputs, scale, references, results)
        derived = check_figure(figure, pd.read_csv(summary), references, scale, settings["exclude"], settings["tier"])
        derived.to_csv(checks, sep="\t", index=False)
    except (KeyError, ValueError, TypeError, OSError) as error:
        return [f"{runs}: the figure cannot be re-derived from its runs ({type(error).__name__}: {error})"]
    problems = compare_file(members, f"results/tables/{figure}.csv", table, runs)
    if drawn != table:
        problems += compare_file(members, f"results/tables/{drawn.name}", drawn, runs)
    problems += compare_file(members, f"results/tables/{figure}.summary.csv", summary, runs)
    if not same_picture(png.read_bytes(), members[f"results/figures/{figure}.png"]):
        problems.append(f"results/figures/{figure}.png: differs from the one re-rendered from {runs}")
    problems += compare_file(members, f"results/checks/{figure}.tsv", checks, runs)
    return problems


def figure_files(figure: str) -> list[str]:
    return [
        *(f"results/tables/{name}" for name in figure_tables(figure)),
        f"results/figures/{figure}.png",
        f"results/checks/{figure}.tsv",
    ]


def unpack_inputs(members: dict[str, bytes], prefix: str, target: Path) -> Path:
    """Write a simulated figure's bundled input files (simulation_members) under `target`."""
    unpack_members(members, prefix, target, lambda relative: ".." not in relative.parts, "not a plain path")
    return target


def unpack_runs(members: dict[str, bytes], prefix: str, target: Path, required: bool = True) -> list[Path]:
    """Write the figure's run folders (point ids checked) under `target`; the folders that hold a result.json
    (none is an error when they are `required`)."""

    def in_run_folder(relative: PurePosixPath) -> bool:
        return len(relative.parts) >= 2 and bool(POINT_FOLDER.fullmatch(relative.parts[0]))

    unpack_members(members, prefix, target, in_run_folder, "not inside a run folder named by a point id")
    run_dirs = sorted(result.parent for result in target.glob("*/result.json"))
    if not run_dirs and required:
        raise ValueError(f"{prefix}: no run folder with a result.json")
    return run_dirs


def unpack_members(
    members: dict[str, bytes], prefix: str, target: Path, valid: Callable[[PurePosixPath], bool], problem: str
) -> None:
    """Write the members below `prefix` under `target`; ValueError naming the first whose path is not `valid`."""
    for name, data in members.items():
        if not name.startswith(prefix):
            continue
        relative = PurePosixPath(name[len(prefix) :])
        if not valid(relative):
            raise ValueError(f"{name}: {problem}")
        path = target.joinpath(*relative.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def compare_file(members: dict[str, bytes], name: str, rederived: Path, source: str) -> list[str]:
    """The bundled table `name` against the one re-derived from `source`: the first differing row, if any."""
    import pandas as pd

    separator = "\t" if name.endswith(".tsv") else ","
    try:
        bundled = pd.read_csv(io.BytesIO(members[name]), sep=separator)
    except (ValueError, UnicodeDecodeError) as error:
        return [f"{name}: not a readable table ({error})"]
    difference = first_difference(pd.read_csv(rederived, sep=separator), bundled)
    return [f"{name}: differs from the one re-derived from {source}: {difference}"] if difference else []


def first_difference(rederived: Any, bundled: Any) -> str | None:
    """Where two tables first differ (numbers within TABLE_TOLERANCE), as a phrase naming the row; None if equal."""
    import numpy as np
    from pandas.api.types import is_numeric_dtype

    if list(rederived.columns) != list(bundled.columns):
        return f"columns {list(bundled.columns)}, re-derived {list(rederived.columns)}"
    if len(rederived) != len(bundled):
        return f"{len(bundled)} rows, re-derived {len(rederived)}"
    differs = np.zeros(rederived.shape, dtype=bool)
    for index, column in enumerate(rederived.columns):
        left, right = rederived[column], bundled[column]
        if is_numeric_dtype(left) and is_numeric_dtype(right):
            left, right = left.to_numpy(float, na_value=np.nan), right.to_numpy(float, na_value=np.nan)
            same = np.isclose(left, right, rtol=TABLE_TOLERANCE, atol=0.0, equal_nan=True)
        else:  # pandas' str dtype keeps a missing cell missing (NaN != NaN): compare those apart
            missing = left.isna().to_numpy() & right.isna().to_numpy()
            same = missing | (left.astype(str).to_numpy() == right.astype(str).to_numpy())
        differs[:, index] = ~same
    if not differs.any():
        return None
    row, index = (int(position[0]) for position in np.nonzero(differs))
    column = rederived.columns[index]
    return (
        f"first at row {row + 1}{row_label(bundled, row)}, column {column}: "
        f"{bundled[column].tolist()[row]!r} bundled, {rederived[column].tolist()[row]!r} re-derived"
    )


def row_label(table: Any, row: int) -> str:
    """The row's check id or point id, when the table has one (names the row to a reader)."""
    for key in ("check", "point_id"):
        if key in table.columns:
            return f" ({key} {table[key].iloc[row]})"
    return ""


def png_pixels(data: bytes) -> int | None:
    """Width × height from a PNG's header (its IHDR chunk), before anything is decoded; None if it is no PNG."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big") * int.from_bytes(data[20:24], "big")


def same_picture(rendered: bytes, bundled: bytes) -> bool:
    """Whether the bundled PNG shows what this installation draws (within PIXEL_TOLERANCE); a PNG whose header
    declares more than MAX_PIXELS, or none at all, is not decoded and differs."""
    import matplotlib.image as mpimg
    import numpy as np

    if (png_pixels(bundled) or MAX_PIXELS + 1) > MAX_PIXELS:
        return False
    try:
        left, right = mpimg.imread(io.BytesIO(rendered), "png"), mpimg.imread(io.BytesIO(bundled), "png")
    except (OSError, ValueError, SyntaxError):
        return False
    return left.shape == right.shape and float(np.abs(left - right).max()) <= PIXEL_TOLERANCE
