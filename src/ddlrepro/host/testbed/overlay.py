"""The overlay: a VXLAN device on every host over its link to the bridge, the way Calico's VXLAN mode joins pods.

Each host's `vxlan0` (VNI 4096, UDP 4789, MTU 1450: 50 bytes of every 1500 go to the outer Ethernet, IP, UDP and
VXLAN headers) carries the host's address in the overlay's own subnet. Like Calico, no overlay ARP and no flooding:
every host gets a fixed MAC, and every other host a permanent neighbour entry (overlay address → that MAC) and a
forwarding entry (that MAC → the peer's underlay address), so the VXLAN devices neither learn nor broadcast. The
devices live in the hosts' namespaces and go with them; the underlay link's rate (`link_rate`) limits the overlay
too, its packets being the underlay's.
"""

from __future__ import annotations

import ipaddress

from ddlrepro.host.testbed.limits import TestbedError, check_subnet

DEVICE = "vxlan0"
VNI = 4096
PORT = 4789  # IANA's VXLAN port, as Calico uses
MTU = 1450  # 1500 − 50 bytes of VXLAN encapsulation (Calico's default for VXLAN)
HEADER_BYTES = 50  # outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8, on every packet the overlay sends
SUBNET = "198.18.1.0/24"  # the overlay's addresses wherever the testbed's ranks use one, apart from the underlay's
# Ethernet 14 + IPv4 20 + TCP 32: 20 + 12 of timestamp option, so this assumes net.ipv4.tcp_timestamps = 1, Linux's
# default, which every new namespace (each testbed host's) starts with; without timestamps a header is 54 bytes.
TCP_HEADER_BYTES = 66


def check_overlay_subnet(subnet: str, underlay: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """The overlay's subnet: in the benchmarking range and apart from the underlay's."""
    network = check_subnet(subnet)
    if network.overlaps(underlay):
        raise TestbedError(f"overlay subnet {network} overlaps the underlay's {underlay}: give it its own")
    return network


def mac_address(index: int) -> str:
    """Host `index`'s (1-based) overlay MAC: locally administered, unique in the testbed."""
    return f"02:dd:00:00:{index >> 8:02x}:{index & 0xFF:02x}"


def device_commands(
    index: int, underlay_interface: str, underlay_address: str, overlay_address: str, prefix_length: int
) -> list[str]:
    """`ip -batch` lines making host `index`'s VXLAN device over its link to the bridge, addressed and up."""
    return [
        f"link add {DEVICE} type vxlan id {VNI} dev {underlay_interface} local {underlay_address}"
        f" dstport {PORT} nolearning",
        f"link set {DEVICE} address {mac_address(index)} mtu {MTU} addrgenmode none",
        f"addr add {overlay_address}/{prefix_length} dev {DEVICE}",
        f"link set {DEVICE} up",
    ]


def neighbour_commands(peers: list[tuple[int, str, str]]) -> tuple[list[str], list[str]]:
    """The `ip` and `bridge` batch lines that tell a host where each peer (index, underlay, overlay address) is."""
    neighbours = [
        f"neigh replace {overlay} lladdr {mac_address(i)} dev {DEVICE} nud permanent" for i, _, overlay in peers
    ]
    forwarding = [f"fdb append {mac_address(i)} dev {DEVICE} dst {underlay} self permanent" for i, underlay, _ in peers]
    return neighbours, forwarding


def payload_bytes(counted: int, packets: int, encapsulated: bool) -> int:
    """The TCP payload in what an interface counted: its bytes less each counted packet's headers (a GSO
    super-packet is counted once, with its headers once); `encapsulated`: an underlay link carrying the overlay's
    packets, whose VXLAN headers come off too."""
    return counted - packets * (TCP_HEADER_BYTES + (HEADER_BYTES if encapsulated else 0))
