"""The throughput workload's data sources: a real SeaweedFS S3 server, MinIO's S3 client, and a real s3fs mount."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy
import pytest
import torch
from conftest import REPO, tiny_point

from ddlrepro.host import objectstore
from ddlrepro.host.config import ConfigError, load_config
from ddlrepro.host.figures import dlaas_scaling, figure_points
from ddlrepro.host.redaction import secret_values
from ddlrepro.host.run import run_point, unmet_requirement
from ddlrepro.host.tables import tidy_table
from ddlrepro.host.testing import local_launcher
from ddlrepro.rank import shards
from ddlrepro.rank.pack_shards import pack
from ddlrepro.rank.workloads.throughput import synthetic_batch

COUNT = 5
BATCH = 8


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data") / "shards"
    pack(folder, "resnet20", BATCH, COUNT)
    return folder


@pytest.fixture(scope="module")
def store(packed: Path) -> Iterator[objectstore.Store]:
    with objectstore.serving(packed) as running:
        yield running


def digests(params: dict, rank: int, world_size: int, steps: int) -> list[str]:
    reader = shards.reader({"shards": COUNT, **params}, rank, world_size)
    try:
        return [shards.batch_digest(*reader.next()) for _ in range(steps)]
    finally:
        reader.close()


def test_every_source_delivers_the_same_bytes(packed: Path, store: objectstore.Store) -> None:
    synthetic = [
        shards.batch_digest(*synthetic_batch("resnet20", BATCH, None, torch.device("cpu"), seed=index))
        for index in range(COUNT)
    ]
    for rank in range(2):
        expected = [synthetic[(step * 2 + rank) % COUNT] for step in range(6)]
        assert digests({"data_source": "local", "shards_dir": str(packed)}, rank, 2, 6) == expected
        assert digests({"data_source": "s3", **store.inputs()}, rank, 2, 6) == expected
    if objectstore.s3fs_unavailable_reason():
        pytest.skip(objectstore.s3fs_unavailable_reason())
    with objectstore.mounted(store) as mountpoint:
        assert digests({"data_source": "s3fs", "shards_dir": str(mountpoint)}, 1, 2, 6) == expected
    assert not mountpoint.exists()


@pytest.mark.timeout(60)  # before re-raising, a second next() blocked for ever
def test_a_missing_shard_is_named(packed: Path, store: objectstore.Store) -> None:
    """Reading one shard more than there are: the error names the object (after the ones that exist)."""
    reader = shards.reader({"data_source": "s3", "shards": COUNT + 1, **store.inputs()}, 0, 1)
    missing = rf"missing shard s3://{store.bucket}/shard-0000{COUNT}\.npz"
    try:
        with pytest.raises(FileNotFoundError, match=missing):
            for _ in range(COUNT + 1):
                reader.next()
        with pytest.raises(FileNotFoundError, match=missing):  # again, not blocked on the ended thread's queue
            reader.next()
    finally:
        reader.close()
    with pytest.raises(FileNotFoundError, match=rf"missing shard {packed}/shard-0000{COUNT}\.npz"):
        digests({"data_source": "local", "shards_dir": str(packed), "shards": COUNT + 1}, 0, 1, COUNT + 1)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.serial  # a deadline of seconds
def test_an_unreachable_endpoint_fails_fast_naming_endpoint_and_bucket(tmp_path: Path) -> None:
    keys = {"access_key": "DDLTESTACCESS0001", "secret_key": "never-printed-secret-0123456789"}
    credentials = objectstore.write_private(tmp_path / "credentials.json", json.dumps(keys))
    endpoint = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(shards.StoreUnreachable) as caught:
        shards.reader({"data_source": "s3", "shards": 1, "endpoint": endpoint, "bucket": "b-unreachable",
                       "credentials_file": str(credentials)}, 0, 1)  # fmt: skip
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert endpoint in message and "b-unreachable" in message
    assert not any(key in message for key in keys.values())


@pytest.mark.serial  # a deadline of seconds
def test_an_unreachable_configured_store_fails_the_run_fast(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_S3_ACCESS", "DDLTESTACCESS0002")
    monkeypatch.setenv("TEST_S3_SECRET", "never-printed-secret-9876543210")
    endpoint = f"http://127.0.0.1:{closed_port()}"
    store = {"endpoint": endpoint, "bucket": "b-configured",
             "credentials_env": {"access_key": "TEST_S3_ACCESS", "secret_key": "TEST_S3_SECRET"}}  # fmt: skip
    point = tiny_point(workers=1, figure="dlaas-scaling", data_source="s3", shards=COUNT)
    point = replace(point, inputs={"shards_dir": str(packed), **objectstore.store_inputs(store)})
    started = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        run_point(point, tmp_path / "run", local_launcher(60))
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert f"object store {endpoint}, bucket b-configured: unreachable" in message
    assert "never-printed" not in message and "DDLTESTACCESS" not in message


@pytest.mark.serial  # a deadline of seconds
def test_the_store_starts_and_stops_in_time_and_keeps_its_keys_private(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports: list[int] = []
    free_port_pair = objectstore.free_port_pair
    monkeypatch.setattr(objectstore, "free_port_pair", lambda: ports.append(free_port_pair()) or ports[-1])
    started = time.monotonic()
    with objectstore.serving(packed) as running:
        assert {"s3.sock", "filer.sock"} <= {path.name for path in running.credentials_file.parent.iterdir()}
        up = time.monotonic() - started
        keys = json.loads(running.credentials_file.read_text())
        assert stat.S_IMODE(running.credentials_file.stat().st_mode) == 0o600
        assert not running.credentials_file.is_relative_to(REPO)
        assert set(keys.values()) <= set(secret_values())  # registered: redacted wherever the run writes them
        assert running.provenance() == {
            "storage": "SeaweedFS (not IBM COS)",
            "endpoint": running.endpoint,
            "bucket": "ddlrepro-shards",
            "objects": COUNT,
            "total_bytes": sum(path.stat().st_size for path in packed.glob("*.npz")),
        }
        port = int(running.endpoint.rsplit(":", 1)[1])
        stopping = time.monotonic()
    down = time.monotonic() - stopping
    assert up <= objectstore.START_TIMEOUT_S and down <= 15, (up, down)
    assert not running.credentials_file.parent.exists()
    leftovers = [path for port in ports for number in (port, port + 10000)
                 for path in objectstore.SOCKET_FOLDER.glob(f"seaweedfs-*-{number}.sock")]  # fmt: skip
    assert len(ports) == 4 and leftovers == []
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_an_s3_run_reads_the_store_and_records_no_key(packed: Path, tmp_path: Path) -> None:
    point = tiny_point(workers=1, figure="dlaas-scaling", data_source="s3", shards=COUNT)
    point = replace(point, inputs={"shards_dir": str(packed)})
    before = set(secret_values())
    record = run_point(point, tmp_path / "run", local_launcher(120))
    assert record["status"] == "ok" and record["summary"]["img_per_sec_per_worker"] > 0
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert provenance["data"]["storage"] == "SeaweedFS (not IBM COS)" and provenance["data"]["objects"] == COUNT
    keys = set(secret_values()) - before
    assert len(keys) == 2
    written = b"".join(path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file())
    assert not [key for key in keys if key.encode() in written]


def test_an_s3_run_trains_on_synthetic_data_in_turns_and_pairs_the_two_rates(packed: Path, tmp_path: Path) -> None:
    settings = [{"data_source": "s3"}, {"data_source": "synthetic"}]
    point = tiny_point(1, "dlaas-scaling", data_source="s3", store="seaweedfs", shards=COUNT, settings=settings)
    point = replace(point, params={**point.params, "iterations": 3})
    record = run_point(replace(point, inputs={"shards_dir": str(packed)}), tmp_path / "run", local_launcher(120))
    assert record["status"] == "ok"
    table = tidy_table([tmp_path / "run"])
    rates = table[table["metric"] == "img_per_sec"]
    turns = rates.sort_values("time")["setting"].tolist()
    assert turns == ["s3", "synthetic", "synthetic", "s3", "s3", "synthetic"]  # the order rotated every iteration

    summary = dlaas_scaling.summarize(table.assign(status="ok"))
    (s3,) = summary[summary["data_source"] == "s3"].itertuples()
    by_setting = rates.groupby("setting")["value"].mean()
    assert s3.rate_vs_synthetic == pytest.approx(by_setting["s3"] / by_setting["synthetic"])
    measured = summary[summary["status"] == "ok"]
    assert measured["data_source"].tolist() == ["s3"]  # the run's synthetic side is no series of its own


def test_a_paused_reader_fetches_nothing_until_resumed() -> None:
    buffer = io.BytesIO()
    numpy.savez(buffer, images=numpy.zeros((1, 3, 2, 2), "float32"), labels=numpy.zeros(1, "int64"))
    fetched: list[str] = []
    reader = shards.PrefetchingReader(lambda name: fetched.append(name) or buffer.getvalue(), iter(range(100)), 4)
    try:
        reader.pause()
        count = len(fetched)  # what it read ahead before the pause, and the fetch then under way
        for _ in range(count):  # room in the queue: a running reader would fetch again
            reader.next()
        time.sleep(0.3)
        assert len(fetched) == count
        reader.resume()
        deadline = time.monotonic() + 5
        while len(fetched) < count + 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(fetched) >= count + 4
    finally:
        reader.close()


def test_default_points_keep_their_ids_and_s3fs_needs_fuse_and_the_local_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = load_config(REPO / "config" / "config.yaml", REPO / "tests" / "configs" / "tiny.yaml")
    section = config["figures"]["dlaas-scaling"]
    (synthetic,) = {point.params.get("data_source") for point in figure_points(config)["dlaas-scaling"].values()}
    assert synthetic is None  # the default is left out of the params: today's ids stay
    section["data_sources"] = ["synthetic", "s3fs"]
    s3fs = [point for point in figure_points(config)["dlaas-scaling"].values() if point.params.get("data_source")]
    assert len(s3fs) == len(section["workers"])
    monkeypatch.setattr(objectstore.os, "geteuid", lambda: 1000)
    assert unmet_requirement(s3fs[0]) == "skipped: s3fs needs root to mount the bucket (FUSE)"
    assert "the local launcher's ranks only" in unmet_requirement(s3fs[0], "slurm")


def test_sources_run_on_the_host_network_and_networks_on_synthetic_data() -> None:
    """The axes are not crossed: each data source on the host network, each testbed network on synthetic data;
    other sources without the host network are refused, naming the key."""
    config = load_config(REPO / "config" / "config.yaml", REPO / "tests" / "configs" / "tiny.yaml")
    axes = {"data_sources": ["synthetic", "s3"], "networks": ["host", "bridge", "overlay"]}
    config["figures"]["dlaas-scaling"] |= axes
    runs = {
        (point.params.get("network", "host"), point.params.get("data_source", "synthetic"), point.workers)
        for point in figure_points(config)["dlaas-scaling"].values()
    }
    workers = config["figures"]["dlaas-scaling"]["workers"]
    expected = [("host", "synthetic"), ("host", "s3"), ("bridge", "synthetic"), ("overlay", "synthetic")]
    assert runs == {(network, source, count) for network, source in expected for count in workers}
    config["figures"]["dlaas-scaling"]["networks"] = ["bridge", "overlay"]
    with pytest.raises(ConfigError, match=r"figures\.dlaas-scaling\.data_sources: .*add host to networks"):
        figure_points(config)


def test_credentials_missing_from_the_environment_are_named_by_role(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key pasted where a variable's name belongs is not echoed: the error names the role."""
    pasted = "AKIAPASTEDKEY0123456"
    monkeypatch.delenv(pasted, raising=False)
    monkeypatch.setenv("TEST_S3_SECRET", "never-printed-secret-5555")
    with pytest.raises(RuntimeError, match=r"credentials_env\.access_key names is not set") as caught:
        objectstore.environment_credentials({"access_key": pasted, "secret_key": "TEST_S3_SECRET"})
    assert pasted not in str(caught.value)


def test_the_store_holds_paper_scale_shards() -> None:
    paper_shards = 16 * 80_000_000  # ~1.2 GB: 16 shards of 80 MB
    volumes = objectstore.volume_count(paper_shards)
    assert (volumes - objectstore.SPARE_VOLUMES) * objectstore.VOLUME_SIZE_MB * 2**20 >= paper_shards


def test_a_busy_mount_is_unmounted_lazily(store: objectstore.Store) -> None:
    if objectstore.s3fs_unavailable_reason():
        pytest.skip(objectstore.s3fs_unavailable_reason())
    assert "connect_timeout=3,readwrite_timeout=30" in objectstore.mount_command(store, Path("m"), Path("p"))[-1]
    with objectstore.mounted(store) as mountpoint, (mountpoint / shards.shard_name(0)).open("rb") as busy:
        busy.read(16)  # held open across the unmount: plain `umount` refuses (target is busy)
        assert os.path.ismount(mountpoint)
    assert not os.path.ismount(mountpoint) and not mountpoint.exists()


def test_a_hanging_fetch_is_reported_at_close() -> None:
    release = threading.Event()
    reader = shards.PrefetchingReader(lambda name: release.wait(10) and b"", iter([0]), 1)
    try:
        with pytest.warns(RuntimeWarning, match="still running"):
            reader.close(timeout_s=0.2)
    finally:
        release.set()
