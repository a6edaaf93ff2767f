"""Batched image augmentations for contrastive pretraining, in torch.

Every transform acts on a whole (B, C, H, W) batch at once: one affine grid
and one ``grid_sample`` for crop, scale, rotation and flip, then per-image
brightness and contrast, occasional inversion and noise. Random draws come
from the ``torch.Generator`` passed in, so a seeded run repeats exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional


@dataclass(frozen=True)
class Augmentation:
    """Strengths of the random transforms (fractions of the image, radians, factors)."""

    min_scale: float = 0.3
    max_rotation: float = 0.3
    contrast: float = 0.4
    brightness: float = 0.2
    invert: float = 0.0
    noise: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.min_scale <= 1.0:
            raise ValueError(f"min_scale must lie in (0, 1], got {self.min_scale}")
        if not 0.0 <= self.invert <= 1.0:
            raise ValueError(f"invert is a probability, got {self.invert}")


def _uniform(shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen)


def augment(x: torch.Tensor, gen: torch.Generator, aug: Augmentation | None = None) -> torch.Tensor:
    """A random view of each image of ``x`` (B, C, H, W) in [0, 1]; same shape, in [0, 1]."""
    if x.ndim != 4:
        raise ValueError(f"augment takes (B, C, H, W) images, got shape {tuple(x.shape)}")
    aug = aug or Augmentation()
    b = x.shape[0]
    scale = _uniform((b,), aug.min_scale, 1.0, gen)
    angle = _uniform((b,), -aug.max_rotation, aug.max_rotation, gen)
    shift = (1.0 - scale)[:, None] * _uniform((b, 2), -1.0, 1.0, gen)
    flip = torch.where(torch.rand(b, generator=gen) < 0.5, -1.0, 1.0)
    cos, sin = torch.cos(angle) * scale, torch.sin(angle) * scale
    theta = torch.stack(
        [
            torch.stack([cos * flip, -sin, shift[:, 0]], dim=1),
            torch.stack([sin * flip, cos, shift[:, 1]], dim=1),
        ],
        dim=1,
    ).to(x)
    grid = functional.affine_grid(theta, list(x.shape), align_corners=False)
    y = functional.grid_sample(x, grid, align_corners=False, padding_mode="zeros")
    gain = _uniform((b, 1, 1, 1), 1.0 - aug.contrast, 1.0 + aug.contrast, gen).to(x)
    offset = _uniform((b, 1, 1, 1), -aug.brightness, aug.brightness, gen).to(x)
    mean = y.mean(dim=(1, 2, 3), keepdim=True)
    y = (y - mean) * gain + mean + offset
    flipped = (torch.rand((b, 1, 1, 1), generator=gen) < aug.invert).to(x.device)
    y = torch.where(flipped, 1.0 - y, y)
    noisy = (torch.rand((b, 1, 1, 1), generator=gen) < 0.5).to(x)
    y = y + aug.noise * noisy * torch.randn(y.shape, generator=gen).to(x)
    return y.clamp(0.0, 1.0)
