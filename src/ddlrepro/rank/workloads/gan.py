"""BigGAN-style conditional GAN under DDP (rank/gan_models.py), the workload of the BigGAN resource-profile study.

Params: resolution, channels, z_dim, attention_resolution, batch_size (per rank), steps (generator steps),
d_steps (discriminator steps per generator step), lr_g, lr_d, betas, seed, dataset (`digits`: scikit-learn's 8×8
digits upscaled to `resolution`; `folder`: `images.npy` uint8 N×3×R×R and `labels.npy` in `data_dir`, checked by
the host with datasets.check_image_folder before any job). The defaults are BigGAN-PyTorch's (hinge loss, Adam β = (0,
0.999), lr G 1e-4 / D 4e-4, 2 D steps per G step); what the seed's own script used is unknown.

G and D are two DDP modules in one process group: every rank runs the same sequence of forwards and backwards, so
their all-reduces match up. BatchNorm is per rank, not SyncBatchNorm, as BigGAN-PyTorch's default (its
cross-replica BN is an option): each rank normalises its own batch, and DDP broadcasts rank 0's running statistics
(and spectral norm's power-iteration vectors) at every forward. During the G step D runs outside its DDP wrapper
with its parameters frozen, so no D gradient is all-reduced for a step that does not update D.

Every rank records `step_time_s` per generator step (its D steps included) and rank 0 `d_loss` and `g_loss`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ddlrepro.rank.gan_models import (
    Discriminator,
    Generator,
    discriminator_backward,
    generator_backward,
    latents,
    load_images,
    shape_of,
)
from ddlrepro.rank.runtime import RankContext, optimizer_libraries
from ddlrepro.records import emit


class GanTrainer:
    """G and D under DDP with their Adam optimisers; `step()` is one G step after `d_steps` D steps."""

    def __init__(self, params: dict[str, Any], ctx: RankContext) -> None:
        torch.manual_seed(params["seed"])  # equal initial weights everywhere (DDP broadcasts rank 0's anyway)
        self.images, self.labels = load_images(params)
        self.shape = shape_of(params, self.images.shape[1])
        self.ctx, self.params = ctx, params
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.generator = DistributedDataParallel(Generator(self.shape).to(ctx.device), device_ids=device_ids)
        self.discriminator = DistributedDataParallel(Discriminator(self.shape).to(ctx.device), device_ids=device_ids)
        betas = tuple(params["betas"])
        self.g_optimizer = torch.optim.Adam(self.generator.parameters(), lr=params["lr_g"], betas=betas)
        self.d_optimizer = torch.optim.Adam(self.discriminator.parameters(), lr=params["lr_d"], betas=betas)
        # Each rank draws its own batches and latents (a different seed per rank), as a distributed sampler would.
        self.sampler = torch.Generator().manual_seed(params["seed"] * 1000 + ctx.rank)

    def real_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(len(self.images), (self.params["batch_size"],), generator=self.sampler)
        return self.images[index].to(self.ctx.device), self.labels[index].to(self.ctx.device)

    def latents(self) -> tuple[torch.Tensor, torch.Tensor]:
        z, labels = latents(self.params["batch_size"], self.shape, self.sampler)
        return z.to(self.ctx.device), labels.to(self.ctx.device)

    def discriminator_step(self) -> float:
        self.d_optimizer.zero_grad(set_to_none=True)
        loss = discriminator_backward(self.generator, self.discriminator, *self.real_batch(), *self.latents())
        self.d_optimizer.step()
        return loss

    def generator_step(self) -> float:
        self.g_optimizer.zero_grad(set_to_none=True)
        loss = generator_backward(self.generator, self.discriminator.module, *self.latents())
        self.g_optimizer.step()
        return loss

    def step(self) -> tuple[float, float]:
        d_loss = sum(self.discriminator_step() for _ in range(self.params["d_steps"])) / self.params["d_steps"]
        return d_loss, self.generator_step()


def parameter_digest(module: torch.nn.Module) -> float:
    """A number that changes with any parameter: the sum of every parameter's values weighted by position."""
    flat = torch.cat([parameter.detach().flatten().double().cpu() for parameter in module.parameters()])
    return float((flat * torch.arange(1, len(flat) + 1, dtype=torch.float64).sqrt()).sum())


libraries = optimizer_libraries  # what the rank loads before `run` (ddlrepro.startup)


def run(params: dict[str, Any], ctx: RankContext) -> None:
    trainer = GanTrainer(params, ctx)
    for step in range(params["steps"]):
        started = time.perf_counter()
        d_loss, g_loss = trainer.step()
        ctx.synchronize()
        emit("metric", rank=ctx.rank, step=step, metric="step_time_s", value=time.perf_counter() - started)
        if ctx.rank == 0:
            emit("metric", rank=0, step=step, metric="d_loss", value=d_loss)
            emit("metric", rank=0, step=step, metric="g_loss", value=g_loss)
    for name, module in (("generator", trainer.generator.module), ("discriminator", trainer.discriminator.module)):
        emit("metric", rank=ctx.rank, metric=f"{name}_digest", value=parameter_digest(module))
    if ctx.rank == 0:
        emit("result", rank=0, steps=params["steps"], d_loss=d_loss, g_loss=g_loss)
