"""Horovod's gloo rendezvous for the local launcher: what `horovodrun --gloo` does, without its own process tree.

horovodrun starts an HTTP rendezvous server, then every rank with HOROVOD_RANK / SIZE / LOCAL_* / CROSS_* and the
server's address in its environment. The local launcher does the same itself, so Horovod ranks are started,
watched, stopped and their output filed exactly like torch ranks (one process each, failures named by rank).
Horovod is imported only when a Horovod point runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

HOSTNAME = "localhost"


def rank_env(rank: int, size: int, port: int) -> dict[str, str]:
    """The environment horovodrun would give `rank` of `size` ranks on this one host."""
    return {
        "HOROVOD_HOSTNAME": HOSTNAME,
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(rank),
        "HOROVOD_LOCAL_SIZE": str(size),
        "HOROVOD_CROSS_RANK": "0",
        "HOROVOD_CROSS_SIZE": "1",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_GLOO_IFACE": "lo",
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }


@contextlib.contextmanager
def rendezvous_server(port: int, size: int) -> Iterator[None]:
    """Horovod's HTTP rendezvous server for `size` ranks on this host, listening on `port` while in use."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer(("127.0.0.1", port), RendezvousHandler, 0)
    server.init(get_host_assignments(parse_hosts(f"{HOSTNAME}:{size}"), size))
    thread = threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
