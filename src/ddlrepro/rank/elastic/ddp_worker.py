"""Plain data-parallel training in a static world, the non-elastic baseline (`python -m
ddlrepro.rank.elastic.ddp_worker POINT_JSON`, started by `host/launchers/ddp.py` with torchrun's environment:
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

`init_process_group` waits until all WORLD_SIZE ranks have arrived (or `rendezvous_timeout_s` passes); a collective
with a dead peer raises and the worker exits with an error; a process that arrives with another world size is no
member of this one. The same model, data and gradient averaging as the elastic runtimes (`trainer.py`), over torch's
default group (gloo, CPU); training stops after the schedule's stop step, or earlier when the host stops the job
(rank 0 asks the harness's config server after every step and broadcasts the answer).
"""

from __future__ import annotations

from ddlrepro import startup

if __name__ == "__main__":  # a rank starting: no collections while it loads its libraries (startup.py)
    startup.pause_collection()

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ddlrepro.points import Point
from ddlrepro.rank.elastic.client import ConfigClient
from ddlrepro.rank.elastic.cluster import SERVER_ENV, TOKEN_ENV
from ddlrepro.rank.elastic.schedule import parse_schedule
from ddlrepro.rank.elastic.trainer import DefaultGroup, announce, build_trainer, emit_step
from ddlrepro.rank.runtime import rendezvous_store
from ddlrepro.records import emit
from ddlrepro.shutdown import run_rank


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m ddlrepro.rank.elastic.ddp_worker POINT_JSON")
    point = Point.from_json(argv[0])
    stop = parse_schedule(point.params["schedule"])[-1].step
    trainer = build_trainer(point.params, point.threads_per_worker)
    announce(int(os.environ["RANK"]))  # ready to train, before the rendezvous: a waiting worker counts as started
    rank, timeout = int(os.environ["RANK"]), timedelta(seconds=float(point.params["rendezvous_timeout_s"]))
    store = rendezvous_store(rank, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    group = DefaultGroup(version=0)
    client = ConfigClient(os.environ[SERVER_ENV], os.environ.get(TOKEN_ENV))
    while trainer.step < stop:
        step_time = trainer.train_step(group)
        if group.rank == 0:
            emit_step(trainer.step - 1, group.size, trainer.batch_size, step_time)
        if stopped_by_host(group, client):
            break
    if group.rank == 0:
        emit("result", rank=0, steps=trainer.step, samples=trainer.offset)
    dist.destroy_process_group()


def stopped_by_host(group: DefaultGroup, client: ConfigClient) -> bool:
    """Whether the host has stopped the job (rank 0 asks; every rank gets its answer)."""
    stopped = torch.tensor([int(group.rank == 0 and client.stopped())])
    group.broadcast(stopped, 0)
    return bool(stopped)


if __name__ == "__main__":
    run_rank(main)
