"""Membership events an elastic point can be put through (point parameters `situation`, `late_s`, `event_step`),
acted out by the host while the job runs, the same way under every runtime (ddp.py, torchrun.py, inplace.py):

    late-start  the job starts with one worker fewer; the last one is started `late_s` seconds after the first
                worker announced itself (its model built, ready to train: a loaded host takes seconds to get there)
    killed      worker 1 is killed with SIGKILL once rank 0 has reported `event_step` steps
    joins       one more worker is started once rank 0 has reported `event_step` steps

Once the event has played out (the kill; a late or joining worker's process announced itself, which under torchrun
is the restart that takes it in), rank 0 trains `steps_after_event` more steps and the host stops the job through
the runtime's config server: every cell trains as long as its story takes, on a slow machine as on a fast one, and
no run ends while a worker is on its way (the schedule's `steps` bounds a run the host never stops).

Each runtime says what starting a worker means for it (a rank of a static world, a torchrun agent, a resize of
the in-place cluster). The host files what it did and saw as metric records (rank None): `job_start`, the event's
time (`late_arrival`, `killed`, `joined`) and every worker process start (`worker_start`, by rank, value its pid),
from which the figure tells what the runtime did.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddlrepro.host.rundir import OutputCollector

SITUATIONS = ("late-start", "killed", "joins")
EVENT_METRIC = {"late-start": "late_arrival", "killed": "killed", "joins": "joined"}
KILLED_WORKER = 1


@dataclass(frozen=True)
class Situation:
    name: str
    late_s: float
    event_step: int
    steps_after_event: int

    @classmethod
    def of(cls, params: dict[str, Any]) -> Situation | None:
        """The point's situation, or None (an elastic point of another figure)."""
        if "situation" not in params:
            return None
        if params["situation"] not in SITUATIONS:
            raise ValueError(f"situation: {params['situation']!r} is not one of {', '.join(SITUATIONS)}")
        return cls(
            params["situation"],
            float(params.get("late_s", 0)),
            int(params.get("event_step", 0)),
            int(params["steps_after_event"]),
        )

    def workers_at_start(self, workers: int) -> int:
        """Workers the job starts with, of the `workers` it is made for (late-start: one comes later)."""
        return workers - 1 if self.name == "late-start" else workers


def record(
    output: OutputCollector, metric: str, at: float, rank: int | None = None, value: float | None = None
) -> None:
    output.add_record(
        {
            "kind": "metric",
            "time": at,
            "rank": rank,
            "step": None,
            "metric": metric,
            "value": at if value is None else value,
        }
    )


class Stopped(Exception):
    """The run ended before the situation was acted out."""


STOP_JOIN_S = 30.0  # a worker being started when the run ends: wait for it, so that the clean-up stops it


class Director:
    """Acts `situation` out on a background thread, watching the records the ranks print; `add_worker` starts one
    more worker the runtime's way, `stop_job` asks the runtime's workers to stop after their current step."""

    def __init__(
        self,
        situation: Situation,
        add_worker: Callable[[], None],
        output: OutputCollector,
        stop_job: Callable[[], None],
    ) -> None:
        self.situation = situation
        self.add_worker = add_worker
        self.stop_job = stop_job
        self.output = output
        self.error: BaseException | None = None
        self.steps = 0
        self.pids: dict[int, int] = {}
        self.starts: list[dict[str, Any]] = []
        self.steps_at_starts: list[int] = []  # rank 0's step count when each worker announced itself
        self.starts_at_event = 0
        self.steps_at_event = 0
        self.seen = threading.Condition()
        self.stopping = threading.Event()
        output.watchers.append(self.watch)
        self.thread = threading.Thread(target=self._guarded, name="situation", daemon=True)

    def watch(self, kind: str, record: dict[str, Any]) -> None:
        with self.seen:
            if kind == "worker":
                self.pids[record["rank"]] = record["pid"]
                self.starts.append(record)
                self.steps_at_starts.append(self.steps)
            elif kind == "metric" and record.get("metric") == "cluster_size":
                self.steps += 1
            self.seen.notify_all()

    def start(self, timeout_s: float) -> None:
        record(self.output, "job_start", time.time())
        self.deadline = time.monotonic() + timeout_s
        self.thread.start()

    def _guarded(self) -> None:
        try:
            self.act()
        except Stopped:
            pass
        except Exception as error:  # handed to the runtime's supervisor, which fails the run with it
            self.error = error

    def act(self) -> None:
        self.act_out_event()
        steps = self.await_played_out() + self.situation.steps_after_event
        self.await_until(lambda: self.steps >= steps, f"{steps} steps of rank 0")
        self.stop_job()

    def act_out_event(self) -> None:
        situation = self.situation
        if situation.name == "late-start":
            self.await_step(0, 0)  # late with respect to the first worker being ready, however long that took
            if self.stopping.wait(situation.late_s):
                raise Stopped
            self.add_and_record()
        elif situation.name == "killed":
            self.await_step(situation.event_step, KILLED_WORKER)
            os.kill(self.pids[KILLED_WORKER], signal.SIGKILL)
            self.mark_event()
        else:
            self.await_step(situation.event_step, 0)
            self.add_and_record()

    def add_and_record(self) -> None:
        self.mark_event()
        self.add_worker()

    def mark_event(self) -> None:
        with self.seen:
            self.starts_at_event, self.steps_at_event = len(self.starts), self.steps
        record(self.output, EVENT_METRIC[self.situation.name], time.time())

    def await_played_out(self) -> int:
        """Rank 0's step count once the event has played out: at a kill, else when the first worker started after
        the event (the added one; under torchrun, the restart that takes it in) announced itself."""
        if self.situation.name == "killed":
            return self.steps_at_event
        self.await_until(lambda: len(self.starts) > self.starts_at_event, "the added worker's start")
        return self.steps_at_starts[self.starts_at_event]

    def await_step(self, step: int, worker: int) -> None:
        """Wait until rank 0 has reported `step` steps and `worker` has announced itself."""
        self.await_until(lambda: self.steps >= step and worker in self.pids, f"step {step} with worker {worker}")

    def await_until(self, reached: Callable[[], bool], what: str) -> None:
        """Wait until `reached()` (called holding the lock) or the run ends (Stopped) or times out."""
        with self.seen:
            while not reached():
                if self.stopping.is_set():
                    raise Stopped
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"situation {self.situation.name}: {what} not reached")
                self.seen.wait(remaining)

    def check(self) -> None:
        """Raise what went wrong acting the situation out (e.g. the step was never reached)."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Act no more (the run is ending): a worker started now would outlive the run's clean-up."""
        with self.seen:
            self.stopping.set()
            self.seen.notify_all()
        if self.thread.is_alive():
            self.thread.join(STOP_JOIN_S)

    def finish(self) -> None:
        """Stop acting, and file every worker process start seen."""
        self.stop()
        with self.seen:
            starts = list(self.starts)
        for one in starts:
            record(self.output, "worker_start", one["time"], rank=one["rank"], value=one["pid"])
