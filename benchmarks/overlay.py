"""The testbed's VXLAN overlay (dlaas-scaling's `network: overlay`, the stand-in for Calico): how close the
interface counters the ranks read come to the bytes an application sent (target ≤ 5 % off), over the bridge and
over the overlay, and the all-reduce bus bandwidth over the overlay ÷ over the bridge at one link rate. As root
(network namespaces); otherwise it says why and records nothing.

Counters: one TCP transfer paced at the link rate, host 1 to host 2, against the sender's tx and the receiver's rx
as rank/interfaces.py reads them on each host: eth0 over the bridge; over the overlay both vxlan0 (the inner
packets) and eth0 (the same plus 50 bytes of VXLAN headers a packet). The error is the largest |counted − sent| ÷
sent of them all, of the bytes as counted (`counter-error-raw`: they include every counted packet's headers, up to
66 ÷ 1398 = 4.7 % on vxlan0 and 116 ÷ 1398 = 8.3 % on the overlay's eth0 when each packet is counted alone) and of
the payload in them (`counter-error`, the target: bytes − packets × headers, testbed/overlay.py's payload_bytes).
All-reduce: the workflow's kungfu-allreduce point (gloo RING, 16–64 MiB) on 2 testbed hosts, one rank each, through
the local launcher, `network: bridge` and then `overlay`; the ratio is the lowest over the sizes of overlay busbw ÷
bridge busbw (median time per operation over ranks and repetitions). With a 1450-byte MTU each 1514-byte frame
carries 1398 payload bytes instead of 1448: 0.966 is what encapsulation alone allows.

    python benchmarks/overlay.py [--rate 200mbit] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import SWEEP, BenchmarkRecord, busbw_by_size, per_size, testbed_unavailable

from ddlrepro.host.config import validate_config
from ddlrepro.host.figures import kungfu_allreduce
from ddlrepro.host.hostload import ForeignLoadMeter
from ddlrepro.host.testbed import Testbed, traffic
from ddlrepro.host.testbed import overlay as overlay_device
from ddlrepro.host.testbed.counters import node_counters
from ddlrepro.points import Point

OWNER = "ovbench"
RUN_TIMEOUT_S = 300


def counter_errors(rate: str, seconds: float, overlay: bool, record: Path) -> dict[str, tuple[float, float]]:
    """{interface: (raw, payload)}: the largest |counted − sent| ÷ sent of the sender's tx and the receiver's rx, of
    the bytes as counted and of the payload in them (headers taken off, overlay.payload_bytes) for one transfer."""
    with Testbed.create(OWNER, 2, link_rate=rate, overlay_subnet=overlay_device.SUBNET if overlay else None) as testbed:
        source, destination = (host.name for host in testbed.hosts)
        before = [node_counters(testbed, host) for host in (1, 2)]
        flow = traffic.Flow(source, destination, 1, rate, 0.2, 0.2 + seconds, overlay=overlay)
        traffic.start(testbed, [flow], record).wait(seconds + 30)
        after = [node_counters(testbed, host) for host in (1, 2)]
    outcome = json.loads(record.read_text().splitlines()[-1])
    if "receiver_error" in outcome or "sender_error" in outcome or not outcome.get("sent_bytes"):
        sys.exit(f"the transfer over {'overlay' if overlay else 'bridge'} failed: {outcome}")
    sent = outcome["sent_bytes"]
    errors = {}
    for interface in after[0]:
        encapsulated = overlay and interface == "eth0"
        moved = [
            {field: after[end][interface][field] - before[end][interface][field] for field in after[end][interface]}
            for end in (0, 1)
        ]
        counted = [moved[0]["tx_bytes"], moved[1]["rx_bytes"]]
        packets = [moved[0]["tx_packets"], moved[1]["rx_packets"]]
        payload = [overlay_device.payload_bytes(b, p, encapsulated) for b, p in zip(counted, packets, strict=True)]
        errors[interface] = (max(abs(b - sent) / sent for b in counted), max(abs(b - sent) / sent for b in payload))
    return errors


def allreduce_point(network: str, rate: str, launcher: dict) -> Point:
    section = {"workers": 2, "backends": ["gloo"], "strategies": ["RING"], **SWEEP}
    (point,) = kungfu_allreduce.points(section, launcher)
    params = {**point.params, "network": network, "testbed_hosts": 2, "link_rate": rate}
    return Point(**{**point.__dict__, "params": params})


def run_busbw(point: Point, run_dir: Path) -> dict[int, float]:
    """{size in bytes: busbw in bit/s} of one run of the point (through the local launcher, as the workflow runs it)."""
    command = [sys.executable, "-m", "ddlrepro", "run-point", "--point", point.to_json(), "--run-dir", str(run_dir)]
    settings = json.dumps({"launcher": {"timeout_s": RUN_TIMEOUT_S}})
    done = subprocess.run([*command, "--config-json", settings], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the all-reduce over {point.params['network']} failed:\n{done.stderr[-3000:]}")
    return busbw_by_size(run_dir, point.workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", default="200mbit", help="every host's link rate")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each counted transfer")
    args = parser.parse_args()
    if testbed_unavailable(Path(__file__).stem):
        return
    launcher = validate_config({}, partial=True)["launcher"]
    with tempfile.TemporaryDirectory() as scratch, BenchmarkRecord(__file__, args) as record:
        errors: dict[str, tuple[float, float]] = {}
        with ForeignLoadMeter() as meter:
            for network in ("bridge", "overlay"):
                found = counter_errors(
                    args.rate, args.seconds, network == "overlay", Path(scratch) / f"{network}.jsonl"
                )
                errors |= {f"{network} {interface}": error for interface, error in found.items()}
        for index, (figure_id, what) in enumerate(
            (
                ("counter-error-raw", "the bytes as counted (headers in)"),
                ("counter-error", "the payload in them (each counted packet's headers off)"),
            )
        ):
            details = ", ".join(f"{name} {error[index]:.4f}" for name, error in errors.items())
            what = f"interface counters vs the bytes sent, {what}: largest error of {len(errors)} at {args.rate}"
            record.add(figure_id, what, max(error[index] for error in errors.values()), "", meter.load, by=details)
            print(f"    per interface: {details}")
        busbw = {}
        with ForeignLoadMeter() as meter:
            for network in ("bridge", "overlay"):
                point = allreduce_point(network, args.rate, launcher)
                busbw[network] = run_busbw(point, Path(scratch) / network)
        ratios = {size: busbw["overlay"][size] / busbw["bridge"][size] for size in busbw["bridge"]}
        sizes = per_size(ratios)
        bridge = per_size({size: bps / 1e6 for size, bps in busbw["bridge"].items()}, digits=1)
        what = f"gloo RING all-reduce, 2 hosts at {args.rate}: overlay busbw ÷ bridge busbw, lowest over 16–64 MiB"
        record.add("overlay-vs-bridge-busbw", what, min(ratios.values()), "", meter.load, by_size=sizes)
        print(f"    per size: {sizes}; bridge busbw (Mbit/s): {bridge}")


if __name__ == "__main__":
    main()
