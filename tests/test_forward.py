"""The Slurm forwarder relays at most its limit of connections at once; one more is closed at once and the others
go on (real sockets on 127.0.0.1; entering a testbed host is tests/test_multinode.py's)."""

from __future__ import annotations

import asyncio

from ddlrepro.host.testbed.forward import relayer


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(1024), 5)
    writer.close()
    return answer


async def scenario() -> tuple[list[bytes], bytes, bytes]:
    target = await asyncio.start_server(echo, "127.0.0.1", 0)
    forwarder = await asyncio.start_server(
        relayer("127.0.0.1", target.sockets[0].getsockname()[1], limit=3), "127.0.0.1", 0
    )
    port = forwarder.sockets[0].getsockname()[1]
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for _, writer in held:
        writer.write(b"ping")
    answers = [await asyncio.wait_for(reader.read(4), 5) for reader, _ in held]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    refused = await asyncio.wait_for(reader.read(1024), 5)  # closed at once: end of stream, nothing relayed
    writer.close()
    for _, writer in held:
        writer.close()
    await asyncio.sleep(0.2)
    after = await exchange(port, b"again")  # the held ones gone: relayed
    forwarder.close()
    target.close()
    return answers, refused, after


def test_connections_beyond_the_limit_are_closed_and_the_others_relayed() -> None:
    answers, refused, after = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert answers == [b"ping"] * 3 and refused == b"" and after == b"again"
