"""Batched inference with training or current BatchNorm statistics.

Synthetic queries (noise, dead leaves, fractals) are far from the data a
model's BatchNorm statistics were collected on; normalising each batch with
its own statistics ("current statistics") maps their activations back into
the range the later layers expect. It is one switch here, and it never
touches the stored statistics, so a model's hash is the same afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


#: Inputs a CPU pass with stored statistics takes at a time (see :func:`run_batches`).
EVAL_CHUNK = 256


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
    on_batch: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """``fn`` (a part of ``model``) over ``x`` in batches of ``batch``, on the CPU afterwards.

    With ``current_statistics`` each batch of ``batch`` inputs is normalised
    with its own statistics, so ``batch`` is part of the result: pass the
    size of the batches the queries arrive in. ``on_batch`` hears the inputs done
    after each batch (progress displays).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32)) if not torch.is_tensor(x) else x
    dev = device_of(model)
    # With stored statistics each input's output is its own, so the pass may go in
    # smaller chunks: on the CPU, chunks of EVAL_CHUNK ran a ResNet body 1.7x faster than
    # 1,024 at once (caches); a batch normalised with its own statistics stays whole.
    step = batch if current_statistics or dev.type != "cpu" else min(batch, EVAL_CHUNK)
    out = []
    with statistics(model, current_statistics), torch.no_grad():
        for i in range(0, len(xt), step):
            out.append(fn(xt[i : i + step].to(dev, non_blocking=True)).float().cpu())
            if on_batch is not None:
                on_batch(min(i + step, len(xt)))
    if not out:
        raise ValueError("no inputs")
    return torch.cat(out)


def features(
    model: Classifier,
    x: NDArray[np.float32] | torch.Tensor,
    *,
    current_statistics: bool = False,
    batch: int = 1024,
    on_batch: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Penultimate features (N, D) of (N, *input_shape) inputs, float32 on the CPU;
    ``on_batch`` as in :func:`run_batches`."""
    return run_batches(
        model.features,
        model,
        x,
        current_statistics=current_statistics,
        batch=batch,
        on_batch=on_batch,
    )


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


def reference_statistics(model: nn.Module, reference: NDArray[np.float32]) -> None:
    """Store in every BatchNorm of ``model`` the statistics that the ``reference`` batch
    (R, *input_shape) sees under current statistics: afterwards, in evaluation mode,
    ``model`` normalises every input as it normalised the reference batch's own.

    A current-statistics model (a DIET student) reads each input through the
    statistics of the batch it arrives in, so what it predicts for one record
    would depend on the other records of the request, and a batch of one has no
    statistics at all. With the reference batch's statistics stored, a prediction
    is a function of its record alone, the same in a batch of 1 as in one of 256.
    ``reference`` should be unlabelled records drawn as the deployed inputs are
    (R of at least 16; the DIET paper's smallest batch); it costs no labels.

    The reference passes through in one batch, layer after layer, as in current
    statistics; each layer's variance is stored biased (what batch normalisation
    divides by in training mode), not the unbiased running estimate.
    """
    x = np.asarray(reference, dtype=np.float32)
    if len(x) < 2:
        raise ValueError(f"a reference batch needs at least 2 records, got {len(x)}")
    if not np.isfinite(x).all():
        raise ValueError("the reference batch contains NaN or infinity")
    norms = norm_layers(model)
    counts: dict[nn.Module, int] = {}

    def count(m: nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        t = inputs[0]
        counts[m] = t.numel() // t.shape[1]

    hooks = [m.register_forward_hook(count) for m in norms]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over one batch: that batch's statistics
    model.train()
    try:
        with torch.no_grad():
            model(torch.from_numpy(x).to(device_of(model)))
    finally:
        for h in hooks:
            h.remove()
        for m, momentum in zip(norms, saved, strict=True):
            m.momentum = momentum
        model.eval()
    for m in norms:
        n = counts.get(m, 0)
        if m.running_var is None or n < 2:
            raise ValueError("the reference batch did not reach every BatchNorm layer")
        with torch.no_grad():
            m.running_var.mul_((n - 1) / n)
