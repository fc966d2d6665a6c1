"""Fetching CIFAR-10 (issue 36 item 5): against an HTTP server this test starts on 127.0.0.1 serving an archive it
builds: a good archive lands verified and whole; a wrong checksum, a cut connection or a wrong archive leave
nothing behind and say why; a point's data identity is the same before the fetch and after it."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ddlrepro.host import datafetch
from ddlrepro.host.datafetch import FetchError, cifar10_identity, fetch_cifar10, fetched_identity
from ddlrepro.rank import datasets

BATCH_BYTES = 4096  # each batch's size here; the check's minimum is lowered to match (a real batch is 30 MB)


def archive(folder: str = datafetch.CIFAR10_ARCHIVE_FOLDER) -> bytes:
    """A tar.gz laid out as CIFAR-10's python archive, small batches of distinct bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for index, name in enumerate(datasets.CIFAR10_FILES):
            data = bytes([index]) * BATCH_BYTES
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


GOOD = archive()
ROUTES = {"/good.tar.gz": GOOD, "/cut.tar.gz": GOOD, "/other.tar.gz": archive("something-else")}


class ArchiveHandler(BaseHTTPRequestHandler):
    """Serves ROUTES; /cut.tar.gz announces the whole archive and closes the connection halfway."""

    def do_GET(self) -> None:
        body = ROUTES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if self.path == "/cut.tar.gz" else body)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ArchiveHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "CIFAR10_MIN_BYTES", BATCH_BYTES)


def good_md5() -> str:
    return hashlib.md5(GOOD, usedforsecurity=False).hexdigest()


def test_a_good_archive_lands_whole_and_verified(server: str, tmp_path: Path) -> None:
    folder = tmp_path / "cifar"
    fetch_cifar10(folder, f"{server}/good.tar.gz", good_md5(), timeout_s=30)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*datasets.CIFAR10_FILES, datafetch.MARKER])
    assert (folder / "test_batch").read_bytes() == bytes([5]) * BATCH_BYTES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar"]  # no scratch folder left
    assert cifar10_identity(folder) == fetched_identity(good_md5())


@pytest.mark.parametrize(
    ("route", "md5", "problem"),
    [
        ("good.tar.gz", "0" * 32, "is not the published " + "0" * 32),
        ("cut.tar.gz", None, f"closed after {len(GOOD) // 2} of {len(GOOD)} bytes"),
        ("other.tar.gz", None, "does not hold CIFAR-10's python batches"),
        ("missing.tar.gz", None, "HTTP Error 404"),
    ],
)
def test_a_failed_fetch_says_why_and_leaves_the_folder_as_it_was(
    server: str, tmp_path: Path, route: str, md5: str | None, problem: str
) -> None:
    folder = tmp_path / "cifar"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    expected = md5 or (hashlib.md5(ROUTES.get(f"/{route}", b""), usedforsecurity=False).hexdigest())
    with pytest.raises(FetchError, match=r"nothing was kept|does not hold") as caught:
        fetch_cifar10(folder, f"{server}/{route}", expected, timeout_s=30)
    assert problem in str(caught.value)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar"]


def test_a_planned_fetch_and_a_finished_one_give_the_same_identity(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fetch the id names the published checksum; after it, the marker says the same. A file changed
    afterwards is no longer what was fetched: the identity becomes its contents' digest."""
    monkeypatch.setattr(datafetch, "CIFAR10_MD5", good_md5())
    folder = tmp_path / "cifar"
    planned = cifar10_identity(folder)
    fetch_cifar10(folder, f"{server}/good.tar.gz", good_md5(), timeout_s=30)
    assert cifar10_identity(folder) == planned == fetched_identity()
    (folder / "data_batch_1").write_bytes(b"\xff" * BATCH_BYTES)
    assert cifar10_identity(folder) == datasets.cifar10_digest(folder) != planned
