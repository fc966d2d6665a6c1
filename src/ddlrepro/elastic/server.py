"""The config server: the desired cluster, versioned, as KungFu's config server held it.

Every change makes a new version (a list of worker ids; the position in it is the rank; an empty list stops the
job). Endpoints (JSON bodies; changes need `Authorization: Bearer <token>`):

    GET  /config                      the latest version
    GET  /config?version=V            version V (404 if it does not exist yet)
    GET  /config?after=V&timeout=S    wait up to S seconds for a version newer than V (long poll)
    POST /resize   {"size": N}        keep the first N members, or add new ones (ids from the launcher)
    POST /remove   {"worker": ID}     drop a worker (the launcher does this when one dies)
    PUT  /config   {"members": [...]} set the membership outright
    POST /reset                       back to the initial membership
    GET  /health

Bound to 127.0.0.1 unless told otherwise. Malformed requests get a 4xx with a JSON reason, never a crash.
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ddlrepro.redaction import register_secret

MAX_BODY_BYTES = 64 * 1024
MAX_WAIT_S = 60.0


@dataclass(frozen=True)
class Cluster:
    """One version of the desired cluster."""

    version: int
    members: list[int]
    time: float
    reason: str

    def rank_of(self, worker: int) -> int | None:
        return self.members.index(worker) if worker in self.members else None

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Cluster:
        return cls(int(value["version"]), [int(member) for member in value["members"]], value["time"], value["reason"])


class RequestError(Exception):
    """A request the server refuses: its HTTP status and the reason sent back."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class ClusterConfig:
    """The versions of the cluster, safe to change from several threads; `on_change` sees every new version.

    `new_workers(k, members)` gives the ids of k workers to add to `members` (the launcher may hand out warm
    standbys first)."""

    def __init__(
        self,
        initial: list[int],
        new_workers: Callable[[int, list[int]], list[int]],
        on_change: Callable[[Cluster], None] | None = None,
    ) -> None:
        self.initial = list(initial)
        self.new_workers = new_workers
        self.on_change = on_change
        self.versions = [Cluster(1, list(initial), time.time(), "initial")]
        self.changed = threading.Condition()

    @property
    def latest(self) -> Cluster:
        with self.changed:
            return self.versions[-1]

    def version(self, number: int) -> Cluster:
        with self.changed:
            if not 1 <= number <= len(self.versions):
                raise RequestError(
                    HTTPStatus.NOT_FOUND, f"version {number} does not exist (latest is {len(self.versions)})"
                )
            return self.versions[number - 1]

    def wait_newer(self, version: int, timeout_s: float) -> Cluster:
        """The latest version once it is newer than `version`, or the latest at the timeout."""
        with self.changed:
            self.changed.wait_for(lambda: self.versions[-1].version > version, timeout=timeout_s)
            return self.versions[-1]

    def resize(self, size: int) -> Cluster:
        with self.changed:
            members = self.versions[-1].members
            if size <= len(members):
                return self._publish(members[:size], f"resize to {size}")
            return self._publish(members + self.new_workers(size - len(members), members), f"resize to {size}")

    def remove(self, worker: int) -> Cluster:
        with self.changed:
            members = self.versions[-1].members
            if worker not in members:
                raise RequestError(
                    HTTPStatus.CONFLICT, f"worker {worker} is not a member of version {len(self.versions)}"
                )
            return self._publish([member for member in members if member != worker], f"worker {worker} removed")

    def put(self, members: list[int]) -> Cluster:
        with self.changed:
            return self._publish(members, "put")

    def reset(self) -> Cluster:
        with self.changed:
            return self._publish(self.initial, "reset")

    def _publish(self, members: list[int], reason: str) -> Cluster:
        cluster = Cluster(len(self.versions) + 1, list(members), time.time(), reason)
        self.versions.append(cluster)
        self.changed.notify_all()
        if self.on_change:
            self.on_change(cluster)
        return cluster


class ConfigServer:
    """Serves a `ClusterConfig` over HTTP in a background thread."""

    def __init__(self, config: ClusterConfig, token: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.token = token
        register_secret(token)  # so that a worker printing it (it is in their environment) is redacted in the log
        self.http = ThreadingHTTPServer((host, port), _handler_for(self))
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, name="config-server", daemon=True)

    @property
    def address(self) -> str:
        host, port = self.http.server_address[:2]
        return f"{host}:{port}"

    def __enter__(self) -> ConfigServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()

    def authorised(self, header: str | None) -> bool:
        scheme, _, given = (header or "").partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(given.encode(), self.token.encode())


def _handler_for(server: ConfigServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else headers and body wait for the client's delayed ACK (~40 ms)

        def do_GET(self) -> None:
            self._answer(lambda: _get(server.config, self.path))

        def do_POST(self) -> None:
            self._answer(lambda: _change(server, "POST", self.path, self._body(), self.headers))

        def do_PUT(self) -> None:
            self._answer(lambda: _change(server, "PUT", self.path, self._body(), self.headers))

        def _body(self) -> bytes:
            length = self.headers.get("Content-Length", "0")
            if not length.isdigit():
                raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {length!r}")
            if int(length) > MAX_BODY_BYTES:
                raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
            return self.rfile.read(int(length))

        def _answer(self, handle: Callable[[], Cluster | dict[str, Any]]) -> None:
            try:
                answer = handle()
                status, body = HTTPStatus.OK, asdict(answer) if isinstance(answer, Cluster) else answer
            except RequestError as error:
                status, body = error.status, {"error": str(error)}
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if status >= HTTPStatus.BAD_REQUEST:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: requests are not logged (they come every training step)."""

    return Handler


def _get(config: ClusterConfig, path: str) -> Cluster | dict[str, Any]:
    url = urlsplit(path)
    if url.path == "/health":
        return {"status": "ok", "version": config.latest.version}
    if url.path != "/config":
        raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: GET {url.path}")
    query = {key: values[-1] for key, values in parse_qs(url.query).items()}
    if "version" in query:
        return config.version(_whole(query["version"], "version"))
    if "after" in query:
        timeout = min(float(_whole(query.get("timeout", "10"), "timeout")), MAX_WAIT_S)
        return config.wait_newer(_whole(query["after"], "after"), timeout)
    return config.latest


def _change(server: ConfigServer, method: str, path: str, body: bytes, headers: Any) -> Cluster:
    if not server.authorised(headers.get("Authorization")):
        raise RequestError(HTTPStatus.UNAUTHORIZED, "changes need `Authorization: Bearer <token>`")
    route = (method, urlsplit(path).path)
    config = server.config
    request = _json_object(body)
    if route == ("POST", "/resize"):
        return config.resize(_field(request, "size", int, minimum=0))
    if route == ("POST", "/remove"):
        return config.remove(_field(request, "worker", int, minimum=0))
    if route == ("PUT", "/config"):
        members = _field(request, "members", list)
        if not all(isinstance(member, int) and member >= 0 for member in members) or len(set(members)) < len(members):
            raise RequestError(HTTPStatus.BAD_REQUEST, "`members` must be distinct worker ids (whole numbers >= 0)")
        return config.put(members)
    if route == ("POST", "/reset"):
        return config.reset()
    raise RequestError(HTTPStatus.NOT_FOUND, f"no such endpoint: {method} {route[1]}")


def _json_object(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
    return value


def _field(request: dict[str, Any], name: str, kind: type, minimum: int | None = None) -> Any:
    value = request.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) or (minimum is not None and value < minimum):
        expected = f"a whole number >= {minimum}" if minimum is not None else kind.__name__
        raise RequestError(HTTPStatus.BAD_REQUEST, f"`{name}` must be {expected}, got {value!r}")
    return value


def _whole(text: str, name: str) -> int:
    if not text.isdigit():
        raise RequestError(HTTPStatus.BAD_REQUEST, f"query parameter `{name}` must be a whole number, got {text!r}")
    return int(text)
