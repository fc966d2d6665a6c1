"""Forward a TCP port of the root network namespace into a testbed host: `python -m ddlrepro.host.testbed.forward
LISTEN_PORT NAMESPACE ADDRESS PORT`.

Users' `sbatch`, `squeue` and `scontrol` (and Snakemake's Slurm executor) run in the root namespace, which has no
testbed address and must never get one. The forwarder listens on 127.0.0.1:LISTEN_PORT there, then moves itself into
NAMESPACE (`setns`): a socket stays in the namespace it was made in, so the listener stays in the root namespace
while every connection it opens onwards, to ADDRESS:PORT, is made inside the host.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
from collections.abc import Awaitable, Callable

from ddlrepro.host.testbed.network import NETNS_RUN

CLONE_NEWNET = 0x40000000
CHUNK = 65536
# Connections relayed at once: Slurm's commands and daemons open a few each; more are closed at once, so that a
# client opening connections without end cannot exhaust the forwarder's descriptors.
MAX_CONNECTIONS = 256


def enter_namespace(namespace: str) -> None:
    """Move this process's network view (sockets made from now on) into a named namespace."""
    handle = os.open(NETNS_RUN / namespace, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(handle, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(handle)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def relayer(address: str, port: int, limit: int = MAX_CONNECTIONS) -> Handler:
    """The handler of one accepted connection: relayed to address:port while fewer than `limit` are, else closed."""
    open_connections = 0

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_connections
        if open_connections >= limit:
            writer.close()
            return
        open_connections += 1
        try:
            try:
                onward_reader, onward_writer = await asyncio.open_connection(address, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, onward_writer), pipe(onward_reader, writer), return_exceptions=True)
        finally:
            open_connections -= 1

    return relay


async def serve(listen_port: int, namespace: str, address: str, port: int) -> None:
    server = await asyncio.start_server(relayer(address, port), "127.0.0.1", listen_port)
    enter_namespace(namespace)
    print("forwarding", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    if len(argv) != 4:
        sys.exit("usage: python -m ddlrepro.host.testbed.forward LISTEN_PORT NAMESPACE ADDRESS PORT")
    listen_port, namespace, address, port = argv
    asyncio.run(serve(int(listen_port), namespace, address, int(port)))


if __name__ == "__main__":
    main(sys.argv[1:])
