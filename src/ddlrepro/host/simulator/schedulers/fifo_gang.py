"""FIFO gang scheduling, the fair non-elastic baseline (ours): running jobs keep their gangs; each waiting job, in
queue order, starts when max_parallelism devices of its preferred type are free (a later job that fits may start
before an earlier one that does not)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.placements import gang
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job


def decide(
    now: float, cluster: Cluster, active: Sequence[Job], current: Mapping[str, Placement], profiles: Profiles
) -> dict[str, Placement]:
    chosen = {job.id: current[job.id] for job in active if job.id in current}
    free = cluster.free(chosen.values())
    for job in active:
        if job.id not in chosen and free[job.preferred_type] >= job.max_parallelism:
            chosen[job.id] = gang(job, cluster)
            free[job.preferred_type] -= job.max_parallelism
    return chosen
