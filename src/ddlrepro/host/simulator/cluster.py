"""A simulated cluster: device types and how many of each; placements of jobs on them, and the invariant that no
round allocates more devices than exist.

A placement gives each device type a job uses a number of devices and the ESTs (EasyScale threads) each of them
runs; as in the artifact, the device type is all that matters, not which node a device sits in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ddlrepro.host.errors import UserError

# The artifact's cluster (simulator/simulator.py, Cluster.gpu_nums): 32 V100, 16 P100, 16 T4, named as in its trace.
ARTIFACT_CLUSTER = {"v100": 32, "p100": 16, "t4": 16}
SHARE_LABEL = r"([^:+\s]+):(\d+)x(\d+)"  # one share of Placement.label(): type:devices x ESTs per device


class OverAllocation(AssertionError):
    """A policy allocated more devices of a type than the cluster has: a bug in the policy, never bad input."""


class OverFilled(ValueError):
    """More ESTs than a placement has room for."""


@dataclass(frozen=True, order=True)
class Share:
    """`devices` devices of one type, each running `ests_per_device` ESTs."""

    device_type: str
    devices: int
    ests_per_device: int


@dataclass(frozen=True)
class Placement:
    """Where a job runs: one share per device type it uses, in the cluster's type order."""

    shares: tuple[Share, ...]

    @property
    def devices(self) -> int:
        return sum(share.devices for share in self.shares)

    def count(self, device_type: str) -> int:
        return sum(share.devices for share in self.shares if share.device_type == device_type)

    def counts(self) -> dict[str, int]:
        return {share.device_type: share.devices for share in self.shares}

    def processes(self, ests: int) -> tuple[tuple[int, str], ...]:
        """(ESTs, type) of each device that runs any of `ests` ESTs: each up to its share's ESTs per device, filled
        in share order (a policy may allot more room than the ESTs need); OverFilled when they do not fit."""
        left, processes = ests, []
        for share in self.shares:
            for _ in range(share.devices):
                held = min(share.ests_per_device, left)
                if held:
                    processes.append((held, share.device_type))
                left -= held
        if left:
            raise OverFilled(f"{self.label()} holds {ests - left} of {ests} ESTs")
        return tuple(processes)

    def label(self) -> str:
        """E.g. `v100:2x8+t4:1x2` (type: devices × ESTs per device)."""
        return "+".join(f"{s.device_type}:{s.devices}x{s.ests_per_device}" for s in self.shares)

    @classmethod
    def from_label(cls, label: str) -> Placement:
        """The placement `label()` wrote; UserError naming the label when it is not one."""
        if not isinstance(label, str) or not re.fullmatch(rf"{SHARE_LABEL}(\+{SHARE_LABEL})*", label):
            raise UserError(f"{label!r} is not a placement label (type:devices x ESTs, joined by +: fast:1x2+slow:1x1)")
        return cls(tuple(Share(t, int(n), int(k)) for t, n, k in re.findall(SHARE_LABEL, label)))


@dataclass(frozen=True)
class Cluster:
    """Device types (in a fixed order, which every table follows) and their counts."""

    devices: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> Cluster:
        for device_type, count in counts.items():
            if not isinstance(count, int) or count < 0:
                raise ValueError(f"cluster: device type {device_type!r} has {count!r} devices, not a count ≥ 0")
        return cls(tuple(counts.items()))

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(device_type for device_type, _ in self.devices)

    @property
    def total(self) -> int:
        return sum(count for _, count in self.devices)

    def size(self, device_type: str) -> int:
        return dict(self.devices).get(device_type, 0)

    def used(self, placements: Iterable[Placement]) -> dict[str, int]:
        used = dict.fromkeys(self.types, 0)
        for placement in placements:
            for share in placement.shares:
                used[share.device_type] += share.devices
        return used

    def free(self, placements: Iterable[Placement]) -> dict[str, int]:
        used = self.used(placements)
        return {device_type: count - used[device_type] for device_type, count in self.devices}

    def check(self, allocations: Mapping[str, Placement], now: float) -> None:
        """Raise OverAllocation unless every type's allocated devices fit and every share is a real one."""
        for job, placement in allocations.items():
            for share in placement.shares:
                if share.device_type not in self.types or share.devices < 1 or share.ests_per_device < 1:
                    raise OverAllocation(f"t={now:g} s: job {job} has an impossible share {share}")
        for device_type, free in self.free(allocations.values()).items():
            if free < 0:
                raise OverAllocation(
                    f"t={now:g} s: {self.size(device_type) - free} {device_type} allocated, "
                    f"the cluster has {self.size(device_type)}"
                )

    def label(self) -> str:
        """E.g. `32 v100 + 16 p100 + 16 t4`."""
        return " + ".join(f"{count} {device_type}" for device_type, count in self.devices)


def placement(cluster: Cluster, shares: Iterable[Share]) -> Placement:
    """A placement with its shares in the cluster's type order and empty shares left out."""
    order = {device_type: index for index, device_type in enumerate(cluster.types)}
    kept = [share for share in shares if share.devices > 0]
    return Placement(tuple(sorted(kept, key=lambda share: order.get(share.device_type, len(order)))))
