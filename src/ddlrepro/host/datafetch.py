"""Data sets the workflow may fetch: CIFAR-10's python batches (kungfu-fig4 at paper scale), from their canonical
address, checked against the published checksum, never left half-written.

A fetch downloads into a temporary folder beside the destination, checks the byte count and the MD5 the data set's
page publishes, unpacks there (tarfile's `data` filter: no path leaves the folder), checks the batches, and only
then moves each file into place and writes a marker naming what was fetched. Any failure leaves the destination as
it was. The marker lets a point's id name the data (the archive's checksum) before the data is here, and the same
after: a planned fetch and a finished one give the same runs.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ddlrepro.host.errors import UserError
from ddlrepro.rank import datasets

# https://www.cs.toronto.edu/~kriz/cifar.html: "CIFAR-10 python version", its MD5 published beside it (the same
# values as torchvision.datasets.CIFAR10's url and tgz_md5).
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE_FOLDER = "cifar-10-batches-py"
DEFAULT_CIFAR10_DIR = Path("resources") / CIFAR10_ARCHIVE_FOLDER
MARKER = ".ddlrepro-fetched.json"
CHUNK = 1 << 20


class FetchError(UserError):
    """A download failed or did not match its checksum; nothing was left in the destination."""


def cifar10_folder(data_dir: str | None) -> Path:
    """Where kungfu-fig4's CIFAR-10 batches are (or will be fetched to): `data_dir`, else resources/..., absolute
    (the ranks may start in another working directory)."""
    return Path(data_dir or DEFAULT_CIFAR10_DIR).expanduser().resolve()


def cifar10_missing(folder: Path) -> Path | None:
    """The first of CIFAR-10's python batches not in `folder`; None when all are there."""
    return next((folder / name for name in datasets.CIFAR10_FILES if not (folder / name).is_file()), None)


def cifar10_present(folder: Path) -> bool:
    return cifar10_missing(folder) is None


def fetched_identity(md5: str | None = None) -> str:
    """What identifies batches this module fetched: the archive's checksum (by default the published one)."""
    return f"cifar-10-python.tar.gz md5 {md5 or CIFAR10_MD5}"


def cifar10_identity(folder: Path) -> str:
    """The data's identity for a point's id: the fetched archive's checksum where the marker still describes the
    files (sizes and modification times), else a digest of the files' contents (a copy of the user's own)."""
    if not cifar10_present(folder):
        return fetched_identity()  # a fetch is planned: the marker will say this
    marker = folder / MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("files") == file_stamps(folder):
            return str(recorded["identity"])
    return datasets.cifar10_digest(folder)


def file_stamps(folder: Path) -> dict[str, list[int]]:
    stats = {name: (folder / name).stat() for name in datasets.CIFAR10_FILES}
    return {name: [stat.st_size, stat.st_mtime_ns] for name, stat in stats.items()}


def fetch_cifar10(folder: Path, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5, timeout_s: float = 300) -> None:
    """Download, verify and unpack CIFAR-10's python batches into `folder` (see the module's docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.fetch-") as scratch:
        archive = download(url, md5, Path(scratch) / "archive.tar.gz", timeout_s)
        unpacked = Path(scratch) / "unpacked"
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")
            datasets.check_cifar10(unpacked / CIFAR10_ARCHIVE_FOLDER)
        except (tarfile.TarError, FileNotFoundError) as error:
            raise FetchError(f"{url}: the archive does not hold CIFAR-10's python batches ({error})") from None
        for name in datasets.CIFAR10_FILES:
            os.replace(unpacked / CIFAR10_ARCHIVE_FOLDER / name, folder / name)
        marker = Path(scratch) / MARKER
        marker.write_text(json.dumps({"identity": fetched_identity(md5), "url": url, "files": file_stamps(folder)}))
        os.replace(marker, folder / MARKER)


def download(url: str, md5: str, path: Path, timeout_s: float) -> Path:
    """`url` into `path`, checked: every announced byte arrived and the MD5 is `md5`; FetchError otherwise."""
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(path, "wb") as out:
            announced = response.headers.get("Content-Length")
            while chunk := response.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
        raise FetchError(f"{url}: the download failed after {received} bytes ({error}); nothing was kept") from None
    if announced is not None and received != int(announced):
        raise FetchError(f"{url}: the connection closed after {received} of {announced} bytes; nothing was kept")
    if digest.hexdigest() != md5:
        raise FetchError(
            f"{url}: MD5 {digest.hexdigest()} is not the published {md5} ({received} bytes); nothing was kept"
        )
    return path
