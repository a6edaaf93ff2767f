"""Architectures by name, so a checkpoint needs only its state dict, this name and a width.

Every model is a :class:`Classifier`: a ``features`` body that maps a batch
to (B, D) features and a linear ``head`` from D to the outputs. DIET
fine-tunes only the head; teachers and students share one pretrained body.

- ``small-cnn``: two conv-BN-ReLU-pool blocks, for 28x28-ish images;
- ``mlp``: two hidden layers with BatchNorm, for tabular inputs;
- ``linear``: one linear layer on the flattened inputs (logistic regression), no
  BatchNorm: what DP-SGD trains for a table task (``capc teacher fit --dp-epsilon``)
  and a hospital's logistic-regression baseline;
- ``resnet10``, ``resnet18``: CIFAR-style residual networks (capc.models.resnet);
- ``he-cnn``, ``he-mlp``: convolution / dense layers with square activations
  only, which :mod:`capc.he` evaluates on CKKS ciphertexts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from capc.models.resnet import RESNET_BLOCKS, resnet_features


class Classifier(nn.Module):
    """``head(features(x))``: (B, *input_shape) -> (B, D) -> (B, outputs)."""

    def __init__(self, features: nn.Module, dim: int, outputs: int) -> None:
        super().__init__()
        self.features = features
        self.dim = dim
        self.head = nn.Linear(dim, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # type: ignore[no-any-return]


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"{name} takes (channels, height, width) inputs, got {input_shape}")
    c, h, w = input_shape
    return c, h, w


def _small_cnn(input_shape: tuple[int, ...], width: int) -> tuple[nn.Module, int]:
    c, h, w = _image_shape("small-cnn", input_shape)
    if h < 4 or w < 4:
        raise ValueError(f"small-cnn needs images of at least 4x4, got {h}x{w}")
    body = nn.Sequential(
        nn.Conv2d(c, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    return body, 2 * width * (h // 4) * (w // 4)


def _mlp(input_shape: tuple[int, ...], width: int) -> tuple[nn.Module, int]:
    if len(input_shape) != 1:
        raise ValueError(f"mlp takes (features,) inputs, got {input_shape}")
    body = nn.Sequential(
        nn.Linear(input_shape[0], width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
    )
    return body, width


def _linear(input_shape: tuple[int, ...], width: int) -> tuple[nn.Module, int]:
    # ``width`` has no meaning here: the features are the inputs themselves.
    dim = 1
    for s in input_shape:
        dim *= int(s)
    return nn.Flatten(), dim


def _resnet(name: str) -> Callable[[tuple[int, ...], int], tuple[nn.Module, int]]:
    def make(input_shape: tuple[int, ...], width: int) -> tuple[nn.Module, int]:
        c, _, _ = _image_shape(name, input_shape)
        return resnet_features(c, RESNET_BLOCKS[name], width)

    return make


class Square(nn.Module):
    """x * x: the activation an encrypted evaluation can afford (one multiplication)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x


#: he-cnn's convolution: 4x4 kernels, stride 2, no padding (28x28 -> 13x13).
HE_KERNEL, HE_STRIDE, HE_HIDDEN = 4, 2, 64


def _he_cnn(input_shape: tuple[int, ...], width: int) -> tuple[nn.Module, int]:
    c, h, w = _image_shape("he-cnn", input_shape)
    if h < HE_KERNEL or w < HE_KERNEL:
        raise ValueError(f"he-cnn needs images of at least {HE_KERNEL}x{HE_KERNEL}, got {h}x{w}")
    oh, ow = (h - HE_KERNEL) // HE_STRIDE + 1, (w - HE_KERNEL) // HE_STRIDE + 1
    body = nn.Sequential(
        nn.Conv2d(c, width, HE_KERNEL, stride=HE_STRIDE),
        Square(),
        nn.Flatten(),
        nn.Linear(width * oh * ow, HE_HIDDEN),
        Square(),
    )
    return body, HE_HIDDEN


def _he_mlp(input_shape: tuple[int, ...], width: int) -> tuple[nn.Module, int]:
    if len(input_shape) != 1:
        raise ValueError(f"he-mlp takes (features,) inputs, got {input_shape}")
    return nn.Sequential(nn.Linear(input_shape[0], width), Square()), width


@dataclass(frozen=True)
class Architecture:
    """How to build a body, and its default width (channels or hidden units)."""

    body: Callable[[tuple[int, ...], int], tuple[nn.Module, int]]
    default_width: int
    description: str


ARCHITECTURES: dict[str, Architecture] = {
    "small-cnn": Architecture(_small_cnn, 32, "two conv-BN-ReLU-pool blocks"),
    "mlp": Architecture(_mlp, 64, "two hidden layers with BatchNorm (tabular)"),
    "linear": Architecture(_linear, 1, "one linear layer on the inputs, no BatchNorm (DP-SGD)"),
    "resnet10": Architecture(_resnet("resnet10"), 64, "CIFAR-style ResNet-10"),
    "resnet18": Architecture(_resnet("resnet18"), 64, "CIFAR-style ResNet-18"),
    "he-cnn": Architecture(_he_cnn, 5, "CryptoNets-size CNN with square activations (CKKS)"),
    "he-mlp": Architecture(_he_mlp, 32, "one hidden layer with a square activation (CKKS)"),
}


def build(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    width: int | None = None,
    *,
    seed: int | None = None,
) -> Classifier:
    """A fresh model of architecture ``name`` for inputs of ``input_shape`` (no batch axis).

    ``width``: channels of the first stage (CNNs) or hidden units (MLP); the
    architecture's default when None. ``seed``: the initial weights come from
    it alone, whatever drew from torch's global generator before (which is
    left as it was); None draws them from that generator.
    """
    try:
        arch = ARCHITECTURES[name]
    except KeyError:
        raise ValueError(
            f"unknown architecture {name!r}; known: {', '.join(sorted(ARCHITECTURES))}"
        ) from None
    if num_classes < 1:
        raise ValueError(f"a model needs at least one output, got {num_classes}")
    w = arch.default_width if width is None else int(width)
    if not 1 <= w <= 1024:
        raise ValueError(f"width must lie in [1, 1024], got {w}")
    shape = tuple(int(s) for s in input_shape)
    # the head draws its initial weights too, so it is built inside the fork
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        body, dim = arch.body(shape, w)
        return Classifier(body, dim, num_classes)
