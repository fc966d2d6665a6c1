"""The benchmark models in Keras (TensorFlow framework): the same architectures as models.py.

ResNet-50 and MobileNetV2 are keras.applications' (same layers as torchvision's); the CIFAR ResNets are He et al.
(2016) §4.2, built here. Imported only by TensorFlow ranks.
"""

from __future__ import annotations

import keras
from keras import layers

from ddlrepro.rank.models import MODELS


def _conv_bn(x: keras.KerasTensor, filters: int, stride: int = 1) -> keras.KerasTensor:
    x = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    return layers.BatchNormalization()(x)


def cifar_resnet(depth: int, side: int, classes: int) -> keras.Model:
    """ResNet-(6n+2) for 32×32 images: three stages of n basic blocks, 16/32/64 channels."""
    blocks = (depth - 2) // 6
    inputs = keras.Input((side, side, 3))
    x = layers.ReLU()(_conv_bn(inputs, 16))
    for stage, filters in enumerate((16, 32, 64)):
        for index in range(blocks):
            stride = 2 if stage > 0 and index == 0 else 1
            shortcut = x
            y = layers.ReLU()(_conv_bn(x, filters, stride))
            y = _conv_bn(y, filters)
            if stride != 1 or shortcut.shape[-1] != filters:
                shortcut = layers.BatchNormalization()(
                    layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
                )
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(classes)(x), name=f"resnet{depth}")


def build_keras_model(name: str, image_size: int | None = None) -> keras.Model:
    """The Keras model `name` (logits output) for square images of `image_size` (default: the model's)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; valid models: {', '.join(sorted(MODELS))}")
    info = MODELS[name]
    side = image_size or info.image_size
    shape = (side, side, 3)
    if name == "resnet50":
        return keras.applications.ResNet50(
            weights=None, input_shape=shape, classes=info.num_classes, classifier_activation=None
        )
    if name == "mobilenet_v2":
        return keras.applications.MobileNetV2(
            weights=None, input_shape=shape, classes=info.num_classes, classifier_activation=None
        )
    if not name.startswith("resnet"):
        raise KeyError(f"model {name!r} has no Keras version; Keras models: mobilenet_v2, resnet20, resnet50, resnet56")
    return cifar_resnet(int(name.removeprefix("resnet")), side, info.num_classes)
