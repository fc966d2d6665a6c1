"""Hostile input to the elastic config server and its store: each request over a real socket to a real server on
127.0.0.1 gets a 4xx and the server keeps answering; the store listens on loopback only."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from ddlrepro.host.configserver import MAX_BODY_BYTES, ClusterConfig, ConfigServer, RequestError, _field
from ddlrepro.host.launchers.inplace import host_store
from ddlrepro.host.launchers.local import free_loopback_port
from ddlrepro.rank.elastic.client import ConfigClient

TOKEN = "hostile-test-token"
MAX_SIZE = 4
AUTH = f"Authorization: Bearer {TOKEN}\r\n"


@pytest.fixture
def server() -> Iterator[ConfigServer]:
    spawned = iter(range(100, 10_000))
    config = ClusterConfig([0], lambda count, members: [next(spawned) for _ in range(count)], max_size=MAX_SIZE)
    with ConfigServer(config, TOKEN) as running:
        yield running


def exchange(server: ConfigServer, head: str, body: bytes = b"", read_first: bool = False) -> int:
    """Send a raw request (head: request line and headers) and return the status the server answers with."""
    host, port = server.address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(head.encode("latin-1") + b"\r\n")
        reader = connection.makefile("rb")
        if read_first:
            status_line = reader.readline()
        connection.sendall(body)
        if not read_first:
            status_line = reader.readline()
        return int(status_line.split()[1])


def post(path: str, body: bytes, headers: str = AUTH) -> tuple[str, bytes]:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}", body


def put(body: bytes) -> tuple[str, bytes]:
    return f"PUT /config HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{AUTH}", body


def still_serving(server: ConfigServer) -> None:
    assert exchange(server, "GET /health HTTP/1.1\r\nHost: x\r\n") == 200
    assert ConfigClient(server.address).latest().members == [0]


@pytest.mark.parametrize(
    ("head", "body"),
    [
        ("GET /config?version=%C2%B2 HTTP/1.1\r\nHost: x\r\n", b""),
        ("GET /config?after=1&timeout=%C2%B2 HTTP/1.1\r\nHost: x\r\n", b""),
        ("GET /config?after=%C2%B2 HTTP/1.1\r\nHost: x\r\n", b""),
        (f"GET /config?version={'9' * 5000} HTTP/1.1\r\nHost: x\r\n", b""),
        ("GET /config?version=%EF%BC%91 HTTP/1.1\r\nHost: x\r\n", b""),  # a full-width digit one
        ("POST /resize HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n", b""),
        ("POST /resize HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n" + AUTH, b""),
        ("POST /resize HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n" + AUTH, b""),
        ("POST /resize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" + AUTH, b"0\r\n\r\n"),
        post("/resize", b"[" * 60_000),
        post("/resize", b'{"size": ' + b"[" * 60_000 + b"}"),
        post("/resize", b'{"size": %d}' % 10**30),
        post("/resize", b'{"size": 100000}'),
        post("/resize", b'{"size": %d}' % (MAX_SIZE + 1)),
        post("/resize", b'{"size": ' + b"9" * 5000 + b"}"),
        post("/resize", b'{"size": 2.5}'),
        post("/remove", b'{"worker": %d}' % 10**30),
        post("/reset", b"{" * 60_000),
        put(b'{"members": [1e400, 2]}'),
        put(b'{"members": [0, 1, 2, 3, 4]}'),
        put(b'{"members": [0, 10000000000000000000]}'),
        put(b'{"members": [0, "1"]}'),
    ],
)
def test_hostile_requests_get_a_4xx_and_the_server_keeps_serving(server: ConfigServer, head: str, body: bytes) -> None:
    status = exchange(server, head, body)
    assert 400 <= status < 500
    still_serving(server)


def test_an_oversized_body_sent_whole_gets_413_not_a_broken_pipe(server: ConfigServer) -> None:
    body = b"x" * (10 * 1024 * 1024)
    assert exchange(server, *post("/resize", body)) == 413
    still_serving(server)


def test_an_announced_oversized_body_is_refused_before_it_is_sent(server: ConfigServer) -> None:
    head = f"POST /resize HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\nExpect: 100-continue\r\n"
    assert exchange(server, head + AUTH, read_first=True) == 413
    still_serving(server)


def test_sizes_up_to_the_declared_maximum_are_accepted(server: ConfigServer) -> None:
    client = ConfigClient(server.address, TOKEN)
    assert len(client.resize(MAX_SIZE).members) == MAX_SIZE
    assert exchange(server, *post("/resize", json.dumps({"size": MAX_SIZE + 1}).encode())) == 400
    assert len(client.latest().members) == MAX_SIZE


@pytest.mark.serial  # a deadline of seconds
def test_two_hundred_concurrent_long_polls_are_all_answered_promptly(server: ConfigServer) -> None:
    polls, answered = 200, []
    host, port = server.address.split(":")

    def poll() -> None:
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=20) as connection:
            connection.sendall(b"GET /config?after=0&timeout=15 HTTP/1.1\r\nHost: x\r\n\r\n")
            connection.makefile("rb").readline()
            answered.append(time.monotonic() - started)

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(polls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=25)
    assert len(answered) == polls
    assert max(answered) < 5.0, f"slowest long poll answered after {max(answered):.1f} s"


def test_the_store_listens_on_loopback_only() -> None:
    port = free_loopback_port()
    store = host_store(f"127.0.0.1:{port}", timeout_s=10)
    listening = [c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.laddr.port == port and not c.raddr]
    assert listening == ["127.0.0.1"]
    store.set("key", "value")
    assert store.get("key") == b"value"


def test_a_silent_connection_is_closed_after_the_idle_timeout(
    server: ConfigServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = server.http.RequestHandlerClass
    monkeypatch.setattr(handler, "timeout", 0.5)
    host, port = server.address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as silent:
        silent.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # half a request, then nothing
        started = time.monotonic()
        assert silent.recv(1024) == b""  # closed by the server, not held
        assert time.monotonic() - started < 5
    still_serving(server)


def test_connections_beyond_the_cap_are_closed_and_the_server_keeps_serving(server: ConfigServer) -> None:
    server.http.slots = threading.BoundedSemaphore(3)
    host, port = server.address.split(":")
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
    try:
        for connection in held:  # each holds a thread: a request begun, never finished
            connection.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.3)
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert extra.recv(1024) == b""  # refused: closed without an answer
    finally:
        for connection in held:
            connection.close()
    time.sleep(0.5)  # the held threads end once their clients left, and give back their slots
    still_serving(server)


def test_a_client_that_hangs_up_leaves_no_traceback(server: ConfigServer, capfd: pytest.CaptureFixture[str]) -> None:
    host, port = server.address.split(":")
    for _ in range(20):
        with socket.create_connection((host, int(port)), timeout=10) as rude:
            rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            rude.sendall(b"GET /config?after=0&timeout=1 HTTP/1.1\r\nHost: x\r\n\r\n")  # reset before the answer
    time.sleep(1.5)
    still_serving(server)
    assert "Traceback" not in capfd.readouterr().err


def test_int_fields_need_not_have_both_bounds() -> None:
    assert _field({"n": 7}, "n", int) == 7
    with pytest.raises(RequestError, match=r"^`n` must be a whole number from 0, got -1$") as refused:
        _field({"n": -1}, "n", int, minimum=0)
    assert refused.value.status == 400
    with pytest.raises(RequestError, match=r"^`n` must be a whole number at most 5, got 6$"):
        _field({"n": 6}, "n", int, maximum=5)
