"""Scheduling policies: each a pure function of (time, cluster, active jobs in queue order, their current
placements, profiles) → the placements of the next round (a job left out holds no devices), and the device types
it lets a job use (checked before simulating: a job that could never start is an error naming its row)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.elastic import AllowedTypes
from ddlrepro.host.simulator.placements import preferred_only
from ddlrepro.host.simulator.schedulers import easyscale_heter, easyscale_homo, fifo_gang, yarn_cs
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job

Decide = Callable[[float, Cluster, Sequence[Job], Mapping[str, Placement], Profiles], dict[str, Placement]]


@dataclass(frozen=True)
class Policy:
    name: str
    decide: Decide
    allowed_types: AllowedTypes
    gang: bool  # every job needs max_parallelism devices of its preferred type at once
    label: str


POLICIES = {
    policy.name: policy
    for policy in (
        Policy("yarn-cs", yarn_cs.decide, preferred_only, gang=True, label="YARN-CS"),
        Policy("fifo-gang", fifo_gang.decide, preferred_only, gang=True, label="FIFO gang"),
        Policy("easyscale-homo", easyscale_homo.decide, preferred_only, gang=False, label="EasyScale homo"),
        Policy(
            "easyscale-heter",
            easyscale_heter.decide,
            easyscale_heter.allowed_types,
            gang=False,
            label="EasyScale heter",
        ),
    )
}
