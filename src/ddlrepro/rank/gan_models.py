"""BigGAN-style conditional GAN models (Brock et al. 2019, after BigGAN-PyTorch), small enough for a CPU smoke run.

Generator: a shared class embedding and hierarchical latents (one chunk of z per block) feed conditional BatchNorm
in every residual up-sampling block; one self-attention layer at `attention_resolution`. Discriminator: residual
down-sampling blocks, the same self-attention, sum pooling and a projection head (Miyato & Koyama 2018). Spectral
norm on every weight of both, as in BigGAN. Resolutions are powers of two from 32 px (three blocks from 4 px) up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from ddlrepro.rank.datasets import check_image_folder, digit_pixels

BOTTOM_PX = 4


@dataclass(frozen=True)
class GanShape:
    """What both networks are built for: image size, classes, channel width, latent size, attention placement."""

    resolution: int = 32
    classes: int = 10
    channels: int = 32
    z_dim: int = 64
    embedding_dim: int = 32
    attention_resolution: int = 16
    image_channels: int = 3

    @property
    def blocks(self) -> int:
        count = math.log2(self.resolution / BOTTOM_PX)
        if count < 1 or not count.is_integer():
            raise ValueError(f"resolution {self.resolution}: a power of two of at least {2 * BOTTOM_PX} px expected")
        if not 2 * BOTTOM_PX <= self.attention_resolution <= self.resolution // 2:
            raise ValueError(
                f"attention_resolution {self.attention_resolution}: between {2 * BOTTOM_PX} and {self.resolution // 2}"
            )
        return int(count)


def snconv(inputs: int, outputs: int, kernel: int = 3) -> nn.Module:
    return spectral_norm(nn.Conv2d(inputs, outputs, kernel, padding=kernel // 2))


def snlinear(inputs: int, outputs: int, bias: bool = True) -> nn.Module:
    return spectral_norm(nn.Linear(inputs, outputs, bias=bias))


class ConditionalBatchNorm(nn.Module):
    """BatchNorm without its own affine; gain and bias are linear in the block's condition (z chunk + class)."""

    def __init__(self, channels: int, condition_dim: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels, affine=False)
        self.gain = snlinear(condition_dim, channels, bias=False)
        self.bias = snlinear(condition_dim, channels, bias=False)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        gain = 1 + self.gain(condition)[:, :, None, None]
        return self.norm(x) * gain + self.bias(condition)[:, :, None, None]


class SelfAttention(nn.Module):
    """SAGAN's non-local block with BigGAN's channel reductions (θ, φ: C/8; g: C/2) and 2×2 pooling of φ and g."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.theta = snconv(channels, channels // 8, 1)
        self.phi = snconv(channels, channels // 8, 1)
        self.g = snconv(channels, channels // 2, 1)
        self.out = snconv(channels // 2, channels, 1)
        self.gamma = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        theta = self.theta(x).flatten(2)
        phi = F.max_pool2d(self.phi(x), 2).flatten(2)
        g = F.max_pool2d(self.g(x), 2).flatten(2)
        attention = torch.softmax(theta.transpose(1, 2) @ phi, dim=-1)
        attended = (g @ attention.transpose(1, 2)).view(batch, channels // 2, height, width)
        return x + self.gamma * self.out(attended)


class GeneratorBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, condition_dim: int) -> None:
        super().__init__()
        self.bn1 = ConditionalBatchNorm(inputs, condition_dim)
        self.conv1 = snconv(inputs, outputs)
        self.bn2 = ConditionalBatchNorm(outputs, condition_dim)
        self.conv2 = snconv(outputs, outputs)
        self.skip = snconv(inputs, outputs, 1)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(F.relu(self.bn1(x, condition)), scale_factor=2)
        h = self.conv2(F.relu(self.bn2(self.conv1(h), condition)))
        return h + self.skip(F.interpolate(x, scale_factor=2))


class Generator(nn.Module):
    def __init__(self, shape: GanShape) -> None:
        super().__init__()
        self.shape = shape
        width = 4 * shape.channels
        self.chunk = shape.z_dim // (shape.blocks + 1)
        if self.chunk < 1:
            raise ValueError(f"z_dim {shape.z_dim} is smaller than the {shape.blocks + 1} chunks it is split into")
        condition_dim = self.chunk + shape.embedding_dim
        self.embedding = nn.Embedding(shape.classes, shape.embedding_dim)
        self.linear = snlinear(self.chunk, width * BOTTOM_PX**2)
        self.blocks = nn.ModuleList(GeneratorBlock(width, width, condition_dim) for _ in range(shape.blocks))
        self.attention_after = int(math.log2(shape.attention_resolution / BOTTOM_PX)) - 1
        self.attention = SelfAttention(width)
        self.out_norm = nn.BatchNorm2d(width)
        self.out_conv = snconv(width, shape.image_channels)

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        chunks = z[:, : self.chunk * (self.shape.blocks + 1)].split(self.chunk, dim=1)
        embedded = self.embedding(labels)
        h = self.linear(chunks[0]).view(z.shape[0], -1, BOTTOM_PX, BOTTOM_PX)
        for index, (block, chunk) in enumerate(zip(self.blocks, chunks[1:], strict=True)):
            h = block(h, torch.cat([chunk, embedded], dim=1))
            if index == self.attention_after:
                h = self.attention(h)
        return torch.tanh(self.out_conv(F.relu(self.out_norm(h))))


class DiscriminatorBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, preactivation: bool) -> None:
        super().__init__()
        self.preactivation = preactivation
        self.conv1 = snconv(inputs, outputs)
        self.conv2 = snconv(outputs, outputs)
        self.skip = snconv(inputs, outputs, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(x) if self.preactivation else x
        h = F.avg_pool2d(self.conv2(F.relu(self.conv1(h))), 2)
        return h + F.avg_pool2d(self.skip(x), 2)


class Discriminator(nn.Module):
    def __init__(self, shape: GanShape) -> None:
        super().__init__()
        width = 4 * shape.channels
        self.blocks = nn.ModuleList(
            DiscriminatorBlock(shape.image_channels if index == 0 else width, width, preactivation=index > 0)
            for index in range(shape.blocks)
        )
        self.attention_after = int(math.log2(shape.resolution / shape.attention_resolution)) - 1
        self.attention = SelfAttention(width)
        self.linear = snlinear(width, 1)
        self.embedding = spectral_norm(nn.Embedding(shape.classes, width))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = images
        for index, block in enumerate(self.blocks):
            h = block(h)
            if index == self.attention_after:
                h = self.attention(h)
        pooled = F.relu(h).sum(dim=(2, 3))
        return self.linear(pooled).squeeze(1) + (self.embedding(labels) * pooled).sum(dim=1)


def load_images(params: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The dataset's images in [-1, 1] (N, C, R, R) and int64 labels: `digits` (scikit-learn's 8×8 digits upscaled to
    `resolution`) or `folder` (`images.npy` and `labels.npy` in `data_dir`)."""
    resolution = params["resolution"]
    if params["dataset"] == "folder":
        check_image_folder(params["data_dir"], resolution)
        images = torch.from_numpy(np.load(Path(params["data_dir"]) / "images.npy")).float() / 127.5 - 1
        return images, torch.from_numpy(np.load(Path(params["data_dir"]) / "labels.npy")).long()
    pixels, labels = digit_pixels()
    small = torch.from_numpy(pixels.reshape(-1, 1, 8, 8).astype(np.float32) / 8.0 - 1)
    images = F.interpolate(small, size=resolution, mode="bilinear", align_corners=False)
    return images, torch.from_numpy(labels).long()


def shape_of(params: dict[str, Any], image_channels: int) -> GanShape:
    """The networks' shape from a point's params (the `gan` keys of the config schema)."""
    return GanShape(
        resolution=params["resolution"],
        classes=params.get("classes", 10),
        channels=params["channels"],
        z_dim=params["z_dim"],
        attention_resolution=params["attention_resolution"],
        image_channels=image_channels,
    )


def latents(batch: int, shape: GanShape, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of G's inputs: normal z and uniform class labels, from `generator` (torch's global one if None)."""
    z = torch.randn(batch, shape.z_dim, generator=generator)
    return z, torch.randint(shape.classes, (batch,), generator=generator)


def discriminator_hinge_loss(real_scores: torch.Tensor, fake_scores: torch.Tensor) -> torch.Tensor:
    return F.relu(1 - real_scores).mean() + F.relu(1 + fake_scores).mean()


def generator_hinge_loss(fake_scores: torch.Tensor) -> torch.Tensor:
    return -fake_scores.mean()


def discriminator_backward(
    generator: nn.Module,
    discriminator: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    z: torch.Tensor,
    fake_labels: torch.Tensor,
) -> float:
    """One D step's hinge loss, back-propagated into D: real images against G's fakes of `fake_labels` (made without
    gradients), each judged with its own labels; the loss."""
    with torch.no_grad():
        fake = generator(z, fake_labels)
    scores = discriminator(torch.cat([images, fake]), torch.cat([labels, fake_labels]))
    loss = discriminator_hinge_loss(*scores.split(len(images)))
    loss.backward()
    return loss.item()


def generator_backward(generator: nn.Module, discriminator: nn.Module, z: torch.Tensor, labels: torch.Tensor) -> float:
    """One G step's hinge loss, back-propagated into G through a frozen D (no D gradient for a step that does not
    update D); the loss."""
    discriminator.requires_grad_(False)
    try:
        loss = generator_hinge_loss(discriminator(generator(z, labels), labels))
        loss.backward()
    finally:
        discriminator.requires_grad_(True)
    return loss.item()
