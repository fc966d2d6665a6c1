"""What each rank's task is given to find its peers: TensorFlow's TF_CONFIG, and Horovod's gloo rendezvous, as
`horovodrun --gloo` sets it up, without its own process tree; and on a testbed host, each network's interface.

horovodrun starts an HTTP rendezvous server, then every rank with HOROVOD_RANK / SIZE / LOCAL_* / CROSS_* and the
server's address in its environment. The local and Slurm launchers do the same themselves, so Horovod ranks are
started, watched, stopped and their output filed exactly like torch ranks (failures named by rank). Slots (which
rank runs where) come from Horovod's own `get_host_assignments`, so ranks and server agree on them.
Horovod is imported only when a Horovod point runs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from horovod.runner.common.util.hosts import SlotInfo

LOCALHOST = "localhost"
# On a testbed host, each network's interface (JSON, {"bridge": "eth0", "overlay": "vxlan0"}): a paired run trains a
# model over each (runtime.network_group; GLOO_SOCKET_IFNAME names the default group's).
NETWORK_INTERFACES_ENV = "DDLREPRO_NETWORK_INTERFACES"
# Where rank 0's servers (rendezvous store, Horovod's rendezvous) listen when MASTER_ADDR is a name that may resolve
# differently on its own node: a Slurm step's first node (slurm_task.rendezvous_address).
LISTEN_ADDRESS_ENV = "DDLREPRO_LISTEN_ADDRESS"
# Rank 0's inherited descriptor of a socket already listening on MASTER_ADDR:MASTER_PORT, bound by the local launcher
# before any rank started (no other process can take the port while the ranks import torch).
MASTER_LISTEN_FD_ENV = "DDLREPRO_MASTER_LISTEN_FD"
LISTEN_BACKLOG = 1024  # every worker (and, in-place, every standby) connects at once: the default 5 makes them wait


def slots(hosts: list[tuple[str, int]]) -> list[SlotInfo]:
    """Every rank's slot, for `hosts` given as (host name, ranks on it) in rank order."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    size = sum(count for _, count in hosts)
    return get_host_assignments(parse_hosts(",".join(f"{host}:{count}" for host, count in hosts)), size)


def rank_env(slot: SlotInfo, rendezvous_addr: str, port: int, iface: str | None) -> dict[str, str]:
    """The environment horovodrun would give the rank of `slot` (`iface`: gloo's network interface, None = the
    address the host's name resolves to)."""
    env = {
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


def local_rank_env(rank: int, size: int, port: int) -> dict[str, str]:
    """The environment `horovodrun --gloo -H localhost:<size>` would give `rank`."""
    return rank_env(slots([(LOCALHOST, size)])[rank], "127.0.0.1", port, "lo")


@contextlib.contextmanager
def rendezvous_server(hosts: list[tuple[str, int]], port: int, bind_addr: str = "127.0.0.1") -> Iterator[None]:
    """Horovod's HTTP rendezvous server for the ranks of `hosts`, listening on `bind_addr:port` while in use."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer((bind_addr, port), RendezvousHandler, 0)
    try:
        server.init(slots(hosts))
        thread = threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True)
        thread.start()
        try:
            yield
        finally:
            server.shutdown()
            thread.join()
    finally:
        server.server_close()


def address_towards(host: str) -> str:
    """This machine's address on the network it reaches `host` over (a UDP socket's source: no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def tf_config(workers: list[str], rank: int) -> str:
    """TensorFlow's cluster description for `rank` (MultiWorkerMirroredStrategy reads it from TF_CONFIG)."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
