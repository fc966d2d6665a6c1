"""The bytes this node's network interfaces moved during a run, recorded by each node's local rank 0.

Read from /sys/class/net/<interface>/statistics: the interfaces of the rank's own network namespace, so on a
testbed host its eth0, on a real cluster node its NICs. Loopback is left out (ranks on one node talk over it, and
it never crosses the network). At the start and at the end of the run one `node_rx_bytes` and one `node_tx_bytes`
metric per interface (and `node_rx_packets`, `node_tx_packets`), with `phase` (start / end), `interface` and
`hostname` fields: the difference of the two is what the run (and whatever else ran on the node meanwhile) moved.
The bytes include each packet's headers once per packet the kernel counted (a GSO super-packet counts once), so
bytes − packets × headers is the payload (host/testbed/overlay.py's `payload_bytes`).
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import TracebackType

from ddlrepro.records import emit

NET = Path("/sys/class/net")
FIELDS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")  # packets: what headers the bytes include (below)


def interface_bytes(net: Path = NET) -> dict[str, dict[str, int]]:
    """{interface: {rx_bytes, tx_bytes, rx_packets, tx_packets}} of every non-loopback interface seen in `net`."""
    counts = {}
    for interface in sorted(net.iterdir()) if net.is_dir() else []:
        statistics = interface / "statistics"
        if interface.name == "lo" or not statistics.is_dir():
            continue
        counts[interface.name] = {field: int((statistics / field).read_text()) for field in FIELDS}
    return counts


class NodeInterfaceCounter:
    """Records the node's interface bytes on entry and exit, on the node's local rank 0 only (one per node)."""

    def __init__(self, rank: int, local_rank: int, net: Path = NET) -> None:
        self.rank = rank
        self.recording = local_rank == 0
        self.net = net

    def record(self, phase: str) -> None:
        hostname = socket.gethostname()
        for interface, counts in interface_bytes(self.net).items():
            for field, value in counts.items():
                emit(
                    "metric",
                    rank=self.rank,
                    metric=f"node_{field}",
                    value=value,
                    iteration=None,
                    phase=phase,
                    interface=interface,
                    hostname=hostname,
                )

    def __enter__(self) -> NodeInterfaceCounter:
        if self.recording:
            self.record("start")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.recording:
            self.record("end")
