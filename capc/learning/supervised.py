"""Plain supervised training on arrays, batched, on GPU when present.

Labels of shape (N,) are classes (cross-entropy); labels of shape (N, k) in
{0, 1} are multi-label targets (one sigmoid per label, binary cross-entropy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.models.inference import logits

M = TypeVar("M", bound=nn.Module)


def fit(
    model: M,
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    *,
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    device: str | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> M:
    """Train ``model`` with Adam on (N, *shape) inputs and (N,) class or (N, k) 0/1 labels;
    ``on_epoch`` hears the number of epochs done after each one (progress displays)."""
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need as many labels as inputs (>0), got {len(x)} and {len(y)}")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model.to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    multi = np.ndim(y) == 2
    loss_fn: nn.Module = nn.BCEWithLogitsLoss() if multi else nn.CrossEntropyLoss()
    xt = torch.from_numpy(np.asarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.float32 if multi else np.int64))
    for epoch in range(epochs):
        order = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), batch_size):
            idx = order[i : i + batch_size]
            if len(idx) < 2:
                continue  # BatchNorm needs two samples
            opt.zero_grad()
            loss = loss_fn(model(xt[idx].to(dev)), yt[idx].to(dev))
            loss.backward()
            opt.step()
        if on_epoch is not None:
            on_epoch(epoch + 1)
    return model.eval()


def accuracy(
    model: nn.Module,
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    *,
    current_statistics: bool = False,
    batch: int = 1024,
) -> float:
    """Top-1 accuracy for (N,) classes, per-label accuracy for (N, k) 0/1 labels.

    ``current_statistics``: BatchNorm uses the statistics of each batch of
    ``batch`` inputs (a DIET student has no real data of its own to store any).
    The inputs are then taken in a fixed shuffled order: test files are often
    sorted by class, and the statistics of a one-class batch would describe
    that class instead of the mix a deployed model sees.
    """
    if current_statistics:
        order = np.random.default_rng(0).permutation(len(x))
        x, y = x[order], np.asarray(y)[order]
    out = logits(model, x, current_statistics=current_statistics, batch=batch)
    pred = (out > 0).numpy().astype(np.int64) if np.ndim(y) == 2 else out.argmax(1).numpy()
    return float((pred == y).mean())
