"""Squared gradient norms of a batch's k micro-batches, from each layer's input and output gradient.

With a loss that is the batch's mean, the gradient is the sum of the micro-batches' shares c_m = (1/B)·Σ_{i∈m} ∇ℓ_i,
and the gradient of micro-batch m alone (the mean over its B/k samples) is g_m = k·c_m. Every supported layer's
parameter gradient is a sum over samples (Linear: Σ δ_i x_iᵀ; Conv2d: the same over positions; BatchNorm's scale
and shift: Σ δ_i·x̂_i and Σ δ_i), so a micro-batch's share is that sum over its own samples: computed here beside
the backward pass from the input the forward pass saw and the output gradient autograd computes, leaving the
accumulated gradients (hence training) untouched. BatchNorm in training mode is refused: its batch statistics
couple the samples (its backward centres the output gradients over the batch), so one worker's micro-batch shares
are anti-correlated rather than independent micro-batch gradients (on ResNet-20, random data, batch 32, k = 4:
S 1.6 times that from the workers' whole gradients, |G|² below 0). In evaluation mode it treats samples alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED = (nn.Linear, nn.Conv2d, nn.modules.batchnorm._BatchNorm)


class MicroBatchNorms:
    """Forward hooks that, while `active()`, add each micro-batch's squared share |c_m|² of every layer's gradient."""

    def __init__(self, model: nn.Module, micro_batches: int, active: Callable[[], bool]) -> None:
        self.micro_batches = micro_batches
        self.active = active
        self.layers = [module for module in model.modules() if _own_parameters(module)]
        unsupported = [type(module).__name__ for module in self.layers if not isinstance(module, SUPPORTED)]
        if unsupported:
            raise ValueError(
                f"micro-batch gradient norms support {', '.join(kind.__name__ for kind in SUPPORTED)}; "
                f"the model has parameters in {', '.join(sorted(set(unsupported)))}"
            )
        coupled = [type(module).__name__ for module in self.layers if _couples_samples(module)]
        if coupled:
            raise ValueError(
                f"micro-batch gradient norms need layers that treat samples independently; {coupled[0]} in "
                "training mode couples them through its batch statistics (use 1 micro-batch)"
            )
        self._squares: list[torch.Tensor] = []

    def attach(self) -> None:
        for layer in self.layers:
            layer.register_forward_hook(self._forward)

    def _forward(self, layer: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if not (self.active() and torch.is_grad_enabled()):
            return
        if output.shape[0] % self.micro_batches:
            raise ValueError(f"a batch of {output.shape[0]} does not split into {self.micro_batches} micro-batches")
        if _couples_samples(layer):
            raise ValueError(f"{type(layer).__name__} in training mode: micro-batch norms need it in eval mode")
        features = inputs[0].detach()
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            features = _normalised(layer, features)
        output.register_hook(lambda gradient: self._squares.append(self._shares(layer, features, gradient)))

    def _shares(self, layer: nn.Module, features: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        """Σ over the layer's parameters of |share of micro-batch m|², for every m: shape (k,)."""
        k = self.micro_batches
        shares = []
        if isinstance(layer, nn.Linear):
            inputs = features.reshape(k, -1, features.shape[-1])
            gradients = gradient.reshape(k, -1, gradient.shape[-1])
            shares.append(torch.bmm(gradients.transpose(1, 2), inputs))
            if layer.bias is not None:
                shares.append(gradients.sum(1))
        elif isinstance(layer, nn.Conv2d):
            shares.append(torch.stack([_conv2d_weight_gradient(layer, x, g) for x, g in _split(features, gradient, k)]))
            if layer.bias is not None:
                shares.append(gradient.reshape(k, -1, *gradient.shape[1:]).sum((1, 3, 4)))
        else:
            per_sample = gradient.flatten(2)  # (B, C, positions)
            if layer.weight is not None:
                shares.append((per_sample * features.flatten(2)).sum(2).reshape(k, -1, per_sample.shape[1]).sum(1))
            if layer.bias is not None:
                shares.append(per_sample.sum(2).reshape(k, -1, per_sample.shape[1]).sum(1))
        return cast(torch.Tensor, sum(share.flatten(1).square().sum(1) for share in shares))

    def take_small_squared(self) -> torch.Tensor:
        """mean_m |g_m|² of this step's micro-batches (g_m = k·c_m), then clear for the next step."""
        total = torch.stack(self._squares).sum(0).sum() if self._squares else torch.zeros(())
        self._squares.clear()
        return total * self.micro_batches


def _own_parameters(module: nn.Module) -> bool:
    return any(parameter.requires_grad for parameter in module.parameters(recurse=False))


def _couples_samples(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.batchnorm._BatchNorm) and (module.training or module.running_mean is None)


def _normalised(layer: nn.modules.batchnorm._BatchNorm, features: torch.Tensor) -> torch.Tensor:
    """x̂ as the layer computes it in evaluation mode, from its running statistics."""
    mean, variance = layer.running_mean, layer.running_var
    if mean is None or variance is None:
        raise ValueError("a batch norm without running statistics (track_running_stats=False) cannot be split")
    shape = [1, -1] + [1] * (features.dim() - 2)
    return (features - mean.reshape(shape)) * torch.rsqrt(variance.reshape(shape) + layer.eps)


def _split(features: torch.Tensor, gradient: torch.Tensor, k: int):
    return zip(features.chunk(k), gradient.chunk(k), strict=True)


def _conv2d_weight_gradient(layer: nn.Conv2d, features: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    if layer.padding_mode != "zeros":
        features = F.pad(features, layer._reversed_padding_repeated_twice, mode=layer.padding_mode)
        padding: Any = 0
    else:
        padding = layer.padding
    return torch.nn.grad.conv2d_weight(  # type: ignore[attr-defined]  # torch.nn.grad: in torch, not its stubs
        features, layer.weight.shape, gradient, layer.stride, padding, layer.dilation, layer.groups
    )
