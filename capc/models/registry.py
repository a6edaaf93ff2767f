"""Architectures by name, so a checkpoint needs only its state dict and this name.

``small-cnn``: two conv-BN-ReLU-pool blocks and a linear head, for 28x28-ish
images. ``mlp``: two hidden layers with BatchNorm, for tabular inputs.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def _small_cnn(input_shape: tuple[int, ...], num_classes: int, width: int = 32) -> nn.Module:
    if len(input_shape) != 3:
        raise ValueError(f"small-cnn takes (channels, height, width) inputs, got {input_shape}")
    c, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(c, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * (h // 4) * (w // 4), num_classes),
    )


def _mlp(input_shape: tuple[int, ...], num_classes: int, width: int = 64) -> nn.Module:
    if len(input_shape) != 1:
        raise ValueError(f"mlp takes (features,) inputs, got {input_shape}")
    return nn.Sequential(
        nn.Linear(input_shape[0], width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Linear(width, num_classes),
    )


ARCHITECTURES: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "small-cnn": _small_cnn,
    "mlp": _mlp,
}


def build(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A fresh model of architecture ``name`` for inputs of ``input_shape`` (no batch axis)."""
    try:
        factory = ARCHITECTURES[name]
    except KeyError:
        raise ValueError(
            f"unknown architecture {name!r}; known: {', '.join(sorted(ARCHITECTURES))}"
        ) from None
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    return factory(tuple(input_shape), num_classes)
