"""Randomized response on labels: the baseline ALIBI improves on (Warner 1965; Ghazi et al. 2021).

Each record's label is kept with probability e^eps / (e^eps + C - 1) and
otherwise replaced by one of the other C - 1 classes uniformly, so every
output class has probability e^eps / (e^eps + C - 1) or 1 / (e^eps + C - 1)
whatever the label: the ratio for two labels is at most e^eps, which is
epsilon-label-DP with delta 0. The model trained on the noisy labels is
post-processing. The draws use 53-bit uniforms from the secure generator:
each probability is exact to 2**-53.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.labeldp.alibi import label_event, one_hot
from capc.labeldp.training import TrainConfig, fit_soft
from capc.privacy import events
from capc.privacy.randomness import SecureRandom


def keep_probability(epsilon: float, classes: int) -> float:
    """Probability that randomized response keeps the true label."""
    if classes < 2:
        raise ValueError(f"randomized response needs at least two classes, got {classes}")
    e = label_event(epsilon).epsilon
    return 1.0 / (1.0 + (classes - 1) * math.exp(-e))


def event(epsilon: float) -> events.PureDpEvent:
    """The privacy event of one record's label: epsilon-DP, delta 0."""
    return label_event(epsilon)


def randomize(
    labels: NDArray[np.integer], classes: int, epsilon: float, rng: SecureRandom
) -> NDArray[np.int64]:
    """The released labels (N,): each kept or moved to a uniformly drawn other class."""
    y = np.asarray(labels, dtype=np.int64)
    one_hot(y, classes)  # validates the labels
    keep = rng.uniform(len(y)) < keep_probability(epsilon, classes)
    shift = 1 + np.minimum(np.floor(rng.uniform(len(y)) * (classes - 1)), classes - 2).astype(
        np.int64
    )
    return np.where(keep, y, (y + shift) % classes).astype(np.int64)


def train(
    model: nn.Module,
    x: NDArray[np.float32],
    released: NDArray[np.integer],
    classes: int,
    config: TrainConfig,
) -> nn.Module:
    """Train ``model`` on (N, C, H, W) images with their released labels (N,) in [0, classes)."""
    if len(released) != len(x):
        raise ValueError(f"need one released label per image, got {len(released)} for {len(x)}")
    target = torch.from_numpy(one_hot(np.asarray(released), classes).astype(np.float32))
    return fit_soft(model, x, lambda idx, _: target[idx], config)
