"""Offline datasets: scikit-learn digits (upsampled) and disjoint partitions for hospitals."""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray
from torch.nn import functional


def digits(size: int = 28) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """scikit-learn's 1,797 8x8 digits as (N, 1, size, size) floats in [0, 1] and (N,) labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy((d.images / 16.0).astype(np.float32)[:, None])
    if size != 8:
        x = functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.numpy().astype(np.float32), d.target.astype(np.int64)


def partition(n: int, parts: int, seed: int = 0) -> list[NDArray[np.int64]]:
    """Disjoint, i.i.d. index sets covering range(n)."""
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} items into {parts} parts")
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(p).astype(np.int64) for p in np.array_split(order, parts)]
