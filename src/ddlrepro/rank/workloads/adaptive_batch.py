"""Real-data training with KungFu's adaptive batch size (OSDI 2020 Fig 4), or at a fixed batch.

DDP over the workers (gloo on CPU); each epoch every rank takes its own shard of a seeded permutation of the
training split, in batches of the current per-worker batch B. With `adaptive`, the noise-scale monitor rides on
DDP's all-reduce every `monitor_interval`-th step and feeds `policies.batch.AdaptiveBatchPolicy`; after each
cycle's last epoch the policy's B takes effect in place: same processes, same DDP model and optimizer, the learning
rate set by `lr_rule`. Every rank is fed the same all-reduced values, so every rank decides the same B; an
all-reduce of the decision checks it. The test split is evaluated at the start and after every cycle (accuracy %,
with the training time so far, evaluations excluded).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.rank import datasets
from ddlrepro.rank.adaptation.batch import AdaptiveBatchPolicy, learning_rate, starting_rate
from ddlrepro.rank.models import build_model
from ddlrepro.rank.monitors import GradientMonitor
from ddlrepro.rank.runtime import RankContext, optimizer_libraries
from ddlrepro.rank.workloads.throughput import data_parallel
from ddlrepro.records import emit


class AdaptiveBatchTrainer:
    """One rank's data-parallel training whose per-worker batch can change between steps."""

    def __init__(self, params: dict[str, Any], ctx: RankContext) -> None:
        if ctx.world_size < 2:
            raise ValueError("adaptive batch training needs at least 2 workers (the noise scale compares them)")
        self.params = params
        self.ctx = ctx
        split = datasets.load(params["dataset"], params.get("data_dir"), params["seed"], params["test_fraction"])
        self.train_images, self.train_labels = (
            torch.from_numpy(split.train_images),
            torch.from_numpy(split.train_labels),
        )
        self.test_images, self.test_labels = torch.from_numpy(split.test_images), torch.from_numpy(split.test_labels)
        torch.manual_seed(params["seed"])
        self.module = build_model(params["model"]).to(ctx.device)
        self.model = data_parallel(self.module, ctx)
        self.base_batch = params["batch_size"]
        self.batch_size = self.base_batch
        self.base_rate = starting_rate(params["learning_rate"], params["lr_reference_batch"], self.base_batch)
        self.optimizer = torch.optim.SGD(
            decay_groups(self.module, params["weight_decay"]), lr=self.base_rate, momentum=params["momentum"]
        )
        self.monitor: GradientMonitor | None = None
        self.policy: AdaptiveBatchPolicy | None = None
        if params["adaptive"]:
            micro_batches = params["micro_batches"]
            self.monitor = GradientMonitor(
                "noise-scale",
                params["monitor_interval"],
                self.batch_size,
                ctx.world_size,
                params["noise_scale_alpha"],
                micro_batches,
                params["noise_scale_aggregation"],
            )
            if not isinstance(self.model, DistributedDataParallel):
                raise ValueError("the adaptive batch needs at least 2 workers: its noise scale compares them")
            self.monitor.attach(self.model)
            self.policy = AdaptiveBatchPolicy(
                self.batch_size,
                params["cap"],
                params["cycle_epochs"],
                params["ema_weight"],
                micro_batches,
                params["batch_rule"],
            )

    def epoch_batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches of epoch `epoch`: its shard of the epoch's seeded permutation, the last partial
        batch dropped (every rank takes the same number of steps)."""
        samples = len(self.train_labels)
        order = np.random.default_rng([self.params["seed"], epoch]).permutation(samples)
        shard = torch.from_numpy(order[self.ctx.rank :: self.ctx.world_size][: samples // self.ctx.world_size])
        for start in range(0, len(shard) - self.batch_size + 1, self.batch_size):
            indices = shard[start : start + self.batch_size]
            yield self.train_images[indices].to(self.ctx.device), self.train_labels[indices].to(self.ctx.device)

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float | None]:
        """One SGD step; (this rank's loss, the step's noise scale when adaptive)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(images), labels)
        loss.backward()
        self.optimizer.step()
        measured = self.monitor.end_step() if self.monitor else None
        if measured is not None and self.policy is not None:
            self.policy.observe(measured[1])
        return float(loss.detach()), measured[1] if measured else None

    def set_batch_size(self, batch_size: int) -> None:
        """Change the per-worker batch in place, for the next step on: the monitor and learning rate follow."""
        self.batch_size = batch_size
        if self.monitor is not None:
            self.monitor.set_batch_size(batch_size)
        rate = learning_rate(self.params["lr_rule"], self.base_rate, self.base_batch, batch_size)
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def decide(self, epoch: int) -> int:
        """The batch of the next epoch: the policy's, checked to be every rank's."""
        if self.policy is None:
            return self.batch_size
        decided = self.policy.end_epoch(epoch)
        both = torch.tensor([decided, -decided], dtype=torch.int64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        if int(both[0]) != -int(both[1]):
            raise RuntimeError(f"ranks decided different batches after epoch {epoch}: {int(-both[1])}..{int(both[0])}")
        return decided

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Accuracy (%) and mean loss on the test split, each rank scoring its shard, summed by an all-reduce."""
        self.module.eval()
        images = self.test_images[self.ctx.rank :: self.ctx.world_size].to(self.ctx.device)
        labels = self.test_labels[self.ctx.rank :: self.ctx.world_size].to(self.ctx.device)
        totals = torch.zeros(3, dtype=torch.float64)
        for start in range(0, len(labels), 1000):
            logits = self.module(images[start : start + 1000])
            batch_labels = labels[start : start + 1000]
            totals[0] += float((logits.argmax(dim=1) == batch_labels).sum())
            totals[1] += float(F.cross_entropy(logits, batch_labels, reduction="sum"))
            totals[2] += len(batch_labels)
        dist.all_reduce(totals)
        self.module.train()
        return float(100 * totals[0] / totals[2]), float(totals[1] / totals[2])

    def parameters_vector(self) -> torch.Tensor:
        return nn.utils.parameters_to_vector(self.module.parameters()).detach().cpu()


def decay_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """SGD parameter groups: weight decay on every parameter outside BatchNorm layers, as the fork's L2 loss
    leaves out its `batch_normalization` variables (luomai/models@osdi20 official/resnet/resnet_run_loop.py:360-367;
    an L2 term w·|θ|²/2 on the loss adds w·θ to the gradient, as SGD's weight_decay does)."""
    norms = {id(p) for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for p in m.parameters()}
    decayed = [p for p in module.parameters() if id(p) not in norms]
    kept = [p for p in module.parameters() if id(p) in norms]
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": kept, "weight_decay": 0.0}]


def record_evaluation(trainer: AdaptiveBatchTrainer, epoch: int, train_time: float) -> None:
    accuracy, loss = trainer.evaluate()
    rank = trainer.ctx.rank
    emit("metric", rank=rank, iteration=epoch, metric="accuracy", value=accuracy)
    emit("metric", rank=rank, iteration=epoch, metric="test_loss", value=loss)
    emit("metric", rank=rank, iteration=epoch, metric="eval_train_time_s", value=train_time)


libraries = optimizer_libraries  # what the rank loads before `run` (ddlrepro.startup)


def run(params: dict[str, Any], ctx: RankContext) -> None:
    trainer = AdaptiveBatchTrainer(params, ctx)
    step, train_time = 0, 0.0
    record_evaluation(trainer, 0, train_time)
    for epoch in range(1, params["epochs"] + 1):
        losses = []
        started = time.perf_counter()
        for images, labels in trainer.epoch_batches(epoch):
            loss, noise_scale = trainer.step(images, labels)
            losses.append(loss)
            policy, monitor = trainer.policy, trainer.monitor
            if noise_scale is not None and policy and monitor and ctx.rank == 0:
                emit("metric", rank=0, step=step, metric="noise_scale", value=noise_scale)
                emit("metric", rank=0, step=step, metric="ratio", value=abs(noise_scale) / trainer.batch_size)
                emit("metric", rank=0, step=step, metric="ratio_ema", value=policy.ema.value)
                for metric in ("noise_scale_gradient_sq", "noise_scale_trace"):
                    emit("metric", rank=0, step=step, metric=metric, value=monitor.measurements[metric])
            step += 1
        ctx.synchronize()
        elapsed = time.perf_counter() - started
        train_time += elapsed
        values = {"batch_size": trainer.batch_size, "epoch_time_s": elapsed, "train_time_s": train_time}
        values["train_loss"] = float(np.mean(losses)) if losses else float("nan")
        for metric, value in values.items():
            emit("metric", rank=ctx.rank, iteration=epoch, metric=metric, value=value)
        decided = trainer.decide(epoch)
        if decided != trainer.batch_size:
            trainer.set_batch_size(decided)
        if epoch % params["cycle_epochs"] == 0 or epoch == params["epochs"]:
            record_evaluation(trainer, epoch, train_time)
    if ctx.rank == 0:
        emit("result", rank=0, epochs=params["epochs"], final_batch_size=trainer.batch_size, steps=step)
    emit(
        "metric",
        rank=ctx.rank,
        iteration=None,
        metric="parameter_sum",
        value=float(trainer.parameters_vector().double().sum()),
    )
