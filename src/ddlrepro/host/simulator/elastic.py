"""The elastic round both EasyScale policies share, after the artifact's `EasyPolicy.optimize_v3` and
`Job.submit_proposals` (simulator/easy_policy.py, simulator.py): running jobs keep their devices (never shrunk);
waiting jobs, in queue order, start on the fewest devices that hold their ESTs; then running jobs grow, greedy by
marginal speed-up (speed ÷ current speed − 1, per added device), at most one growth per job per round, each adding
devices of one type, at most doubling the job's devices, with waste ≤ 30 % and a higher speed.

Ours: the candidates are every count of every allowed type (the artifact keeps only the best per job and type, so
a job whose best growth does not fit gets none); a job on several types may instead move onto the one type it
grows on, giving the others back (the artifact only adds: a job that once took a slow device keeps it as its
bottleneck for good, and a long job stuck so made heter's makespan 2.3× homo's on a generated trace); waste is
`placements.waste`; a heterogeneous job that cannot start on its preferred type starts on another allowed type
(the artifact starts it on its slowest proposal)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.placements import best_ests, smallest, throughput, waste
from ddlrepro.host.simulator.profiles import Profiles
from ddlrepro.host.simulator.rules import MAX_GROWTH, MAX_WASTE
from ddlrepro.host.simulator.traces import Job


def decide(
    cluster: Cluster,
    active: Sequence[Job],
    current: Mapping[str, Placement],
    profiles: Profiles,
    allowed_types: Callable[[Job], Sequence[str]],
) -> dict[str, Placement]:
    chosen = {job.id: current[job.id] for job in active if job.id in current}
    free = cluster.free(chosen.values())
    for job in active:
        if job.id in chosen:
            continue
        for device_type in allowed_types(job):
            start = smallest(job, device_type, cluster, profiles)
            if start is not None and start.devices <= free[device_type]:
                chosen[job.id] = start
                free[device_type] -= start.devices
                break
    growing = [job for job in active if job.id in current]
    candidates = sorted(
        (
            (-gain, index, growth.label(), job.id, growth)
            for index, job in enumerate(growing)
            for gain, growth in growths(job, current[job.id], allowed_types(job), cluster, profiles)
        ),
        key=lambda candidate: candidate[:3],
    )
    for _, _, _, job_id, growth in candidates:
        if chosen[job_id] is not current[job_id]:
            continue
        added = {t: growth.count(t) - current[job_id].count(t) for t in cluster.types}
        if all(added[t] <= free[t] for t in cluster.types):
            chosen[job_id] = growth
            free = {t: free[t] - added[t] for t in cluster.types}
    return chosen


def growths(
    job: Job, now_on: Placement, types: Sequence[str], cluster: Cluster, profiles: Profiles
) -> list[tuple[float, Placement]]:
    """(marginal speed-up, placement) of every allowed growth by devices of one type."""
    key = ("growths", job.application, job.batch, job.max_parallelism, now_on, tuple(types))
    return profiles.memoised(key, lambda: _growths(job, now_on, types, cluster, profiles))


def _growths(
    job: Job, now_on: Placement, types: Sequence[str], cluster: Cluster, profiles: Profiles
) -> list[tuple[float, Placement]]:
    speed = throughput(job, now_on, profiles)
    counts = now_on.counts()
    found = []
    for device_type in types:
        have = counts.get(device_type, 0)
        most = min(cluster.size(device_type), have + (MAX_GROWTH - 1) * now_on.devices)
        options = [counts | {device_type: n} for n in range(have + 1, most + 1)]
        if len(counts) > 1 or have == 0:  # or onto this type alone, giving the others back
            options += [{device_type: n} for n in range(1, most - have + now_on.devices + 1)]
        for option in options:
            grown = best_ests(job, option, cluster, profiles)
            if grown is None or waste(job, grown, profiles) > MAX_WASTE:
                continue
            faster = throughput(job, grown, profiles) / speed
            if faster > 1:
                found.append(((faster - 1) / max(1, grown.devices - now_on.devices), grown))
    return found
