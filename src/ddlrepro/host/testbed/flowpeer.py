"""One end of a competing TCP flow, run on a testbed host (standard library only, so it starts in milliseconds).

    python -m ddlrepro.host.testbed.flowpeer receive --connections C --until T
    python -m ddlrepro.host.testbed.flowpeer send --to ADDR --port P --connections C [--rate BITS]
                                                   --start-at T --stop-at T [--max-bytes B]

The receiver prints `ready <port>` once it listens (on a port the kernel picks, so flows never clash), then, when
every connection closed or at --until, one JSON line: bytes received, first and last byte times, its CPU seconds.
The sender waits for --start-at, paces each of its connections to rate / connections (unpaced without --rate),
stops at --stop-at or after --max-bytes, and prints its JSON line: bytes sent, start and end, its CPU seconds.
Times are epoch seconds (one machine, one clock).
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping

CHUNK_BYTES = 64 * 1024
POLL_SECONDS = 0.2  # how soon a SIGTERM (traffic stopped early) ends the loops, which then still report
stopping = threading.Event()


def remaining(deadline: float) -> float:
    return 0.0 if stopping.is_set() else max(0.0, deadline - time.time())


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def receive(connections: int, until: float) -> dict[str, float | None]:
    listener = socket.create_server(("0.0.0.0", 0), backlog=connections)
    listener.settimeout(POLL_SECONDS)
    print(f"ready {listener.getsockname()[1]}", flush=True)
    totals: dict[str, float | None] = {"bytes": 0, "first": None, "last": None}
    lock = threading.Lock()

    def drain(connection: socket.socket) -> None:
        connection.settimeout(POLL_SECONDS)
        with connection:
            while remaining(until) > 0:
                try:
                    data = connection.recv(1 << 20)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                now = time.time()
                with lock:
                    totals["bytes"] = (totals["bytes"] or 0) + len(data)
                    totals["first"] = totals["first"] or now
                    totals["last"] = now

    threads: list[threading.Thread] = []
    while len(threads) < connections and remaining(until) > 0:
        try:
            connection, _address = listener.accept()
        except TimeoutError:
            continue
        threads.append(threading.Thread(target=drain, args=(connection,), daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join()
    with lock:
        return {"received_bytes": totals["bytes"], "first_byte": totals["first"], "last_byte": totals["last"]}


def send(
    address: str, port: int, connections: int, rate: float | None, start: float, stop: float, max_bytes: int | None
) -> dict[str, float]:
    stopping.wait(max(0.0, start - time.time()))
    share = None if max_bytes is None else max_bytes // connections
    per_connection = None if rate is None else rate / 8 / connections  # bytes per second
    sent = [0] * connections
    chunk = b"\0" * CHUNK_BYTES
    begun = time.time()

    def pump(index: int) -> None:
        if remaining(stop) <= 0:
            return
        with socket.create_connection((address, port), timeout=POLL_SECONDS * 5) as connection:
            connection.settimeout(max(POLL_SECONDS, remaining(stop)))  # a slow link's send may take long
            opened = time.time()
            while remaining(stop) > 0 and (share is None or sent[index] < share):
                ahead = 0.0 if per_connection is None else sent[index] / per_connection - (time.time() - opened)
                if ahead > 0:
                    stopping.wait(min(ahead, remaining(stop)))
                    continue
                size = CHUNK_BYTES if share is None else min(CHUNK_BYTES, share - sent[index])
                try:
                    connection.sendall(chunk[:size])
                except OSError:
                    return
                sent[index] += size

    threads = [threading.Thread(target=pump, args=(index,), daemon=True) for index in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"sent_bytes": sum(sent), "send_start": begun, "send_end": time.time()}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="flowpeer")
    side = parser.add_subparsers(dest="side", required=True)
    receiver = side.add_parser("receive")
    receiver.add_argument("--connections", type=int, required=True)
    receiver.add_argument("--until", type=float, required=True)
    sender = side.add_parser("send")
    sender.add_argument("--to", required=True)
    sender.add_argument("--port", type=int, required=True)
    sender.add_argument("--connections", type=int, required=True)
    sender.add_argument("--rate", type=float)
    sender.add_argument("--start-at", type=float, required=True)
    sender.add_argument("--stop-at", type=float, required=True)
    sender.add_argument("--max-bytes", type=int)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda number, frame: stopping.set())
    outcome: Mapping[str, float | None]
    if args.side == "receive":
        outcome = receive(args.connections, args.until)
    else:
        outcome = send(args.to, args.port, args.connections, args.rate, args.start_at, args.stop_at, args.max_bytes)
    print(json.dumps({**outcome, "cpu_s": cpu_seconds()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
