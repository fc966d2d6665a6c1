"""The throughput workload's data as shards: the readers of each `data_source` (the packer: pack_shards.py).

A shard is one batch: the synthetic images and labels the workload trains on (`synthetic_batch`, seeded with the
shard's index, so shard 0 is rank 0's synthetic batch), saved uncompressed with numpy (`shard-00000.npz`). Every
reader delivers shard `(step × world + rank) mod shards` at a rank's step `step`, decoded on a thread behind a
bounded queue (`prefetch` shards ahead), so that reading hides behind the training step. A reader can be paused:
in a paired run (the throughput workload's `settings`) it reads only during its own setting's turn, so its work is
timed with the setting that needs it, never with the other:

- `local`: files in a folder (the packer's output); `s3fs`: the same files through the FUSE mount of the bucket;
- `s3`: objects in a bucket, read with MinIO's S3 client; the endpoint is checked first (an unreachable one fails
  within `s3client.CONNECT_TIMEOUT_S` × 2 naming endpoint and bucket), and a missing object is an error naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ddlrepro.rank.s3client import s3_client

FILE_SOURCES = ("local", "s3fs")
SOURCES = ("synthetic", *FILE_SOURCES, "s3")
DEFAULT_PREFETCH = 4
CLOSE_TIMEOUT_S = 5.0


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.npz"


def decode(data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(io.BytesIO(data)) as arrays:
        return torch.from_numpy(arrays["images"].copy()), torch.from_numpy(arrays["labels"].copy())


def batch_digest(images: torch.Tensor, labels: torch.Tensor) -> str:
    """The bytes of one batch, as a sha256: every source must deliver the same."""
    digest = hashlib.sha256(images.cpu().numpy().tobytes())
    digest.update(labels.cpu().numpy().tobytes())
    return digest.hexdigest()


def shard_order(rank: int, world_size: int, count: int) -> Iterator[int]:
    """The shards a rank reads, step after step, for ever."""
    step = 0
    while True:
        yield (step * world_size + rank) % count
        step += 1


class PrefetchingReader:
    """Fetches and decodes shards on a thread, at most `depth` ahead of the consumer; its errors reach the consumer.
    `pause` returns once no fetch is under way and none starts until `resume`."""

    def __init__(self, fetch: Callable[[str], bytes], order: Iterator[int], depth: int) -> None:
        self._fetch = fetch
        self._order = order
        self._queue: queue.Queue[tuple[torch.Tensor, torch.Tensor] | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._fetching = threading.Lock()  # held while a shard is fetched and decoded
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._produce, name="shard-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for index in self._order:
                item = self._fetch_when_running(index)
                if item is None:
                    return
                self._put(item)
        except BaseException as error:  # handed to the consumer, which raises it
            self._put(error)

    def _fetch_when_running(self, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Shard `index`, fetched once the reader runs; None once it is closed."""
        while not self._stop.is_set():
            if not self._running.wait(timeout=0.1):
                continue
            with self._fetching:
                if self._running.is_set():  # not paused between the wait and the lock
                    return decode(self._fetch(shard_name(index)))
        return None

    def pause(self) -> None:
        self._running.clear()
        with self._fetching:  # the fetch under way, if any, finishes first
            pass

    def resume(self) -> None:
        self._running.set()

    def _put(self, item: tuple[torch.Tensor, torch.Tensor] | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next shard; the thread's error, raised again on every later call (the thread has ended)."""
        if self._error is not None:
            raise self._error
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._error = item
            raise item
        return item

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():  # a fetch still hangs (e.g. on a dead mount): say so, the daemon thread is left
            warnings.warn(f"shard prefetch thread still running {timeout_s:.0f} s after close", RuntimeWarning, 2)


def file_fetcher(folder: Path) -> Callable[[str], bytes]:
    def fetch(name: str) -> bytes:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"missing shard {path}")
        return path.read_bytes()

    if not folder.is_dir():
        raise FileNotFoundError(f"shards folder {folder} does not exist")
    return fetch


def read_credentials(path: Path) -> tuple[str, str]:
    """The run's access key and secret key, from the 0600 JSON file the host side wrote."""
    values = json.loads(path.read_text())
    return values["access_key"], values["secret_key"]


class StoreUnreachable(RuntimeError):
    pass


def s3_fetcher(endpoint: str, bucket: str, credentials_file: Path) -> Callable[[str], bytes]:
    """A fetch of one object of `bucket`; the bucket is looked up first so a dead endpoint fails at once."""
    from minio.error import S3Error

    client = s3_client(endpoint, *read_credentials(credentials_file))
    try:
        found = client.bucket_exists(bucket)
    except S3Error as error:
        raise StoreUnreachable(f"object store {endpoint}, bucket {bucket}: {error.code}") from None
    except Exception as error:
        raise StoreUnreachable(
            f"object store {endpoint} unreachable (bucket {bucket}): {type(error).__name__}"
        ) from None
    if not found:
        raise StoreUnreachable(f"object store {endpoint} has no bucket {bucket}")

    def fetch(name: str) -> bytes:
        try:
            response = client.get_object(bucket, name)
        except S3Error as error:
            raise FileNotFoundError(f"missing shard s3://{bucket}/{name} at {endpoint}: {error.code}") from None
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    return fetch


def reader(params: dict[str, Any], rank: int, world_size: int) -> PrefetchingReader:
    """The reader of the point's `data_source` (not `synthetic`), from its params and inputs."""
    source = params["data_source"]
    if source in FILE_SOURCES:
        fetch = file_fetcher(Path(params["shards_dir"]))
    elif source == "s3":
        fetch = s3_fetcher(params["endpoint"], params["bucket"], Path(params["credentials_file"]))
    else:
        raise ValueError(f"unknown data_source {source!r}; valid sources: {', '.join(SOURCES)}")
    order = shard_order(rank, world_size, params["shards"])
    return PrefetchingReader(fetch, order, params.get("prefetch", DEFAULT_PREFETCH))
