"""KungFu's adaptive strategy (OSDI 2020, Fig 5): STAR all-reduce whose root moves away from a congested host.

Every step each rank trains one batch (DDP, gradients averaged by the STAR hook, strategies.py), takes the hook's
all-reduce throughput for that step (MiB/s), feeds it to the policy (policies/strategy.py) and casts its vote; the
votes are summed by an all-reduce, so every rank sees the same sum after the same step, and with `adapt` a strict
majority (on `patience` steps in a row) moves the root from rank 0 to rank 1 before the next step, on every rank
at once. Decisions ride only on that collective, never on a clock.

Records per step and rank: `img_per_sec` (batch ÷ step time), `allreduce_mib_per_s`, `vote`; rank 0 adds `votes`
(the sum), `step_start` (the wall-clock time the step began: its records come after the votes' all-reduce, which
the step time leaves out) and `root_switch` (the step it moved the root). At `interference_step` rank 0 records
`interference_requested`: the launcher starts the competing traffic when it reads it (the ranks know nothing of
it). The node's interface bytes are recorded at that step and at the switch too (phases `interference`,
`switch`), beside the run's start and end, so the figure shows where the traffic went.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.rank.adaptation.strategy import StrategyPolicy
from ddlrepro.rank.interfaces import NodeInterfaceCounter
from ddlrepro.rank.models import build_model
from ddlrepro.rank.runtime import RankContext, optimizer_libraries
from ddlrepro.rank.strategies import hooked
from ddlrepro.rank.workloads.throughput import (
    data_parallel,
    make_train_step,
    mean_and_confidence,
    synthetic_batch,
    torch_parameter_sum,
)
from ddlrepro.records import emit, say


def summed_votes(vote: int) -> int:
    """Every rank's vote added up (gloo's all-reduce, the same number on every rank)."""
    votes = torch.tensor([vote], dtype=torch.int64)
    dist.all_reduce(votes)
    return int(votes.item())


libraries = optimizer_libraries  # what the rank loads before `run` (ddlrepro.startup)


def run(params: dict[str, Any], ctx: RankContext) -> None:
    if ctx.world_size < 2 or params["strategy"] != "STAR":
        raise ValueError("the adaptive strategy workload moves STAR's root: it needs STAR and at least 2 workers")
    torch.manual_seed(params.get("seed", 0))
    model = build_model(params["model"]).to(ctx.device)
    images, labels = synthetic_batch(
        params["model"], params["batch_size"], params.get("image_size"), ctx.device, seed=ctx.rank
    )
    trained = data_parallel(model, ctx)
    if not isinstance(trained, DistributedDataParallel):
        raise ValueError("the adaptive strategy workload needs at least 2 workers")
    hook = hooked(trained, "STAR", group_size=1)
    train_step = make_train_step(trained, images, labels)
    policy = StrategyPolicy(ctx.world_size, params["reference_step"], params["threshold"], params["patience"])
    interfaces = NodeInterfaceCounter(ctx.rank, ctx.local_rank)
    dist.barrier()
    rates = []
    for step in range(params["steps"]):
        if step == params["interference_step"]:
            interfaces.record("interference")
            if ctx.rank == 0:
                emit("metric", rank=0, step=step, metric="interference_requested", value=1)
        began, started = time.time(), time.perf_counter()
        train_step().item()
        elapsed = time.perf_counter() - started
        reduced = hook.throughput()
        vote = policy.vote(step, reduced.mib_per_s)
        votes = summed_votes(vote)
        rates.append(params["batch_size"] / elapsed)
        emit("metric", rank=ctx.rank, step=step, metric="img_per_sec", value=rates[-1])
        emit("metric", rank=ctx.rank, step=step, metric="allreduce_mib_per_s", value=reduced.mib_per_s)
        emit("metric", rank=ctx.rank, step=step, metric="vote", value=vote)
        if ctx.rank == 0:
            emit("metric", rank=0, step=step, metric="step_start", value=began)
            emit("metric", rank=0, step=step, metric="votes", value=votes)
        if params["adapt"] and policy.decide(step, votes):
            hook.root = policy.root
            interfaces.record("switch")
            emit("metric", rank=ctx.rank, step=step, metric="root_switch", value=policy.root)
    emit("metric", rank=ctx.rank, iteration=None, metric="parameter_sum", value=torch_parameter_sum(model)())
    mean, confidence = mean_and_confidence(rates)
    if ctx.rank == 0:
        settings = {"framework": "torch", "np": ctx.world_size, "strategy": "STAR", "adapt": params["adapt"]}
        say(f"RESULT: {mean:.2f} +-{confidence:.2f} {json.dumps(settings)}")
        emit(
            "result",
            rank=0,
            img_per_sec_per_worker=mean,
            confidence=confidence,
            total=mean * ctx.world_size,
            switched_at=policy.switched_at,
        )
