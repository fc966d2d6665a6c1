"""The in-place elastic worker: `python -m ddlrepro.rank.elastic.inplace_worker POINT_JSON`, started by
`host/launchers/inplace.py`.

After every step rank 0 reads the config server and broadcasts the version everyone acts on. Rank 0 asks the
config server to resize when the point's fixed schedule says so, or (`policy: provisioning`) to add a worker or
remove the last one when KungFu's provisioning policy decides, fed every step's all-reduced per-worker throughput
on every rank. On a new version, survivors keep their process, model and optimizer, leave the old process group
and form the new one; joiners (spawned cold, or warm standbys that built the model in advance) join it and receive
the state from a survivor. Leavers exit cleanly. If a collective fails (a worker died), survivors elect the
launcher's next version, re-form without it, and continue from their in-memory state, losing at most the step in
flight.
"""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # a rank starting: no collections while it loads its libraries (startup.py)
    startup.pause_collection()

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddlrepro.points import Point
from ddlrepro.rank.adaptation.provisioning import (
    ThroughputSource,
    measured_throughput,
    provisioning_policy,
    throughput_source,
)
from ddlrepro.rank.elastic import membership
from ddlrepro.rank.elastic.client import ConfigClient
from ddlrepro.rank.elastic.cluster import Cluster, publish_agreed, ready_key
from ddlrepro.rank.elastic.events import IN_PLACE_PHASES, ResizeEvent
from ddlrepro.rank.elastic.schedule import parse_schedule
from ddlrepro.rank.elastic.trainer import announce, build_trainer, emit_step
from ddlrepro.records import emit
from ddlrepro.shutdown import run_rank


class InPlaceWorker:
    """One elastic worker process: its trainer, its current cluster version and group, and rank 0's resize event."""

    def __init__(
        self,
        point: Point,
        worker: int,
        client: ConfigClient,
        store: dist.Store,
        throughput: ThroughputSource = measured_throughput,
    ) -> None:
        self.params = point.params
        self.worker = worker
        self.client = client
        self.store = store
        self.timeout_s = float(self.params["collective_timeout_s"])
        self.schedule = {entry.step: entry.size for entry in parse_schedule(self.params["schedule"])}
        self.trainer = build_trainer(self.params, point.threads_per_worker)
        self.cluster: Cluster | None = None
        self.group: membership.Group | None = None
        self.retired: list[membership.Group] = []
        self.event: ResizeEvent | None = None
        self.proposed: set[int] = set()
        self.warm = int(self.params["standby"]) > 0
        self.record_state = bool(self.params.get("record_state", False))
        self.policy = provisioning_policy(self.params)
        self.throughput = throughput

    @property
    def member(self) -> membership.Group:
        """The group this worker trains in (only while it is a member)."""
        if self.group is None:
            raise RuntimeError(f"worker {self.worker} is in no group")
        return self.group

    @property
    def current(self) -> Cluster:
        """The cluster version this worker is a member of (only while it is one)."""
        if self.cluster is None:
            raise RuntimeError(f"worker {self.worker} is in no cluster")
        return self.cluster

    @property
    def rank(self) -> int:
        return self.member.rank

    @property
    def size(self) -> int:
        return self.member.size

    def run(self) -> None:
        """Wait to be assigned, train until told to leave; a warm standby then waits for its next assignment."""
        while True:
            assigned = membership.await_assignment(self.client, self.store, self.worker)
            if assigned is None:
                return
            self.reform(assigned, joiner_ready=time.time())
            self.train_while_member()
            if not self.warm:
                return

    def train_while_member(self) -> None:
        while self.cluster is not None:
            try:
                step_time = self.trainer.train_step(self.member)
                self.after_step(step_time)
                latest = self.agree(self.propose(self.policy_target(step_time)))
                if latest.version != self.current.version:
                    self.change_to(latest)
            except RuntimeError as error:  # a collective or a group formation failed: a worker is gone
                self.recover(error)

    def propose(self, policy_target: int | None) -> ResizeEvent | None:
        """Rank 0 proposes the scheduled size to the config server once `step` steps are trained (the schedule's
        stop comes first), else the size the policy asks for: one more worker (`/resize`), or, as KungFu's
        provisioning does, the removal of the last worker (`/remove`), the one whose addition did not pay."""
        step = self.trainer.step
        scheduled = self.schedule.get(step) if step not in self.proposed else None
        size = scheduled if scheduled is not None else policy_target
        if self.rank != 0 or size is None:
            return None
        self.proposed.add(step)
        event = ResizeEvent(self.trainer.step, self.size, IN_PLACE_PHASES)
        event.mark("seen")
        if scheduled is None and size < self.size:
            self.client.remove(self.current.members[-1])
        else:
            self.client.resize(size)
        event.mark("config")
        return event

    def policy_target(self, step_time: float) -> int | None:
        """Feed the policy this step's per-worker throughput, all-reduced so that every rank decides alike."""
        if self.policy is None:
            return None
        own = self.throughput(self.size, self.trainer.batch_size, step_time)
        measured = torch.tensor([own], dtype=torch.float64)
        self.member.all_reduce(measured)
        per_worker = float(measured) / self.size
        window = self.policy.observe(self.size, per_worker)
        if self.rank == 0:
            emit("metric", rank=0, step=self.trainer.step - 1, metric="per_worker_throughput", value=per_worker)
            if window is not None:
                emit("metric", rank=0, step=self.trainer.step - 1, metric="window_total", value=window.total)
                target = float(window.size if window.target is None else window.target)
                emit("metric", rank=0, step=self.trainer.step - 1, metric="policy_target", value=target)
        return None if window is None else window.target

    def after_step(self, step_time: float) -> None:
        self.retire_groups()
        event, self.event = self.event, None
        if self.rank != 0:
            return
        emit_step(self.trainer.step - 1, self.size, self.trainer.batch_size, step_time)
        if event is not None:
            event.mark("first_step")
            event.emit(self.size)

    def agree(self, proposed: ResizeEvent | None) -> Cluster:
        """Rank 0 reads the latest version and broadcasts it; everyone acts on that one."""
        latest = self.client.latest() if self.rank == 0 else self.current
        version = torch.tensor([latest.version], dtype=torch.int64)
        self.member.broadcast(version, 0)
        if int(version) == self.current.version:
            return self.current
        if self.rank == 0:
            self.event = proposed or ResizeEvent(
                self.trainer.step, self.size, IN_PLACE_PHASES, marks={"seen": time.time()}
            )
            self.event.marks.setdefault("config", time.time())
            self.event.mark("agreed")
            publish_agreed(self.store, latest.version)
        return latest if latest.version == int(version) else self.client.version(int(version))

    def change_to(self, cluster: Cluster) -> None:
        if self.worker not in cluster.members:
            self.leave(cluster)
            return
        self.reform(cluster, joiner_ready=0.0)

    def reform(self, cluster: Cluster, joiner_ready: float) -> None:
        """Form `cluster`'s group and make every member's state the most advanced survivor's."""
        survivor = self.cluster is not None
        self.leave_group()
        self.cluster = cluster
        rank = cluster.rank_of(self.worker)
        if rank is None:
            raise RuntimeError(f"worker {self.worker} is not a member of cluster version {cluster.version}")
        self.group = membership.Group(self.store, cluster, rank, self.timeout_s)
        if self.event is not None:
            self.event.mark("group")
        own_offset = self.trainer.offset if survivor else -1
        progress = torch.tensor([own_offset, joiner_ready], dtype=torch.float64)
        self.member.all_reduce(progress, dist.ReduceOp.MAX)
        best_offset, joiners_ready = float(progress[0]), float(progress[1])
        candidate = torch.tensor([self.rank if own_offset == best_offset else self.size], dtype=torch.int64)
        self.member.all_reduce(candidate, dist.ReduceOp.MIN)
        self.trainer.broadcast_state(self.member, int(candidate))
        if self.policy is not None:
            self.broadcast_policy(int(candidate))
        if self.rank == 0:
            self.record_resume()
        if self.event is not None:
            if joiners_ready > 0:
                self.event.mark("joiners_ready", joiners_ready)
            self.event.mark("synced")
        if self.record_state:  # after the "synced" mark: hashing the state is not part of the resize's latency
            self.trainer.record_state(self.member, "synced")

    def broadcast_policy(self, source: int) -> None:
        """Give every member `source`'s policy state (joiners have none), and start a new window at the new size."""
        if self.policy is None:
            return
        state = torch.tensor(self.policy.state(), dtype=torch.float64)
        self.member.broadcast(state, source)
        self.policy.load(state.tolist())

    def record_resume(self) -> None:
        """Rank 0's ledger note: training resumes at the agreed offset; slices at or beyond it were in a lost step."""
        emit("ledger", rank=0, step=None, resume=self.trainer.offset, version=self.current.version)

    def leave(self, cluster: Cluster) -> None:
        """Leave the cluster (a leaver, or everyone at the stop); rank 0 reports the result at the stop."""
        rank = self.rank if self.group is not None else None
        if self.record_state and rank is not None and not cluster.members:
            self.trainer.record_state(self.member, "final")
            if rank == 0:
                self.trainer.save_final_state(Path(os.environ["DDLREPRO_RUN_DIR"]))
        if rank == 0 and not cluster.members:
            emit("result", rank=0, steps=self.trainer.step, samples=self.trainer.offset, last_version=cluster.version)
        self.leave_group()
        self.retire_groups()
        emit("metric", rank=rank, step=self.trainer.step, metric="left", value=float(cluster.version))
        self.cluster = None

    def retire_groups(self) -> None:
        if self.retired:
            membership.retire(self.retired)
            self.retired = []

    def leave_group(self) -> None:
        """Stop using the current group; it is torn down in the background after the next step."""
        if self.group is not None:
            self.retired.append(self.group)
            self.group = None

    def recover(self, error: RuntimeError) -> None:
        """A collective failed: elect the next version (without the dead) and re-form from in-memory state."""
        seen = time.time()
        failed = self.current
        emit("metric", rank=self.rank, step=self.trainer.step, metric="fault_detected", value=seen)
        print(f"worker {self.worker}: collective failed in version {failed.version}: {error}", file=sys.stderr)
        self.member.close()
        self.group = None
        while True:
            cluster = membership.elect_after_fault(self.client, self.store, failed, self.timeout_s * 2)
            self.event = ResizeEvent(self.trainer.step, len(failed.members), IN_PLACE_PHASES, fault=True)
            self.event.mark("seen", seen)
            self.event.mark("config")
            self.event.mark("agreed")
            if self.worker not in cluster.members:
                self.leave(cluster)
                return
            try:
                self.reform(cluster, joiner_ready=0.0)
                return
            except RuntimeError as again:
                print(f"worker {self.worker}: re-forming version {cluster.version} failed: {again}", file=sys.stderr)
                self.leave_group()
                failed = cluster


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m ddlrepro.rank.elastic.inplace_worker POINT_JSON")
    point = Point.from_json(argv[0])
    server, store_address, token, worker = membership.worker_environment()
    store = membership.connect_store(store_address, float(point.params["collective_timeout_s"]))
    elastic_worker = InPlaceWorker(point, worker, ConfigClient(server, token), store, throughput_source(point.params))
    announce(worker)  # once the model is built, as the other runtimes' workers announce themselves
    store.set(ready_key(worker), str(time.time()))
    elastic_worker.run()


if __name__ == "__main__":
    run_rank(main)
