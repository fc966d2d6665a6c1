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

Bound to 127.0.0.1 unless told otherwise. Malformed or hostile requests get a 4xx with a JSON reason, never a
crash: numbers are plain ASCII digits within bounds (a size at most the job's declared maximum), bodies are
refused with 413 before they are read (and drained, so the client sees the answer), JSON nesting is limited.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ddlrepro.host.redaction import register_secret
from ddlrepro.rank.elastic.cluster import Cluster

MAX_BODY_BYTES = 64 * 1024
MAX_WAIT_S = 60.0
MAX_DIGITS = 18  # any number a client may send fits in 64 bits; int() of 5,000 digits raises instead
MAX_WORKER_ID = 2**31 - 1
# Every worker and standby of a job connects at once, to this server (long polls: the default backlog of 5 made 200
# polls wait up to 31 s); the job's TCPStore socket has its own (rank/runtime.py).
LISTEN_BACKLOG = 1024
DRAIN_BYTES = 16 * 1024 * 1024  # an oversized body is read and dropped up to this much, so the client gets its 413
DRAIN_S = 5.0
IDLE_TIMEOUT_S = 30.0  # a connection's socket reads: between requests, and within one
MAX_CONNECTIONS = 256  # at once: every worker and standby of the largest job keeps one, and long-polls on it


class RequestError(Exception):
    """A request the server refuses: its HTTP status and the reason sent back."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class ClusterConfig:
    """The versions of the cluster, safe to change from several threads; `on_change` sees every new version.

    `new_workers(k, members)` gives the ids of k workers to add to `members` (the launcher may hand out warm
    standbys first). `max_size` is the job's declared maximum: no change may make the cluster larger."""

    def __init__(
        self,
        initial: list[int],
        new_workers: Callable[[int, list[int]], list[int]],
        on_change: Callable[[Cluster], None] | None = None,
        *,
        max_size: int,
    ) -> None:
        if len(initial) > max_size:
            raise ValueError(f"{len(initial)} initial members exceed the declared maximum of {max_size}")
        self.initial = list(initial)
        self.max_size = max_size
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
        self._check_size(size)
        with self.changed:
            members = self.versions[-1].members
            if size <= len(members):
                return self._publish(members[:size], f"resize to {size}")
            return self._publish(members + self.new_workers(size - len(members), members), f"resize to {size}")

    def stop(self) -> None:
        """No members: every worker finishes after its current step (the host ends the job)."""
        self.resize(0)

    def remove(self, worker: int) -> Cluster:
        with self.changed:
            members = self.versions[-1].members
            if worker not in members:
                raise RequestError(
                    HTTPStatus.CONFLICT, f"worker {worker} is not a member of version {len(self.versions)}"
                )
            return self._publish([member for member in members if member != worker], f"worker {worker} removed")

    def put(self, members: list[int]) -> Cluster:
        self._check_size(len(members))
        with self.changed:
            return self._publish(members, "put")

    def reset(self) -> Cluster:
        with self.changed:
            return self._publish(self.initial, "reset")

    def _check_size(self, size: int) -> None:
        if size > self.max_size:
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"size {size} is over this job's declared maximum of {self.max_size}"
            )

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
        self.http = _Listener((host, port), _handler_for(self))
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, name="config-server", daemon=True)

    @property
    def address(self) -> str:
        host, port = self.http.server_address[:2]
        return f"{host!s}:{port}"

    def __enter__(self) -> ConfigServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()

    def authorised(self, header: str | None) -> bool:
        scheme, _, given = (header or "").partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(given.encode(), self.token.encode())


class _Listener(ThreadingHTTPServer):
    """One thread per connection, at most MAX_CONNECTIONS at once (one more is closed at once); a client that hangs
    up is no error worth a traceback."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, reset: the client left
            super().handle_error(request, client_address)


def _handler_for(server: ConfigServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else headers and body wait for the client's delayed ACK (~40 ms)
        timeout = IDLE_TIMEOUT_S  # a silent or half-sent request frees its thread (clients reconnect once)

        def do_GET(self) -> None:
            self._answer(lambda: _get(server.config, self.path))

        def do_POST(self) -> None:
            self._answer(lambda: _change(server, "POST", self.path, self._body(), self.headers))

        def do_PUT(self) -> None:
            self._answer(lambda: _change(server, "PUT", self.path, self._body(), self.headers))

        def handle_expect_100(self) -> bool:
            """Refuse an announced oversized body before the client sends it (curl asks for large bodies)."""
            try:
                _body_length(self.headers)
            except RequestError as error:
                self._answer(partial(_raise, error), drain=False)  # the client has not sent the body
                return False
            return super().handle_expect_100()

        def _body(self) -> bytes:
            return self.rfile.read(_body_length(self.headers))

        def _answer(self, handle: Callable[[], Cluster | dict[str, Any]], drain: bool = True) -> None:
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
            if status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE and drain:
                self._drain_body()

        def _drain_body(self) -> None:
            """Read and drop what the client is still sending: closing with unread data resets the connection,
            and the client would see a broken pipe instead of our 413. Bounded in bytes and time."""
            deadline = time.monotonic() + DRAIN_S
            self.connection.settimeout(DRAIN_S)
            drained = 0
            with contextlib.suppress(OSError):
                while drained < DRAIN_BYTES and time.monotonic() < deadline:
                    chunk = self.rfile.read1(64 * 1024)
                    if not chunk:
                        break
                    drained += len(chunk)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: requests are not logged (they come every training step)."""

    return Handler


def _raise(error: RequestError) -> Cluster:
    raise error


def _body_length(headers: Any) -> int:
    """The request's Content-Length: ASCII digits only, at most MAX_BODY_BYTES (413 beyond, before any reading)."""
    if "Transfer-Encoding" in headers:
        raise RequestError(HTTPStatus.LENGTH_REQUIRED, "bodies need a Content-Length (no Transfer-Encoding)")
    length = headers.get("Content-Length", "0")
    if not _is_ascii_number(length):
        raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {length!r}")
    if int(length) > MAX_BODY_BYTES:
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
    return int(length)


def _is_ascii_number(text: str) -> bool:
    """Plain 0-9 digits, not too many: `str.isdigit()` also accepts '²', which int() then refuses."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


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
        return config.resize(_field(request, "size", int, minimum=0, maximum=config.max_size))
    if route == ("POST", "/remove"):
        return config.remove(_field(request, "worker", int, minimum=0, maximum=MAX_WORKER_ID))
    if route == ("PUT", "/config"):
        members = _field(request, "members", list)
        if not all(_is_worker_id(member) for member in members) or len(set(members)) < len(members):
            raise RequestError(
                HTTPStatus.BAD_REQUEST, f"`members` must be distinct worker ids (whole numbers 0..{MAX_WORKER_ID})"
            )
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
    except RecursionError:  # the decoder's own depth limit: deeper nesting than any request of ours needs
        raise RequestError(HTTPStatus.BAD_REQUEST, "body is nested too deeply") from None
    except ValueError as error:  # an integer literal beyond int()'s digit limit
        raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not acceptable JSON: {error}") from None
    if not isinstance(value, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
    return value


def _field(
    request: dict[str, Any], name: str, kind: type, minimum: int | None = None, maximum: int | None = None
) -> Any:
    """`request[name]` when it is a `kind` (an int within the bounds given); a 400 RequestError otherwise."""
    value = request.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) or not _within(value, minimum, maximum):
        expected = _whole_number(minimum, maximum) if kind is int else kind.__name__
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        raise RequestError(HTTPStatus.BAD_REQUEST, f"`{name}` must be {expected}, got {shown}")
    return value


def _within(value: Any, minimum: int | None, maximum: int | None) -> bool:
    """Whether an int lies within the bounds given (None: no bound on that side); True for any other value."""
    if not isinstance(value, int):
        return True
    return (minimum is None or value >= minimum) and (maximum is None or value <= maximum)


def _whole_number(minimum: int | None, maximum: int | None) -> str:
    lower = f" from {minimum}" if minimum is not None else ""
    upper = "" if maximum is None else f" {'to' if lower else 'at most'} {maximum}"
    return f"a whole number{lower}{upper}"


def _is_worker_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_WORKER_ID


def _whole(text: str, name: str) -> int:
    if not _is_ascii_number(text):
        shown = text if len(text) <= 40 else f"{text[:40]}..."
        raise RequestError(HTTPStatus.BAD_REQUEST, f"query parameter `{name}` must be a whole number, got {shown!r}")
    return int(text)
