"""FixMatch's weak and strong augmentations, batched in torch (no torchvision).

- :func:`weak`: a random translation of up to ``shift`` of the image size
  (reflect-padded) and, where the task allows it, a horizontal flip.
- :func:`strong`: RandAugment (Cubuk et al. 2020) with a random magnitude per
  operation, as FixMatch uses it: ``ops`` operations drawn per image from
  :data:`OPERATIONS`, then Cutout of a square ``cutout`` of the image's side.

Every transform acts on a whole (B, C, H, W) batch in [0, 1]: each
operation is applied at once to the images that drew it, geometric
operations through one affine grid per slot. Draws come from the
``torch.Generator`` passed in, so a seeded run repeats exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional

Image = torch.Tensor


def _check(x: Image) -> None:
    if x.ndim != 4:
        raise ValueError(f"augmentations take (B, C, H, W) images, got shape {tuple(x.shape)}")


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=gen)


def _affine(x: Image, theta: torch.Tensor, padding: str = "zeros") -> Image:
    """Resample ``x`` through per-image (B, 2, 3) affine maps (normalised coordinates)."""
    grid = functional.affine_grid(theta.to(x), list(x.shape), align_corners=False)
    return functional.grid_sample(x, grid, align_corners=False, padding_mode=padding)


def _identity_theta(b: int) -> torch.Tensor:
    return torch.eye(2, 3).repeat(b, 1, 1)


@dataclass(frozen=True)
class WeakAugmentation:
    """Translation by up to ``shift`` of the side (a fraction) and an optional flip."""

    shift: float = 0.125
    flip: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.shift < 0.5:
            raise ValueError(f"shift is a fraction of the side in [0, 0.5), got {self.shift}")


def weak(x: Image, gen: torch.Generator, aug: WeakAugmentation | None = None) -> Image:
    """A weakly augmented view of each image of ``x`` (B, C, H, W) in [0, 1]; same shape."""
    _check(x)
    aug = aug or WeakAugmentation()
    b = x.shape[0]
    theta = _identity_theta(b)
    # Normalised coordinates span 2 units per side: a shift s of the side is 2 s.
    theta[:, :, 2] = 2.0 * aug.shift * (2.0 * torch.rand((b, 2), generator=gen) - 1.0)
    if aug.flip:
        theta[:, 0, 0] = torch.where(torch.rand(b, generator=gen) < 0.5, -1.0, 1.0)
    return _affine(x, theta, padding="reflection").clamp(0.0, 1.0)


# -- colour operations: (images, magnitude in [0, 1] per image) -> images ------------------
def _per_image(m: torch.Tensor, x: Image) -> torch.Tensor:
    return m.to(x).view(-1, *([1] * (x.ndim - 1)))


def _blend(a: Image, b: Image, factor: torch.Tensor) -> Image:
    """a + factor (b - a), per image; factor 0 gives a, 1 gives b."""
    return (a + _per_image(factor, a) * (b - a)).clamp(0.0, 1.0)


def _signed(m: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return m * torch.where(torch.rand(m.shape, generator=gen) < 0.5, -1.0, 1.0)


def _identity(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    return x


def _autocontrast(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    span = torch.where(hi - lo > 1e-6, hi - lo, torch.ones_like(hi))
    return ((x - lo) / span).clamp(0.0, 1.0)


def _brightness(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    # Enhance factor in [0.05, 1.95]: a blend with black.
    return _blend(torch.zeros_like(x), x, 1.0 + 0.95 * _signed(m, gen))


def _contrast(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    mean = x.mean(dim=(1, 2, 3), keepdim=True).expand_as(x)
    return _blend(mean, x, 1.0 + 0.95 * _signed(m, gen))


def _sharpness(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    c = x.shape[1]
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    kernel = kernel.to(x).expand(c, 1, 3, 3)
    smooth = functional.conv2d(functional.pad(x, (1, 1, 1, 1), mode="replicate"), kernel, groups=c)
    return _blend(smooth, x, 1.0 + 0.95 * _signed(m, gen))


def _posterize(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    # Keep 8 - round(4 m) bits of each 8-bit pixel value.
    bits = (8 - torch.round(4.0 * m)).to(x)
    levels = _per_image(2.0**bits, x)
    return torch.floor(x * 255.0 / (256.0 / levels)) * (256.0 / levels) / 255.0


def _solarize(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    threshold = _per_image(1.0 - m, x)
    return torch.where(x >= threshold, 1.0 - x, x)


def _equalize(x: Image, m: torch.Tensor, gen: torch.Generator) -> Image:
    # Histogram equalisation by rank: each pixel becomes its quantile within its image.
    b, c, h, w = x.shape
    flat = x.reshape(b, c, h * w)
    ranks = flat.argsort(dim=2).argsort(dim=2).to(x)
    return (ranks / max(h * w - 1, 1)).reshape(b, c, h, w)


ColourOp = Callable[[Image, torch.Tensor, torch.Generator], Image]
COLOUR: dict[str, ColourOp] = {
    "identity": _identity,
    "autocontrast": _autocontrast,
    "brightness": _brightness,
    "contrast": _contrast,
    "equalize": _equalize,
    "posterize": _posterize,
    "sharpness": _sharpness,
    "solarize": _solarize,
}


# -- geometric operations: magnitude -> a (2, 3) affine map per image ---------------------
def _rotate(m: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    angle = _signed(m, gen) * math.radians(30.0)
    theta = _identity_theta(len(m))
    theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle), -torch.sin(angle)
    theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle), torch.cos(angle)
    return theta


def _shear(axis: int) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor]:
    def make(m: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        theta = _identity_theta(len(m))
        theta[:, axis, 1 - axis] = 0.3 * _signed(m, gen)
        return theta

    return make


def _translate(axis: int) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor]:
    def make(m: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        theta = _identity_theta(len(m))
        theta[:, axis, 2] = 2.0 * 0.3 * _signed(m, gen)
        return theta

    return make


GEOMETRIC: dict[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = {
    "rotate": _rotate,
    "shear_x": _shear(0),
    "shear_y": _shear(1),
    "translate_x": _translate(0),
    "translate_y": _translate(1),
}
#: RandAugment's operations, in a fixed order (an image's draw indexes into it).
OPERATIONS: tuple[str, ...] = (*COLOUR, *GEOMETRIC)


@dataclass(frozen=True)
class StrongAugmentation:
    """RandAugment with ``ops`` operations per image at a random magnitude in
    [``min_magnitude``, 1] of each operation's range, then Cutout of a square of
    ``cutout`` times the side, filled with grey 0.5."""

    ops: int = 2
    min_magnitude: float = 0.05
    cutout: float = 0.5
    flip: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.ops <= 8:
            raise ValueError(f"ops must lie in [0, 8], got {self.ops}")
        if not 0.0 <= self.min_magnitude <= 1.0 or not 0.0 <= self.cutout < 1.0:
            raise ValueError("min_magnitude lies in [0, 1] and cutout in [0, 1)")


def cutout(x: Image, size: float, gen: torch.Generator) -> Image:
    """Each image with one square of side ``size`` (a fraction of its side) set to 0.5,
    centred anywhere in the image (it may be cut by the border)."""
    _check(x)
    b, _, h, w = x.shape
    half_h, half_w = size * h / 2.0, size * w / 2.0
    cy = torch.rand(b, generator=gen) * h
    cx = torch.rand(b, generator=gen) * w
    rows = torch.arange(h).view(1, h, 1) + 0.5
    cols = torch.arange(w).view(1, 1, w) + 0.5
    inside = ((rows - cy.view(b, 1, 1)).abs() < half_h) & ((cols - cx.view(b, 1, 1)).abs() < half_w)
    return torch.where(inside[:, None].to(x.device), torch.full_like(x, 0.5), x)


def strong(x: Image, gen: torch.Generator, aug: StrongAugmentation | None = None) -> Image:
    """A strongly augmented view of each image of ``x`` (B, C, H, W) in [0, 1]; same shape."""
    _check(x)
    aug = aug or StrongAugmentation()
    b = x.shape[0]
    y = x
    if aug.flip:
        flipped = (torch.rand(b, generator=gen) < 0.5).to(x.device)
        y = torch.where(flipped.view(b, 1, 1, 1), y.flip(3), y)
    for _ in range(aug.ops):
        choice = torch.randint(0, len(OPERATIONS), (b,), generator=gen)
        magnitude = _uniform(b, aug.min_magnitude, 1.0, gen)
        out = y.clone()
        theta = _identity_theta(b)
        moved = torch.zeros(b, dtype=torch.bool)
        for k, name in enumerate(OPERATIONS):
            rows = (choice == k).nonzero().flatten()
            if len(rows) == 0:
                continue
            if name in COLOUR:
                idx = rows.to(y.device)
                out[idx] = COLOUR[name](y[idx], magnitude[rows], gen)
            else:
                theta[rows] = GEOMETRIC[name](magnitude[rows], gen)
                moved[rows] = True
        if moved.any():
            idx = moved.nonzero().flatten()
            out[idx.to(y.device)] = _affine(out[idx.to(y.device)], theta[idx])
        y = out.clamp(0.0, 1.0)
    return cutout(y, aug.cutout, gen) if aug.cutout > 0 else y
