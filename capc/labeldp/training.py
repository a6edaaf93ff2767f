"""Training on per-example soft targets that may change as the model learns.

ALIBI recomputes each record's posterior label distribution from the
current model's prediction at every step; randomized response trains on
fixed noisy labels. Both go through :func:`fit_soft`: SGD with Nesterov
momentum and a cosine schedule over weakly augmented batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.learning.fixmatch import soft_cross_entropy
from capc.learning.randaugment import WeakAugmentation, weak
from capc.models.inference import device_of

#: (indices (B,) of the batch's records, the model's detached logits (B, C)) -> targets (B, C).
Targets = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """``epochs`` passes in batches of ``batch``; SGD from ``lr`` (cosine to 0), momentum,
    ``weight_decay``; ``augment`` a weak view of each image at every step."""

    epochs: int = 30
    batch: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    augment: bool = True
    weak: WeakAugmentation = field(default_factory=WeakAugmentation)

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch < 2:
            raise ValueError("training needs epochs >= 1 and batch >= 2")
        if not (self.lr > 0 and self.weight_decay >= 0 and 0 <= self.momentum < 1):
            raise ValueError("lr must be positive, weight_decay >= 0 and momentum in [0, 1)")


def fit_soft(
    model: nn.Module, x: NDArray[np.float32], targets: Targets, config: TrainConfig
) -> nn.Module:
    """Train ``model`` in place on (N, C, H, W) images against ``targets``; ends in eval mode."""
    if len(x) < 2:
        raise ValueError(f"need at least two training images, got {len(x)}")
    dev = device_of(model)
    gen = torch.Generator().manual_seed(config.seed)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    steps = config.epochs * math.ceil(len(xt) / config.batch)
    opt = torch.optim.SGD(
        model.parameters(),
        lr=config.lr,
        momentum=config.momentum,
        nesterov=config.momentum > 0,
        weight_decay=config.weight_decay,
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    model.train()
    try:
        for _ in range(config.epochs):
            order = torch.randperm(len(xt), generator=gen)
            for i in range(0, len(xt), config.batch):
                idx = order[i : i + config.batch]
                if len(idx) < 2:
                    continue  # BatchNorm needs two samples
                xb = weak(xt[idx], gen, config.weak) if config.augment else xt[idx]
                logits = model(xb.to(dev))
                target = targets(idx, logits.detach().cpu()).to(dev)
                loss = soft_cross_entropy(logits, target).mean()
                opt.zero_grad(set_to_none=True)
                torch.autograd.backward(loss)
                opt.step()
                schedule.step()
    finally:
        model.eval()
    return model
