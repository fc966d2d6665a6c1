"""EasyScale heterogeneous (the artifact's `EasyPolicy()`): elastic across device types for jobs whose
heterogeneous flag is set (their accuracy survives mixed types with D1 + D2); the others stay on their preferred
type, as in the artifact's `get_placement_proposals` (`elastic.decide`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlrepro.host.simulator import elastic
from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job


def allowed_types(job: Job, cluster: Cluster) -> list[str]:
    """A heterogeneous job's preferred type first, then the cluster's others in its order; another job's, its own."""
    if not job.heterogeneous:
        return [job.preferred_type]
    return [job.preferred_type, *(t for t in cluster.types if t != job.preferred_type)]


def decide(
    now: float, cluster: Cluster, active: Sequence[Job], current: Mapping[str, Placement], profiles: Profiles
) -> dict[str, Placement]:
    return elastic.decide(cluster, active, current, profiles, allowed_types)
