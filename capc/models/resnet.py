"""CIFAR-style residual networks for small images (ResNet-10, ResNet-18).

A 3x3 stride-1 stem (no max-pool: 28x28 or 32x32 inputs would vanish after
a 7x7 stride-2 stem), four stages of basic blocks with ``width``, 2x, 4x and
8x channels, the last three halving the resolution, then global average
pooling. ResNet-10 has one block per stage, ResNet-18 two.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = functional.relu(self.bn1(self.conv1(x)))
        return functional.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet_features(
    channels: int, blocks: tuple[int, ...], width: int
) -> tuple[nn.Sequential, int]:
    """The convolutional body (B, channels, H, W) -> (B, 8 * width) and its output width."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    layers: list[nn.Module] = [
        nn.Conv2d(channels, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    inputs = width
    for stage, count in enumerate(blocks):
        outputs = width * 2**stage
        for b in range(count):
            layers.append(BasicBlock(inputs, outputs, 2 if stage > 0 and b == 0 else 1))
            inputs = outputs
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers), inputs


RESNET_BLOCKS = {"resnet10": (1, 1, 1, 1), "resnet18": (2, 2, 2, 2)}
