"""EasyScale homogeneous (the artifact's `EasyPolicy(force_homo=True)`): elastic, every job on its preferred
device type only (`elastic.decide`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlrepro.host.simulator import elastic
from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.placements import preferred_only
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job


def decide(
    now: float, cluster: Cluster, active: Sequence[Job], current: Mapping[str, Placement], profiles: Profiles
) -> dict[str, Placement]:
    return elastic.decide(cluster, active, current, profiles, preferred_only)
