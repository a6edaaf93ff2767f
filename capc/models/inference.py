"""Batched inference with training or current BatchNorm statistics.

Synthetic queries (noise, dead leaves, fractals) are far from the data a
model's BatchNorm statistics were collected on; normalising each batch with
its own statistics ("current statistics") maps their activations back into
the range the later layers expect. It is one switch here, and it never
touches the stored statistics, so a model's hash is the same afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.models.registry import Classifier


def norm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """Every BatchNorm layer of ``model``."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


@contextmanager
def statistics(model: nn.Module, current: bool) -> Iterator[nn.Module]:
    """``model`` in evaluation mode; with ``current``, BatchNorm uses each batch's own
    mean and variance and leaves the stored ones (and their counters) untouched."""
    norms = norm_layers(model)
    model.eval()
    if current:
        for m in norms:
            m.train()
            m.track_running_stats = False
    try:
        yield model
    finally:
        for m in norms:
            m.track_running_stats = True
        model.eval()


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters live."""
    return next(model.parameters()).device


def run_batches(
    fn: nn.Module,
    model: nn.Module,
    x: NDArray[np.float32] | torch.Tensor,
    *,
    current_statistics: bool = False,
    batch: int = 1024,
) -> torch.Tensor:
    """``fn`` (a part of ``model``) over ``x`` in batches of ``batch``, on the CPU afterwards.

    With ``current_statistics`` each batch of ``batch`` inputs is normalised
    with its own statistics, so ``batch`` is part of the result: pass the
    size of the batches the queries arrive in.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32)) if not torch.is_tensor(x) else x
    dev = device_of(model)
    out = []
    with statistics(model, current_statistics), torch.no_grad():
        for i in range(0, len(xt), batch):
            out.append(fn(xt[i : i + batch].to(dev, non_blocking=True)).float().cpu())
    if not out:
        raise ValueError("no inputs")
    return torch.cat(out)


def features(
    model: Classifier,
    x: NDArray[np.float32] | torch.Tensor,
    *,
    current_statistics: bool = False,
    batch: int = 1024,
) -> torch.Tensor:
    """Penultimate features (N, D) of (N, *input_shape) inputs, float32 on the CPU."""
    return run_batches(model.features, model, x, current_statistics=current_statistics, batch=batch)


def logits(
    model: nn.Module,
    x: NDArray[np.float32] | torch.Tensor,
    *,
    current_statistics: bool = False,
    batch: int = 1024,
) -> torch.Tensor:
    """Model outputs (N, outputs) of (N, *input_shape) inputs, float32 on the CPU."""
    return run_batches(model, model, x, current_statistics=current_statistics, batch=batch)


def recalibrate(model: nn.Module, x: NDArray[np.float32], batch: int = 256) -> None:
    """Replace every BatchNorm's stored statistics by those of ``x`` (N, *input_shape).

    A teacher whose body was pretrained on synthetic images gets the
    statistics of its hospital's own data this way; nothing but the
    statistics changes. ``momentum=None`` makes them exact averages over the
    batches rather than an exponential mix with the old ones.
    """
    norms = norm_layers(model)
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    dev = device_of(model)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    model.train()
    try:
        with torch.no_grad():
            for i in range(0, len(xt), batch):
                chunk = xt[i : i + batch]
                if len(chunk) > 1:  # BatchNorm needs two samples
                    model(chunk.to(dev))
    finally:
        for m, momentum in zip(norms, saved, strict=True):
            m.momentum = momentum
        model.eval()
