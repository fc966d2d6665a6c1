"""`torchvision.models.<name>(**options)` for Horovod's synthetic benchmark: ddlrepro's model `<name>`, fitted to
the script's fixed fake batch (224×224 images, labels in [0, 1000)) without changing what it computes.

- Input: the images are cropped to the point's image size (`DDLREPRO_SHIM_IMAGE_SIZE`, default the model's own),
  a view of their top-left corner, so the model trains at the same size as the workload it is compared with.
- Output: the model's logits are padded with zeros to 1000 classes, so the script's labels are valid targets;
  the parameters (and so what Horovod all-reduces) are the model's own.
- torchvision options (`norm_layer=hvd.SyncBatchNorm` in newer versions of the script) are ignored: the model
  keeps its own BatchNorm, as in the workload.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ddlrepro.rank.models import MODELS, build_model

IMAGE_SIZE_ENV = "DDLREPRO_SHIM_IMAGE_SIZE"
SCRIPT_CLASSES = 1000


class AsInTorchvision(nn.Module):
    """`model` on the top-left `side`×`side` crop of its input, logits zero-padded to `classes`."""

    def __init__(self, model: nn.Module, side: int, classes: int) -> None:
        super().__init__()
        self.model = model
        self.side = side
        self.classes = classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.model(images[..., : self.side, : self.side])
        return F.pad(logits, (0, max(0, self.classes - logits.shape[-1])))


def __getattr__(name: str) -> Callable[..., nn.Module]:
    if name not in MODELS:
        raise AttributeError(f"ddlrepro has no model {name!r}; valid models: {', '.join(sorted(MODELS))}")

    def build(**torchvision_options: Any) -> nn.Module:
        side = int(os.environ.get(IMAGE_SIZE_ENV) or MODELS[name].image_size)
        return AsInTorchvision(build_model(name), side, SCRIPT_CLASSES)

    return build
