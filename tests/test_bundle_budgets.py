"""A bundle from a stranger cannot exhaust the verifier: every read is on a budget (stored and unpacked bytes,
members, a member's name and header, a picture's pixels), a YAML alias bomb is refused before it is validated, and
each refusal is a short message, within a bound on time and memory."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import gathered_references

from ddlrepro.host.bundle import (
    BUNDLE_FORMAT,
    MANIFEST,
    MANIFEST_DIGEST,
    BundleError,
    png_pixels,
    read_bundle,
    safe_read,
    same_picture,
    sha256,
    verify_bundle,
    write_tarball,
)

MEMORY_BOUND = 40 * 2**20
TIME_BOUND_S = 10.0


@contextmanager
def bounded() -> Iterator[None]:
    """The block allocates at most MEMORY_BOUND (Python's allocations, traced) and runs within TIME_BOUND_S."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        yield
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.0f} MiB"
    assert time.monotonic() - started < TIME_BOUND_S


def refusal(read: Callable[[], object]) -> str:
    with bounded(), pytest.raises(BundleError) as refused:
        read()
    return str(refused.value)


def alias_bomb(depth: int = 10) -> bytes:
    """A few hundred bytes standing for 9**depth strings once its aliases are expanded."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, depth)]
    return ("\n".join(lines) + "\nscale: smoke\nfigures: *l9\n").encode()


def rehashed_bundle(path: Path, members: dict[str, bytes]) -> Path:
    """A bundle whose manifest hashes every member: what a stranger can always make."""
    manifest = {"format": BUNDLE_FORMAT, "figures": [], "scale": "smoke"}
    manifest["files"] = {name: sha256(data) for name, data in members.items()}
    members = {**members, MANIFEST: json.dumps(manifest).encode()}
    members[MANIFEST_DIGEST] = f"{sha256(members[MANIFEST])}  {MANIFEST}\n".encode()
    write_tarball(path, "ddlrepro-x", members)
    return path


def test_a_yaml_alias_bomb_is_refused_before_it_is_validated(tmp_path: Path) -> None:
    members = {
        "config-used.yaml": alias_bomb(),
        "references.yaml": gathered_references(tmp_path).read_bytes(),
        "results/checks.tsv": b"figure\tcheck\tstatus\treason\n",
    }
    bundle = rehashed_bundle(tmp_path / "bomb.tar.gz", members)
    with bounded():
        (problem,) = verify_bundle(bundle)
    assert (
        "config-used.yaml: invalid configuration: more than 200000 values once its YAML aliases are expanded" in problem
    )
    assert len(problem) < 400
    (tmp_path / "bomb.yaml").write_bytes(alias_bomb())
    done = subprocess.run(
        [sys.executable, "-m", "ddlrepro", "validate", str(tmp_path / "bomb.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "once its YAML aliases are expanded" in done.stderr and len(done.stderr) < 2000


def gnu_long_name_bomb(path: Path, declared: int) -> Path:
    """A tiny .tar.gz whose first header declares a GNU long name of `declared` bytes (all `A`)."""
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, declared
    stream = header.tobuf(format=tarfile.GNU_FORMAT) + b"A" * declared + bytes(-declared % 512)
    path.write_bytes(gzip.compress(stream + bytes(1024), compresslevel=9))
    return path


def test_a_huge_declared_long_name_is_refused_before_it_is_read(tmp_path: Path) -> None:
    bundle = gnu_long_name_bomb(tmp_path / "long.tar.gz", 64 * 2**20)
    assert bundle.stat().st_size < 200_000
    message = refusal(lambda: read_bundle(bundle))
    assert "long name declares 67108864 bytes" in message and "AAAA" not in message and len(message) < 300


@pytest.mark.parametrize("compression", ["bz2", "xz"])
def test_a_bundle_is_gzip_and_nothing_else(tmp_path: Path, compression: str) -> None:
    bundle = tmp_path / f"b.tar.{compression}"
    with tarfile.open(bundle, f"w:{compression}") as tar:
        info = tarfile.TarInfo("ddlrepro-x/big")
        info.size = 16 * 2**20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert refusal(lambda: read_bundle(bundle)) == f"{bundle}: not a gzip tarball (a bundle is a .tar.gz)"


def test_a_gzip_bomb_is_refused_by_its_declared_size_before_its_data_is_read(tmp_path: Path) -> None:
    bundle = tmp_path / "bomb.tar.gz"
    with tarfile.open(bundle, "w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo("ddlrepro-x/zeros")
        info.size = 256 * 2**20  # 256 MiB of zeros: about 250 KB stored, more than 100 × that
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert bundle.stat().st_size < 2**20
    message = refusal(lambda: read_bundle(bundle))
    assert "its files hold more than 67108864 bytes unpacked" in message


def test_members_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safe_read, "MAX_MEMBERS", 10)
    bundle = tmp_path / "many.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        for index in range(11):
            tar.addfile(tarfile.TarInfo(f"ddlrepro-x/{index}"), io.BytesIO(b""))
    assert "more than 10 members" in refusal(lambda: read_bundle(bundle))


def png_header(width: int, height: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + width.to_bytes(4, "big") + height.to_bytes(4, "big")


def test_a_picture_declaring_too_many_pixels_is_never_decoded() -> None:
    huge = png_header(100_000, 100_000) + b"\x08\x06\x00\x00\x00" + bytes(64)
    assert png_pixels(huge) == 10**10
    with bounded():
        assert not same_picture(png_header(10, 10), huge)
