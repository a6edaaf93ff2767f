"""Fine-tuning only the last layer on top of a frozen, shared body.

The features of every input are computed once (the body is frozen), then
the linear head is fitted by L-BFGS on standardised features with an L2
penalty: a convex problem, so the result does not depend on a learning
rate or an epoch count, and a hospital with 60 images fits in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional

from capc.models.heads import BatchStandardiser
from capc.models.inference import features, recalibrate
from capc.models.registry import Classifier


def _checked(
    feats: torch.Tensor, labels: NDArray[np.integer] | torch.Tensor, outputs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    f = torch.as_tensor(feats, dtype=torch.float32).cpu()
    y = torch.as_tensor(np.asarray(labels)).cpu()
    if f.ndim != 2 or len(f) != len(y) or len(f) == 0:
        raise ValueError(
            f"need (N, D) features with one label each (N > 0), got {tuple(f.shape)} and {tuple(y.shape)}"
        )
    if not torch.isfinite(f).all():
        raise ValueError("features contain NaN or infinity")
    if y.ndim == 2 and y.shape[1] != outputs:
        raise ValueError(f"labels have {y.shape[1]} columns, the layer {outputs} outputs")
    if y.ndim == 1 and (y.min() < 0 or y.max() >= outputs):
        raise ValueError(
            f"class labels must lie in [0, {outputs}), got {int(y.min())}..{int(y.max())}"
        )
    return f, y


def _fit_standardised(
    z: torch.Tensor, y: torch.Tensor, outputs: int, l2: float, max_iter: int, balanced: bool
) -> nn.Linear:
    """The penalised linear layer on (N, D) standardised features ``z`` (L-BFGS from zero)."""
    multi = y.ndim == 2
    layer = nn.Linear(z.shape[1], outputs)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    opt = torch.optim.LBFGS(
        layer.parameters(),
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    target = y.float() if multi else y.long()
    class_weight = None
    if balanced and not multi:
        counts = torch.bincount(target, minlength=outputs).float()
        class_weight = torch.where(
            counts > 0, counts.sum() / (outputs * counts.clamp_min(1.0)), torch.zeros_like(counts)
        )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        out = layer(z)
        loss = (
            functional.binary_cross_entropy_with_logits(out, target)
            if multi
            else functional.cross_entropy(out, target, weight=class_weight)
        )
        loss = loss + l2 * layer.weight.pow(2).sum()
        torch.autograd.backward(loss)
        return loss

    opt.step(closure)  # type: ignore[no-untyped-call]
    return layer


def fit_linear(
    feats: torch.Tensor,
    labels: NDArray[np.integer] | torch.Tensor,
    outputs: int,
    *,
    l2: float = 1e-3,
    max_iter: int = 200,
    balanced: bool = False,
) -> nn.Linear:
    """A linear layer D -> ``outputs`` fitted to (N, D) features.

    ``labels``: (N,) classes (softmax cross-entropy) or (N, k) 0/1 labels
    (one sigmoid per label). ``l2``: penalty on the weights of the
    standardised features (per unit of mean loss, nats). ``balanced``:
    weight each class by the inverse of its frequency, so a class the
    consortium answered often does not swamp the rest (single-label only).
    """
    f, y = _checked(feats, labels, outputs)
    mean = f.mean(0)
    std = f.std(0, unbiased=False).clamp_min(1e-6)
    layer = _fit_standardised((f - mean) / std, y, outputs, l2, max_iter, balanced)
    weight, bias = _folded(layer.weight, layer.bias, mean, std)
    folded = nn.Linear(f.shape[1], outputs)
    with torch.no_grad():
        folded.weight.copy_(weight)
        folded.bias.copy_(bias)
    return folded


def _folded(
    weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor, std: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer on standardised features, (..., O, D) ``weight`` and (..., O) ``bias``, as
    the layer that takes the raw features of (..., 1, D) or (D,) ``mean`` and ``std``."""
    with torch.no_grad():
        return (weight / std).detach(), (bias - (weight * (mean / std)).sum(-1)).detach()


def fit_linear_many(
    feats: Sequence[torch.Tensor],
    labels: Sequence[NDArray[np.integer] | torch.Tensor],
    outputs: int,
    *,
    l2: float = 1e-3,
    max_iter: int = 1000,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fit_linear` for T independent problems at once: the layers fitted to each
    (N_t, D) features and their labels, as (T, ``outputs``, D) weights and (T, ``outputs``)
    biases that take raw features.

    The T penalised objectives share no parameter, so their sum has each one's minimiser,
    and one L-BFGS run over the sum replaces T runs. On a hospital's teachers (40 parts of
    25 records, 256 features) that is 4x less CPU: a run's cost is its per-step overhead,
    not the arithmetic. ``max_iter`` bounds the joint run, which needs more steps than one
    problem alone (280 for those 40); it stops earlier once the sum converges.
    """
    if len(feats) != len(labels) or not feats:
        raise ValueError(f"need one label set per feature set, got {len(feats)} and {len(labels)}")
    checked = [_checked(f, y, outputs) for f, y in zip(feats, labels, strict=True)]
    count, longest, width = len(checked), max(len(f) for f, _ in checked), checked[0][0].shape[1]
    multi = checked[0][1].ndim == 2
    if any(f.shape[1] != width or (y.ndim == 2) != multi for f, y in checked):
        raise ValueError("every feature set needs the same width and the same kind of labels")
    mean = torch.stack([f.mean(0) for f, _ in checked])
    std = torch.stack([f.std(0, unbiased=False).clamp_min(1e-6) for f, _ in checked])
    # Padded to the longest part; a padded row weighs nothing.
    z = torch.zeros(count, longest, width)
    target = torch.zeros((count, longest, outputs) if multi else (count, longest))
    weight = torch.zeros(count, longest)
    for t, (f, y) in enumerate(checked):
        z[t, : len(f)] = (f - mean[t]) / std[t]
        target[t, : len(f)] = y.float()
        weight[t, : len(f)] = 1.0 / len(f)
    classes = target.long()
    w = torch.zeros(count, outputs, width, requires_grad=True)
    b = torch.zeros(count, outputs, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        out = torch.baddbmm(b[:, None, :], z, w.transpose(1, 2))
        if multi:
            each = functional.binary_cross_entropy_with_logits(out, target, reduction="none").mean(
                -1
            )
        else:
            each = functional.cross_entropy(
                out.reshape(-1, outputs), classes.reshape(-1), reduction="none"
            ).reshape(count, longest)
        loss = (each * weight).sum() + l2 * w.pow(2).sum()
        torch.autograd.backward(loss)
        return loss

    opt.step(closure)  # type: ignore[no-untyped-call]
    return _folded(w, b, mean[:, None, :], std[:, None, :])


def fit_batch_standardised(
    feats: torch.Tensor,
    labels: NDArray[np.integer] | torch.Tensor,
    outputs: int,
    *,
    l2: float = 1e-3,
    max_iter: int = 200,
    balanced: bool = False,
) -> nn.Sequential:
    """:func:`fit_linear`'s layer with its standardisation kept as a BatchNorm layer:
    :func:`capc.models.heads.standardised_head` fitted to (N, D) features.

    The standardiser stores the mean and (biased) variance of ``feats``. In
    evaluation mode the head is :func:`fit_linear`'s (up to BatchNorm's 1e-5
    added to the variance); under current statistics
    (:func:`capc.models.inference.statistics`) each batch is standardised by its
    own mean and variance. A student fitted on synthetic queries and used on
    real images needs that: the body's current statistics undo most of the
    shift between the two kinds of input, this undoes what is left in the
    features themselves. It uses nothing but the batch being predicted, so it
    costs no privacy.
    """
    f, y = _checked(feats, labels, outputs)
    norm = BatchStandardiser(f.shape[1]).eval()
    with torch.no_grad():
        norm.running_mean = f.mean(0)
        norm.running_var = f.var(0, unbiased=False)
        z = norm(f)
    return nn.Sequential(norm, _fit_standardised(z, y, outputs, l2, max_iter, balanced))


def finetune_last_layer(
    model: Classifier,
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    *,
    current_statistics: bool = False,
    batch: int = 512,
    l2: float = 1e-3,
    balanced: bool = False,
) -> Classifier:
    """Replace ``model.head`` by one fitted on (N, *input_shape) ``x`` and (N,) or (N, k) ``y``.

    The body is not changed. ``current_statistics``: features of each batch
    of ``batch`` inputs use that batch's own BatchNorm statistics (a student
    learning from synthetic query batches); otherwise the stored statistics.
    """
    f = features(model, x, current_statistics=current_statistics, batch=batch)
    head = fit_linear(f, y, model.head.out_features, l2=l2, balanced=balanced)
    model.head = head.to(next(model.parameters()).device)
    return model


def finetune_teacher(
    model: Classifier,
    x: NDArray[np.float32],
    y: NDArray[np.integer],
    *,
    l2: float = 1e-3,
) -> Classifier:
    """A hospital's teacher from a pretrained body: BatchNorm statistics of its own data
    ``x`` (the "original statistics"), then a head fitted on its labels ``y``."""
    recalibrate(model, x)
    return finetune_last_layer(model, x, y, current_statistics=False, l2=l2)
