"""Consistent elastic training (EasyScale): E logical workers on this job's processes, D0 / D1 / plain DDP.

Params: model, logical_workers, placement (ESTs per process, one entry per worker), mode (D0, D1, ddp), batch_size
(per EST), steps (run in this job), resume_from (point id of the stage whose checkpoint this job continues),
learning_rate, seed. Rank 0 records the global loss of every step; every rank records its step time and the time
it spent switching between ESTs, under its emulated device type (`device_types`, `kernels`: devicetypes.py; a
profile of step time per type reads them), and once the CPU quota it ran under (`cpu_quota_cores`, the status in
`detail`); rank 0 writes `checkpoint.pt` into the run folder at the end. Param checkpoint_timing: rank 0 also
records `checkpoint_restore_s`, the seconds of gathering, saving, loading and restoring that checkpoint (what a
reallocation costs a job beyond its restart).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import torch

from ddlrepro.rank import devicetypes
from ddlrepro.rank.checkpoints import load_checkpoint, save_checkpoint
from ddlrepro.rank.easyscale import ConsistentTrainer
from ddlrepro.rank.runtime import RankContext, optimizer_libraries
from ddlrepro.records import emit

CHECKPOINT = "checkpoint.pt"


libraries = optimizer_libraries  # what the rank loads before `run` (ddlrepro.startup)


def run(params: dict[str, Any], ctx: RankContext) -> None:
    placement = params["placement"]
    if len(placement) != ctx.world_size:
        raise ValueError(f"placement {placement} needs {len(placement)} workers, the job has {ctx.world_size}")
    run_dir = Path(os.environ["DDLREPRO_RUN_DIR"])
    trainer = ConsistentTrainer(params, ctx.rank, placement)
    if params.get("resume_from"):
        trainer.restore(load_checkpoint(run_dir.parent / params["resume_from"] / CHECKPOINT))
    typed = {"device_type": devicetypes.describe_type(params, ctx.rank)}
    if params.get("device_types"):
        device = devicetypes.describe_device(params, ctx.rank)
        emit(
            "metric",
            rank=ctx.rank,
            metric="cpu_quota_cores",
            value=device["cpu_quota_cores"],
            **typed,
            detail=device["cpu_quota_status"],
        )
    for _ in range(params["steps"]):
        started, switched = time.perf_counter(), trainer.switch_seconds
        loss = trainer.train_step()
        step = trainer.step - 1
        emit("metric", rank=ctx.rank, step=step, metric="step_time_s", value=time.perf_counter() - started, **typed)
        emit(
            "metric", rank=ctx.rank, step=step, metric="switch_time_s", value=trainer.switch_seconds - switched, **typed
        )
        if ctx.rank == 0:
            emit("metric", rank=0, step=step, metric="loss", value=loss)
            emit("metric", rank=0, step=step, metric="parameters_digest", value=parameters_digest(trainer.model))
        # Param est_timings: every EST's laps of the step (easyscale.StepLaps), est_time_s by `est` and `phase`.
        for (est, part), seconds in trainer.laps.seconds.items():
            emit("metric", rank=ctx.rank, step=step, est=est, phase=part, metric="est_time_s", value=seconds, **typed)
    started = time.perf_counter()
    checkpoint = trainer.checkpoint()
    if checkpoint is not None:
        save_checkpoint(checkpoint, run_dir / CHECKPOINT)
        if params.get("checkpoint_timing"):
            trainer.restore(load_checkpoint(run_dir / CHECKPOINT))
            emit("metric", rank=0, metric="checkpoint_restore_s", value=time.perf_counter() - started, **typed)
        emit("result", rank=0, mode=params["mode"], placement=placement, last_step=trainer.step - 1, loss=loss)


def parameters_digest(model: torch.nn.Module) -> float:
    """The first 48 bits of a SHA-256 of every parameter's bytes after the step, as a float (exact below 2**53):
    equal for equal parameters; a loss can stay equal for steps while the parameters already differ."""
    hasher = hashlib.sha256()
    for parameter in model.parameters():
        hasher.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return float(int(hasher.hexdigest()[:12], 16))
