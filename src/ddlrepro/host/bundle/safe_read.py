"""Read a bundle from anyone into memory without extracting it: every read on a budget, checked before (or
while) what it bounds is read, so a small hostile file cannot make verify read, allocate or print without end."""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any, cast

from ddlrepro.host.bundle.layout import BundleError

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
        return cast("bytes", data)


class GuardedTarInfo(tarfile.TarInfo):
    """tarfile's member headers, with the sizes of a GNU long name and a pax header checked before they are read."""

    def _proc_gnulong(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        if self.size > MAX_NAME_BYTES:
            raise BundleError(f"a member's long name declares {self.size} bytes (MAX_NAME_BYTES = {MAX_NAME_BYTES})")
        return super()._proc_gnulong(tarfile)  # type: ignore[misc,no-any-return]  # tarfile's private reader, not in its stubs

    def _proc_pax(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        if self.size > MAX_PAX_HEADER_BYTES:
            raise BundleError(
                f"a member's pax header declares {self.size} bytes (MAX_PAX_HEADER_BYTES = {MAX_PAX_HEADER_BYTES})"
            )
        return super()._proc_pax(tarfile)  # type: ignore[misc,no-any-return]  # tarfile's private reader, not in its stubs


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


def png_pixels(data: bytes) -> int | None:
    """Width × height from a PNG's header (its IHDR chunk), before anything is decoded; None if it is no PNG."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big") * int.from_bytes(data[20:24], "big")
