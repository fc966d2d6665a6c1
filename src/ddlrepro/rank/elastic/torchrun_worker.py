"""The baseline: elastic training as torchrun does it (`python -m ddlrepro.rank.elastic.torchrun_worker POINT_JSON`
under `torchrun --nnodes=1:N --rdzv-backend=c10d`, started by `host/launchers/torchrun.py`).

On a scheduled resize rank 0 asks the config server, saves a checkpoint and every worker waits; the launcher adds
or stops torchrun agents; torchrun stops every worker and restarts them all in a new rendezvous, and they resume
from the checkpoint. The latency is measured as for the in-place runtime, from rank 0 seeing the new config to the
first step done at the new size.
"""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # a rank starting: no collections while it loads its libraries (startup.py)
    startup.pause_collection()

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

from ddlrepro.points import Point
from ddlrepro.rank.checkpoints import load_checkpoint, save_checkpoint
from ddlrepro.rank.elastic.client import ConfigClient
from ddlrepro.rank.elastic.cluster import SERVER_ENV, TOKEN_ENV
from ddlrepro.rank.elastic.events import RESTART_PHASES, ResizeEvent
from ddlrepro.rank.elastic.schedule import parse_schedule
from ddlrepro.rank.elastic.trainer import DefaultGroup, ElasticTrainer, announce, build_trainer, emit_step
from ddlrepro.rank.runtime import rendezvous_store
from ddlrepro.records import emit
from ddlrepro.shutdown import run_rank

WAIT_POLL_S = 0.05
NO_RESIZE = -1


def checkpoint_path() -> Path:
    return Path(os.environ["DDLREPRO_RUN_DIR"]) / "elastic-checkpoint.pt"


def event_path() -> Path:
    """The resize in progress (its marks so far), written after the checkpoint."""
    return Path(os.environ["DDLREPRO_RUN_DIR"]) / "elastic-event.json"


def main(argv: list[str]) -> None:
    point = Point.from_json(argv[0])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", store=rendezvous_store(rank), rank=rank, world_size=world_size)
    group_formed = time.time()
    trainer = build_trainer(point.params, point.threads_per_worker)
    event = resume(trainer, dist.get_rank())
    group = DefaultGroup(version=trainer.step)
    if event is not None:
        event.mark("restarted", psutil.Process().create_time())
        event.mark("group", group_formed)
        event.mark("synced")
    announce(group.rank)
    schedule = {entry.step: entry.size for entry in parse_schedule(point.params["schedule"])}
    client = ConfigClient(os.environ[SERVER_ENV], os.environ.get(TOKEN_ENV))
    interval = int(point.params.get("checkpoint_interval", 0))
    host_stops = "situation" in point.params  # launchers/situations.py: the host ends the run after the event
    while True:
        step_time = trainer.train_step(group)
        if group.rank == 0:
            emit_step(trainer.step - 1, group.size, trainer.batch_size, step_time)
            if interval and trainer.step % interval == 0:
                save_periodic_checkpoint(trainer)
            if event is not None:
                event.mark("first_step")
                event.emit(group.size)
                event = None
        size = torch.tensor([next_size(schedule, trainer.step, client, host_stops) if group.rank == 0 else 0])
        group.broadcast(size, 0)
        if int(size) != NO_RESIZE:
            resize(trainer, group, client, int(size))


def next_size(schedule: dict[int, int], step: int, client: ConfigClient, host_stops: bool) -> int:
    """Rank 0's resize after `step` steps: the schedule's, else 0 (the stop) once the host has stopped the job."""
    scheduled = schedule.get(step, NO_RESIZE)
    if scheduled == NO_RESIZE and host_stops and client.stopped():
        return 0
    return scheduled


def resume(trainer: ElasticTrainer, rank: int) -> ResizeEvent | None:
    """Load the checkpoint a resize left, if any; the event it carries continues in this incarnation."""
    if not checkpoint_path().exists():
        return None
    trainer.restore(load_checkpoint(checkpoint_path()))
    if rank != 0:
        return None
    emit("ledger", rank=0, step=None, resume=trainer.offset, version=trainer.step)
    return ResizeEvent(**json.loads(event_path().read_text())) if event_path().exists() else None


def resize(trainer: ElasticTrainer, group: DefaultGroup, client: ConfigClient, size: int) -> None:
    """Rank 0 asks for the new size and checkpoints; then every worker waits to be stopped (or finishes at 0)."""
    if group.rank == 0:
        with termination_deferred():
            event = ResizeEvent(trainer.step, group.size, RESTART_PHASES)
            event.mark("seen")
            client.resize(size)
            event.mark("config")
            if size == 0:
                emit("result", rank=0, steps=trainer.step, samples=trainer.offset)
            else:
                checkpoint_for_resize(trainer, event)
    if size == 0:
        dist.destroy_process_group()
        sys.exit(0)
    wait_for_restart(group)


@contextmanager
def termination_deferred() -> Iterator[None]:
    """Hold a SIGTERM until the block is done, then die of it. Once the config server has the new size the
    launcher may stop any agent, this worker's own included (torchrun ranks agents by pid, so rank 0 can sit on
    the newest one, the one a shrink stops); the checkpoint must be whole by then, or the survivors resume from
    an older one and replay steps up to a resize they have already made."""
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            signal.raise_signal(signal.SIGTERM)


def checkpoint_for_resize(trainer: ElasticTrainer, event: ResizeEvent) -> None:
    write_checkpoint(trainer)
    event.mark("checkpointed")
    written = event_path().with_suffix(".partial")
    written.write_text(json.dumps(asdict(event)))
    os.replace(written, event_path())


def write_checkpoint(trainer: ElasticTrainer) -> None:
    save_checkpoint(trainer.checkpoint(), checkpoint_path())


def save_periodic_checkpoint(trainer: ElasticTrainer) -> None:
    """A checkpoint every `checkpoint_interval` steps (point parameter; 0: only at resizes), for restarts that no
    resize announced (a worker killed, an agent joining): the workers then resume from it, with no resize event."""
    with termination_deferred():
        event_path().unlink(missing_ok=True)  # an older resize's: not the event of the restart to come
        write_checkpoint(trainer)


def wait_for_restart(group: DefaultGroup) -> None:
    """Idle in small all-reduces until torchrun stops this worker (growth) or a peer's agent is gone (shrink:
    the collective fails, the worker exits with an error, and torchrun restarts the survivors)."""
    alive = torch.ones(1)
    while True:
        try:
            group.all_reduce(alive)
        except RuntimeError:
            sys.exit(1)
        time.sleep(WAIT_POLL_S)


if __name__ == "__main__":
    run_rank(main)
