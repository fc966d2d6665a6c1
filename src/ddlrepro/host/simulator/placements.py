"""What a set of devices gives a job: the ESTs per device that make its global step shortest, the step's
throughput, and the waste of the devices' capacity. Ours; the artifact enumerates "proposals" instead
(simulator/easy_policy.py `Intrajob`).

With n_t devices of type t each running k_t ESTs, a global step takes T = max_t step_t(k_t) × k_t, and the job
needs Σ n_t k_t ≥ its ESTs. The shortest T is found among the values step_t(k) × k. Waste = 1 − (ESTs ÷ T) ÷
Σ n_t ÷ step_t(k_t): the share of the devices' EST-steps per second the job leaves unused (0 for ESTs spread
evenly over one type; the artifact's measure differs, and it counts one-type placements as waste 0 always).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from ddlrepro.host.simulator.cluster import Cluster, Placement, Share, placement
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job


def gang(job: Job, cluster: Cluster) -> Placement:
    """max_parallelism devices of the preferred type, one EST each (non-elastic)."""
    return placement(cluster, [Share(job.preferred_type, job.max_parallelism, 1)])


def preferred_only(job: Job, cluster: Cluster) -> list[str]:
    """The device types a job may use under every policy but easyscale-heter: its preferred one."""
    return [job.preferred_type]


def best_ests(job: Job, counts: Mapping[str, int], cluster: Cluster, profiles: Profiles) -> Placement | None:
    """The placement of `counts` devices with the shortest global step (None: no profiled way to hold the ESTs).
    Memoised on the profiles, as policies ask again for the same devices every round; keyed on the cluster too (its
    type order orders the shares)."""
    key = ("best_ests", cluster, job.application, job.batch, job.max_parallelism, tuple(sorted(counts.items())))
    return cast("Placement | None", profiles.memoised(key, lambda: _best_ests(job, counts, cluster, profiles)))


def _best_ests(job: Job, counts: Mapping[str, int], cluster: Cluster, profiles: Profiles) -> Placement | None:
    options: dict[str, list[tuple[float, int]]] = {}  # type → [(device time per global step, ESTs per device)]
    for device_type, devices in counts.items():
        if devices < 1:
            continue
        span = profiles.ests_range(job.application, device_type, job.batch)
        if span is None:
            return None
        low, high = span[0], min(span[1], job.max_parallelism)
        options[device_type] = [
            (profiles.step_time(job.application, device_type, job.batch, k) * k, k) for k in range(low, high + 1)
        ]
    if not options:
        return None

    def ests_within(limit: float) -> dict[str, int] | None:
        """Each type's most ESTs per device whose step fits in `limit` (None: some type fits none)."""
        most = {t: max((k for seconds, k in choices if seconds <= limit), default=0) for t, choices in options.items()}
        return most if all(most.values()) else None

    def holds(most: dict[str, int] | None) -> bool:
        return most is not None and sum(counts[t] * k for t, k in most.items()) >= job.max_parallelism

    # A longer step never holds fewer ESTs: the shortest step that holds them all is found by bisection.
    limits = sorted({seconds for choices in options.values() for seconds, _ in choices})
    low, high = 0, len(limits)
    while low < high:
        middle = (low + high) // 2
        if holds(ests_within(limits[middle])):
            high = middle
        else:
            low = middle + 1
    if low == len(limits):
        return None
    most = ests_within(limits[low])
    assert most is not None
    return placement(cluster, [Share(t, counts[t], k) for t, k in most.items()])


def throughput(job: Job, where: Placement, profiles: Profiles) -> float:
    return profiles.throughput(job.application, job.batch, job.max_parallelism, where)


def waste(job: Job, where: Placement, profiles: Profiles) -> float:
    capacity = sum(
        share.devices / profiles.step_time(job.application, share.device_type, job.batch, share.ests_per_device)
        for share in where.shares
    )
    return (
        1.0
        - job.max_parallelism
        / profiles.global_step_s(job.application, job.batch, job.max_parallelism, where)
        / capacity
    )


def smallest(job: Job, device_type: str, cluster: Cluster, profiles: Profiles) -> Placement | None:
    """The fewest devices of one type that hold the job's ESTs (the artifact starts an elastic job on its slowest
    proposal: one device)."""
    span = profiles.ests_range(job.application, device_type, job.batch)
    if span is None:
        return None
    devices = -(-job.max_parallelism // min(span[1], job.max_parallelism))
    return best_ests(job, {device_type: devices}, cluster, profiles)
