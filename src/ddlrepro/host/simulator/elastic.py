"""The elastic round both EasyScale policies share, after the artifact's `EasyPolicy.optimize_v3` and
`Job.submit_proposals` (simulator/easy_policy.py, simulator.py), in two steps of an `ElasticRound`: a running job
keeps its devices unless it grows or moves; waiting jobs, in queue order, start on the fewest devices that hold their
ESTs (`start_waiting`); then running jobs grow (`grow_running`), greedy by marginal speed-up (predicted throughput
÷ current − 1, per added device), at most one growth per job per round, each adding devices of one type, with at
most MAX_GROWTH × the job's devices after it, waste ≤ MAX_WASTE and a strictly higher predicted throughput.

Ours: the candidates are every count of every allowed type (the artifact keeps only the best per job and type, so
a job whose best growth does not fit gets none), ranked by predicted throughput, a growth taken only when strictly
faster (the artifact ranks its proposals by its Intrajob speed-up, capacity × (1 − waste), and takes an equal one
too); equal marginal speed-ups go to the job earlier in the queue, then to the growth with fewer devices, then to
the one keeping more of the job's current devices, then to more devices of the types earlier in the cluster's
order (the artifact's cluster lists its fastest type first). A job on several types, or on none of the type it
grows on, may instead move onto that one type alone, giving the others back; such a move may shrink the job (it is
taken only when faster) and is bounded like a growth, to min(the type's size, MAX_GROWTH × the job's devices). The
artifact only adds: a job that once took a slow device keeps it as its bottleneck for good, and a long job stuck so
made heter's makespan 2.3× homo's on a generated trace. Waste is `placements.waste`; a heterogeneous job that cannot
start on its preferred type starts on another allowed type (the artifact starts it on its slowest proposal)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ddlrepro.host.simulator.cluster import Cluster, Placement
from ddlrepro.host.simulator.placements import best_ests, smallest, throughput, waste
from ddlrepro.host.simulator.rules import MAX_GROWTH, MAX_WASTE
from ddlrepro.host.simulator.step_profiles import Profiles
from ddlrepro.host.simulator.traces import Job

AllowedTypes = Callable[[Job, Cluster], Sequence[str]]


def decide(
    cluster: Cluster,
    active: Sequence[Job],
    current: Mapping[str, Placement],
    profiles: Profiles,
    allowed_types: AllowedTypes,
) -> dict[str, Placement]:
    elastic_round = ElasticRound(cluster, active, current, profiles, allowed_types)
    return elastic_round.grow_running(elastic_round.start_waiting())


@dataclass(frozen=True)
class ElasticRound:
    """One round's decision: active jobs in queue order, the running ones' current placements."""

    cluster: Cluster
    active: Sequence[Job]
    current: Mapping[str, Placement]
    profiles: Profiles
    allowed_types: AllowedTypes

    def start_waiting(self) -> dict[str, Placement]:
        """Running jobs where they are; each waiting job, in queue order, on the fewest devices of the first
        allowed type that has them free."""
        placed = {job.id: self.current[job.id] for job in self.active if job.id in self.current}
        free = self.cluster.free(placed.values())
        for job in self.active:
            if job.id in placed:
                continue
            for device_type in self.allowed_types(job, self.cluster):
                start = smallest(job, device_type, self.cluster, self.profiles)
                if start is not None and start.devices <= free[device_type]:
                    placed[job.id] = start
                    free[device_type] -= start.devices
                    break
        return placed

    def grow_running(self, placed: Mapping[str, Placement]) -> dict[str, Placement]:
        """`placed` with the running jobs' growths that fit in what is left free, best first (the module's
        ranking)."""
        cluster, current = self.cluster, self.current
        grown = dict(placed)
        free = cluster.free(grown.values())
        running = [job for job in self.active if job.id in current]
        candidates = sorted(
            (
                (_rank(cluster, current[job.id], queue_index, gain, growth), job.id, growth)
                for queue_index, job in enumerate(running)
                for gain, growth in growths(
                    job, current[job.id], self.allowed_types(job, cluster), cluster, self.profiles
                )
            ),
            key=lambda candidate: candidate[0],
        )
        for _, job_id, growth in candidates:
            if grown[job_id] is not current[job_id]:
                continue
            added = {t: growth.count(t) - current[job_id].count(t) for t in cluster.types}
            if all(added[t] <= free[t] for t in cluster.types):
                grown[job_id] = growth
                free = {t: free[t] - added[t] for t in cluster.types}
        return grown


def _rank(cluster: Cluster, now_on: Placement, queue_index: int, gain: float, growth: Placement) -> tuple[Any, ...]:
    """Higher marginal speed-up first; then earlier in the queue, fewer devices, more of the current devices kept,
    more devices of the cluster's earlier types (a total order: a job's growths differ in their counts)."""
    kept = sum(min(growth.count(t), now_on.count(t)) for t in cluster.types)
    return (-gain, queue_index, growth.devices, -kept, tuple(-growth.count(t) for t in cluster.types))


def growths(
    job: Job, now_on: Placement, types: Sequence[str], cluster: Cluster, profiles: Profiles
) -> list[tuple[float, Placement]]:
    """(marginal speed-up, placement) of every allowed growth by devices of one type. Memoised on the profiles,
    keyed on the cluster too (its sizes bound the growths)."""
    key = ("growths", cluster, job.application, job.batch, job.max_parallelism, now_on, tuple(types))
    return cast(
        "list[tuple[float, Placement]]", profiles.memoised(key, lambda: _growths(job, now_on, types, cluster, profiles))
    )


def _growths(
    job: Job, now_on: Placement, types: Sequence[str], cluster: Cluster, profiles: Profiles
) -> list[tuple[float, Placement]]:
    speed = throughput(job, now_on, profiles)
    counts = now_on.counts()
    most_devices = MAX_GROWTH * now_on.devices  # the job's devices after this round, at most
    found = []
    for device_type in types:
        have = counts.get(device_type, 0)
        most_added = min(cluster.size(device_type) - have, most_devices - now_on.devices)
        options = [counts | {device_type: have + added} for added in range(1, most_added + 1)]
        if len(counts) > 1 or have == 0:  # or move onto this type alone, giving the others back
            options += [{device_type: n} for n in range(1, min(cluster.size(device_type), most_devices) + 1)]
        for option in options:
            grown = best_ests(job, option, cluster, profiles)
            if grown is None or waste(job, grown, profiles) > MAX_WASTE:
                continue
            faster = throughput(job, grown, profiles) / speed
            if faster > 1:
                found.append(((faster - 1) / max(1, grown.devices - now_on.devices), grown))
    return found
