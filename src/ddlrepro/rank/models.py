"""Models of the benchmarks, defined here because torchvision does not import beside torch 2.13.

The ImageNet models follow torchvision's definitions layer for layer (same parameter counts: ResNet-50
25,557,032; MobileNetV2 3,504,872). The CIFAR ResNets are He et al. (2016) §4.2: depth 6n+2, 16/32/64 channels.
The span encoders take token ids: `bert_base` is BERT-base's encoder (Devlin et al. 2019: 12 layers, hidden 768,
12 heads, FFN 3072, vocabulary 30522, 512 positions) with SQuAD's span head, BertForQuestionAnswering's
108,893,186 parameters; `bert_tiny` the same shape family, small enough for smoke runs on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TokenShape:
    """The input of a model that reads token ids: their vocabulary and the sequence length of its samples."""

    vocab_size: int
    sequence_length: int


@dataclass(frozen=True)
class ModelInfo:
    """What a model expects as input and how it is built; `tokens` is set for models that read token ids (their
    labels are span start and end positions, so `num_classes` is the sequence length)."""

    build: Callable[[int], nn.Module]
    image_size: int
    num_classes: int
    channels: int = 3
    tokens: TokenShape | None = None


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            *_conv_bn(cin, width, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(width, cout, 1),
        )
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        layers: list[nn.Module] = []
        cin = 64
        for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for index in range(blocks):
                layers.append(Bottleneck(cin, width, stride if index == 0 else 1))
                cin = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [*_conv_bn(cin, hidden, 1), nn.ReLU6(inplace=True)]
        layers += [*_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(inplace=True)]
        layers += _conv_bn(hidden, cout, 1)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.ReLU6(inplace=True)]
        cin = 32
        for expand, cout, repeats, stride in [*self.SETTINGS, (6, 320, 1, 1)]:
            for index in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if index == 0 else 1, expand))
                cin = cout
        layers += [*_conv_bn(cin, 1280, 1), nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, cout, 3, stride), nn.ReLU(inplace=True), *_conv_bn(cout, cout, 3))
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, depth: int, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        blocks = (depth - 2) // 6
        layers: list[nn.Module] = [*_conv_bn(3, 16, 3), nn.ReLU(inplace=True)]
        cin = 16
        for cout, stride in [(16, 1), (32, 2), (64, 2)]:
            for index in range(blocks):
                layers.append(BasicBlock(cin, cout, stride if index == 0 else 1))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SmallNet(nn.Module):
    """Two conv-BatchNorm layers and dropout before the classifier: the smallest model with both kinds of per-worker
    state EasyScale must carry (BatchNorm buffers, the dropout RNG), for the consistency tests."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn(3, 8, 3), nn.ReLU(inplace=True), *_conv_bn(8, 16, 3, 2), nn.ReLU(inplace=True)
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsNet(nn.Module):
    """A small CNN for scikit-learn's 8×8 grey-scale digits (KungFu Fig 4 at smoke scale): two convolutions with
    biases, global pooling and a linear classifier. No normalisation layer: BatchNorm's batch statistics couple the
    samples, which rules out the micro-batch gradient norms Fig 4's noise scale is measured from."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(inplace=True)
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SpanEncoder(nn.Module):
    """A BERT-shaped encoder (token, position and segment embeddings, post-norm GELU layers) with a span head: per
    position a start and an end logit, shaped (batch, positions, 2) so that cross-entropy against (batch, 2) labels
    is SQuAD's loss, the mean of the start and end losses."""

    def __init__(self, tokens: TokenShape, layers: int, hidden: int, heads: int, ffn: int, positions: int) -> None:
        super().__init__()
        self.token = nn.Embedding(tokens.vocab_size, hidden)
        self.position = nn.Embedding(positions, hidden)
        self.segment = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(hidden, heads, ffn, 0.1, "gelu", 1e-12, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.span = nn.Linear(hidden, 2)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        embedded = self.token(token_ids) + self.position(positions) + self.segment(torch.zeros_like(token_ids))
        return self.span(self.encoder(self.dropout(self.norm(embedded))))


BERT_BASE_TOKENS = TokenShape(vocab_size=30522, sequence_length=384)
BERT_TINY_TOKENS = TokenShape(vocab_size=2048, sequence_length=128)

MODELS: dict[str, ModelInfo] = {
    "resnet50": ModelInfo(ResNet50, image_size=224, num_classes=1000),
    "mobilenet_v2": ModelInfo(MobileNetV2, image_size=224, num_classes=1000),
    "resnet20": ModelInfo(lambda classes: CifarResNet(20, classes), image_size=32, num_classes=10),
    "resnet56": ModelInfo(lambda classes: CifarResNet(56, classes), image_size=32, num_classes=10),
    "smallnet": ModelInfo(SmallNet, image_size=16, num_classes=10),
    "digitsnet": ModelInfo(DigitsNet, image_size=8, num_classes=10, channels=1),
    "bert_base": ModelInfo(
        lambda _: SpanEncoder(BERT_BASE_TOKENS, layers=12, hidden=768, heads=12, ffn=3072, positions=512),
        image_size=0,
        num_classes=BERT_BASE_TOKENS.sequence_length,
        tokens=BERT_BASE_TOKENS,
    ),
    "bert_tiny": ModelInfo(
        lambda _: SpanEncoder(BERT_TINY_TOKENS, layers=2, hidden=128, heads=2, ffn=512, positions=128),
        image_size=0,
        num_classes=BERT_TINY_TOKENS.sequence_length,
        tokens=BERT_TINY_TOKENS,
    ),
}


def build_model(name: str, num_classes: int | None = None) -> nn.Module:
    """Build a model by name; `num_classes` defaults to the model's data set."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; valid models: {', '.join(sorted(MODELS))}")
    info = MODELS[name]
    return info.build(num_classes or info.num_classes)
