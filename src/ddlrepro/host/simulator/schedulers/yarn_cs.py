"""YARN-CS exactly as the artifact simulates it (simulator/other_policy.py `FifoPolicy.optimize`): non-elastic
FIFO that serves only the head of the queue each round, the earliest active job in trace order, with a gang of
max_parallelism devices of its preferred type, one EST each; every other job waits, even when devices are free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.placements import gang
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job


def decide(
    now: float, cluster: Cluster, active: Sequence[Job], current: Mapping[str, Placement], profiles: Profiles
) -> dict[str, Placement]:
    if not active:
        return {}
    head = active[0]
    return {head.id: current.get(head.id) or gang(head, cluster)}
