"""FixMatch (Sohn et al. 2020): semi-supervised learning from few labels and a pool.

The loss of a step is the cross-entropy on a batch of weakly augmented
labelled examples, plus ``unlabelled_weight`` times the cross-entropy of the
model on *strongly* augmented unlabelled images against its own hard
prediction on a *weakly* augmented view of the same images, counted only
where that prediction's confidence reaches ``threshold`` (pseudo-labels).
Augmentations: :mod:`capc.learning.randaugment`.

Two trainers share that loss:

- :func:`train` trains a whole model on images (the student party's
  semi-supervised option);
- :func:`fit_heads` trains many linear heads at once over a frozen body,
  on the features of augmented views computed once (:class:`ViewBank`):
  PATE-FM's hundreds of teachers fit a few CPU minutes that way (their votes:
  :func:`capc.models.ensemble.head_predictions`).

Labels may be hard (N,) classes or soft (N, C) distributions (ALIBI's
posteriors). Units: learning rates per step; ``threshold`` a probability.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional

from capc.learning.randaugment import StrongAugmentation, WeakAugmentation, strong, weak
from capc.models.inference import device_of, statistics


@dataclass(frozen=True)
class FixMatchConfig:
    """``steps`` SGD steps (Nesterov momentum, cosine decay from ``lr``) of ``batch`` labelled
    and ``unlabelled_ratio`` x ``batch`` unlabelled images; pseudo-labels need confidence
    ``threshold``; the unlabelled loss is weighted ``unlabelled_weight``."""

    steps: int = 300
    batch: int = 32
    unlabelled_ratio: int = 4
    threshold: float = 0.95
    unlabelled_weight: float = 1.0
    lr: float = 0.03
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    weak: WeakAugmentation = field(default_factory=WeakAugmentation)
    strong: StrongAugmentation = field(default_factory=StrongAugmentation)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.unlabelled_ratio < 0:
            raise ValueError("FixMatch needs steps >= 1, batch >= 1 and unlabelled_ratio >= 0")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold is a probability in (0, 1], got {self.threshold}")
        if not (self.lr > 0 and self.unlabelled_weight >= 0 and self.weight_decay >= 0):
            raise ValueError("lr must be positive; unlabelled_weight and weight_decay >= 0")


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy (nats) of (N, C) ``logits`` against (N,) classes or (N, C)
    probability rows."""
    if targets.ndim == 1:
        return functional.cross_entropy(logits, targets.long(), reduction="none")
    return -(targets * functional.log_softmax(logits, dim=-1)).sum(dim=-1)


def fixmatch_loss(
    logits_labelled: torch.Tensor,
    targets: torch.Tensor,
    logits_weak: torch.Tensor,
    logits_strong: torch.Tensor,
    threshold: float,
    unlabelled_weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, fraction of unlabelled images that got a pseudo-label).

    ``logits_weak`` and ``logits_strong`` (M, C) are the two views of the same
    M unlabelled images; the pseudo-label comes from the weak view without a
    gradient."""
    supervised = soft_cross_entropy(logits_labelled, targets).mean()
    if logits_weak.shape[0] == 0:
        return supervised, torch.zeros(())
    with torch.no_grad():
        confidence, pseudo = functional.softmax(logits_weak, dim=-1).max(dim=-1)
        mask = (confidence >= threshold).to(logits_strong.dtype)
    unsupervised = (functional.cross_entropy(logits_strong, pseudo, reduction="none") * mask).mean()
    return supervised + unlabelled_weight * unsupervised, mask.mean()


def _cosine(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    # FixMatch's schedule: cos(7 pi k / (16 K)), which ends at about a fifth of the peak.
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: math.cos(7.0 * math.pi * k / (16.0 * steps))
    )


def _sgd(params: Sequence[torch.Tensor], config: FixMatchConfig) -> torch.optim.SGD:
    return torch.optim.SGD(
        params,
        lr=config.lr,
        momentum=config.momentum,
        nesterov=True,
        weight_decay=config.weight_decay,
    )


@dataclass(frozen=True)
class FixMatchStats:
    """Per step: the loss (nats) and the fraction of unlabelled images pseudo-labelled."""

    losses: list[float]
    mask_rates: list[float]


def train_fixmatch(
    model: nn.Module,
    x_labelled: NDArray[np.float32],
    y_labelled: NDArray[np.integer] | NDArray[np.floating],
    x_unlabelled: NDArray[np.float32],
    config: FixMatchConfig = FixMatchConfig(),
    log: Callable[[str], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> FixMatchStats:
    """Train ``model`` in place by FixMatch on (N, C, H, W) images in [0, 1].

    ``y_labelled``: (N,) classes or (N, K) soft labels. ``x_unlabelled`` (M, C,
    H, W) may include the labelled images (in label-DP every training image is
    unlabelled data as well). The model ends in evaluation mode. ``on_step`` hears the
    steps done after each one (progress displays).
    """
    if len(x_labelled) == 0 or len(x_labelled) != len(y_labelled):
        raise ValueError(
            f"need at least one labelled image and one label each, got {len(x_labelled)} "
            f"images and {len(y_labelled)} labels"
        )
    if x_labelled.ndim != 4 or (
        len(x_unlabelled) and x_unlabelled.shape[1:] != x_labelled.shape[1:]
    ):
        raise ValueError("labelled and unlabelled images must be (N, C, H, W) of one shape")
    dev = device_of(model)
    gen = torch.Generator().manual_seed(config.seed)
    xl = torch.from_numpy(np.ascontiguousarray(x_labelled, dtype=np.float32))
    yl = torch.from_numpy(np.asarray(y_labelled))
    yl = yl.float() if yl.ndim == 2 else yl.long()
    xu = torch.from_numpy(np.ascontiguousarray(x_unlabelled, dtype=np.float32))
    opt = _sgd(list(model.parameters()), config)
    schedule = _cosine(opt, config.steps)
    losses: list[float] = []
    rates: list[float] = []
    model.train()
    try:
        for step in range(config.steps):
            li = torch.randint(0, len(xl), (min(config.batch, len(xl)),), generator=gen)
            n_u = config.batch * config.unlabelled_ratio if len(xu) else 0
            ui = torch.randint(0, max(len(xu), 1), (n_u,), generator=gen)
            views = [weak(xl[li], gen, config.weak)]
            if n_u:
                views += [weak(xu[ui], gen, config.weak), strong(xu[ui], gen, config.strong)]
            # One forward pass over all three batches: BatchNorm sees them together.
            logits = model(torch.cat(views).to(dev))
            n_l = len(li)
            loss, rate = fixmatch_loss(
                logits[:n_l],
                yl[li].to(dev),
                logits[n_l : n_l + n_u],
                logits[n_l + n_u :],
                config.threshold,
                config.unlabelled_weight,
            )
            opt.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            opt.step()
            schedule.step()
            losses.append(float(loss.detach()))
            rates.append(float(rate))
            if on_step is not None:
                on_step(step + 1)
            if log is not None and (step % 100 == 0 or step == config.steps - 1):
                log(
                    f"fixmatch step {step + 1}/{config.steps}: loss {losses[-1]:.3f}, "
                    f"pseudo-labelled {rates[-1]:.0%}"
                )
    finally:
        model.eval()
    return FixMatchStats(losses, rates)


# -- many linear heads over a frozen body ---------------------------------------------------
@dataclass(frozen=True)
class ViewBank:
    """Features of augmented views of an image pool, computed once through a frozen body.

    ``clean`` (N, D): the unaugmented images; ``weak`` (N, Vw, D) and ``strong``
    (N, Vs, D): Vw weak and Vs strong views of each. Features are projected and
    standardised (see :func:`view_bank`), so a linear head needs no bias scale.
    """

    clean: torch.Tensor
    weak: torch.Tensor
    strong: torch.Tensor

    def __len__(self) -> int:
        return int(self.clean.shape[0])

    @property
    def dim(self) -> int:
        return int(self.clean.shape[1])


class Projection(nn.Module):
    """(x - mean) @ components.T / scale: a fixed linear map of body features (D -> P)."""

    mean: torch.Tensor
    components: torch.Tensor
    scale: torch.Tensor

    def __init__(self, mean: torch.Tensor, components: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.detach().clone())
        self.register_buffer("components", components.detach().clone())
        self.register_buffer("scale", scale.detach().clone())

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return (f - self.mean) @ self.components.T / self.scale


class ProjectedClassifier(nn.Module):
    """``head(projection(body(x)))``: a frozen body, a fixed projection and a linear head."""

    def __init__(self, body: nn.Module, projection: Projection, head: nn.Linear) -> None:
        super().__init__()
        self.body = body
        self.projection = projection
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.projection(self.body(x)))  # type: ignore[no-any-return]


def _features(body: nn.Module, x: torch.Tensor, batch: int = 512) -> torch.Tensor:
    dev = device_of(body)
    with torch.no_grad(), statistics(body, current=False):
        return torch.cat(
            [body(x[i : i + batch].to(dev)).float().cpu() for i in range(0, len(x), batch)]
        )


def view_bank(
    body: nn.Module,
    images: NDArray[np.float32],
    *,
    weak_views: int = 2,
    strong_views: int = 2,
    dim: int = 128,
    seed: int = 0,
    weak_aug: WeakAugmentation | None = None,
    strong_aug: StrongAugmentation | None = None,
) -> tuple[ViewBank, Projection]:
    """Features of ``images`` (N, C, H, W) and of their augmented views through the frozen
    ``body`` (a module mapping images to (N, D') features), projected on their first
    ``dim`` principal components (fitted on the clean images) and whitened.

    Returns the bank and the projection (to apply the heads to new images).
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    clean = _features(body, x)
    mean = clean.mean(dim=0)
    centred = clean - mean
    k = min(dim, centred.shape[0], centred.shape[1])
    _, s, v = torch.linalg.svd(centred, full_matrices=False)
    components = v[:k]
    scale = (s[:k] / math.sqrt(max(len(clean) - 1, 1))).clamp_min(1e-6)
    proj = Projection(mean, components, scale)
    with torch.no_grad():
        w = [proj(_features(body, weak(x, gen, weak_aug))) for _ in range(weak_views)]
        st = [proj(_features(body, strong(x, gen, strong_aug))) for _ in range(strong_views)]
        bank = ViewBank(proj(clean), torch.stack(w, dim=1), torch.stack(st, dim=1))
    return bank, proj


def _pick_views(views: torch.Tensor, rows: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One random view of each row: (len(rows), D) from (N, V, D)."""
    which = torch.randint(0, views.shape[1], (len(rows),), generator=gen)
    return views[rows, which]


def fit_heads(
    bank: ViewBank,
    index: Sequence[NDArray[np.int64]],
    labels: Sequence[NDArray[np.integer]],
    classes: int,
    config: FixMatchConfig = FixMatchConfig(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """FixMatch for T linear heads at once: head t learns from the pool images ``index[t]``
    labelled ``labels[t]`` (classes), and from the whole pool unlabelled.

    Every step takes each head's whole labelled set (a random weak view of each image)
    and one shared batch of ``batch x unlabelled_ratio`` pool images. Returns the
    weights (T, classes, D) and biases (T, classes).
    """
    if len(index) != len(labels) or not index:
        raise ValueError("need one index set and one label set per head, at least one head")
    t = len(index)
    sizes = [len(i) for i in index]
    if min(sizes) < 1:
        raise ValueError("every head needs at least one labelled example")
    for i, y in zip(index, labels, strict=True):
        if len(i) != len(y):
            raise ValueError("each head needs one label per labelled index")
        if len(y) and (np.min(y) < 0 or np.max(y) >= classes):
            raise ValueError(f"labels must lie in [0, {classes})")
    n_max = max(sizes)
    rows = torch.zeros((t, n_max), dtype=torch.long)
    targets = torch.zeros((t, n_max), dtype=torch.long)
    present = torch.zeros((t, n_max))
    for h, (i, y) in enumerate(zip(index, labels, strict=True)):
        rows[h, : len(i)] = torch.from_numpy(np.asarray(i, dtype=np.int64))
        targets[h, : len(y)] = torch.from_numpy(np.asarray(y, dtype=np.int64))
        present[h, : len(i)] = 1.0
    gen = torch.Generator().manual_seed(config.seed)
    weights = torch.zeros((t, classes, bank.dim), requires_grad=True)
    biases = torch.zeros((t, classes), requires_grad=True)
    opt = _sgd([weights, biases], config)
    schedule = _cosine(opt, config.steps)
    n_u = config.batch * config.unlabelled_ratio
    for _ in range(config.steps):
        feats = _pick_views(bank.weak, rows.flatten(), gen).view(t, n_max, bank.dim)
        logits_l = torch.einsum("tnd,tcd->tnc", feats, weights) + biases[:, None]
        ce = functional.cross_entropy(
            logits_l.reshape(-1, classes), targets.flatten(), reduction="none"
        ).view(t, n_max)
        loss = ((ce * present).sum(dim=1) / present.sum(dim=1)).sum()
        if n_u:
            ui = torch.randint(0, len(bank), (n_u,), generator=gen)
            fw, fs = _pick_views(bank.weak, ui, gen), _pick_views(bank.strong, ui, gen)
            lw = torch.einsum("nd,tcd->tnc", fw, weights) + biases[:, None]
            ls = torch.einsum("nd,tcd->tnc", fs, weights) + biases[:, None]
            with torch.no_grad():
                conf, pseudo = functional.softmax(lw, dim=-1).max(dim=-1)
                mask = (conf >= config.threshold).float()
            cu = functional.cross_entropy(
                ls.reshape(-1, classes), pseudo.flatten(), reduction="none"
            ).view(t, n_u)
            loss = loss + config.unlabelled_weight * (cu * mask).mean(dim=1).sum()
        opt.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        opt.step()
        schedule.step()
    return weights.detach(), biases.detach()


def head_module(weights: torch.Tensor, biases: torch.Tensor, index: int = 0) -> nn.Linear:
    """Head ``index`` of a :func:`fit_heads` result as an ``nn.Linear``."""
    layer = nn.Linear(weights.shape[2], weights.shape[1])
    with torch.no_grad():
        layer.weight.copy_(weights[index])
        layer.bias.copy_(biases[index])
    return layer
