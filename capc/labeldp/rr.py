"""Randomized response on labels: the baseline ALIBI improves on (Warner 1965; Ghazi et al. 2021).

Each record's label is kept with probability e^eps / (e^eps + C - 1) and
otherwise replaced by one of the other C - 1 classes uniformly, so every
output class has probability e^eps / (e^eps + C - 1) or 1 / (e^eps + C - 1)
whatever the label: the ratio for two labels is at most e^eps, which is
epsilon-label-DP with delta 0. The model trained on the noisy labels is
post-processing.

Sampling is exact, with integers only (:mod:`capc.privacy.exact_noise`):
propose a class uniformly; accept it if it is the label, else with
probability exp(-epsilon); repeat until accepted. The accepted class has
probability proportional to 1 for the label and exp(-epsilon) for each other
class, which is the law above exactly. Epsilon enters as its binary value
rounded down to a multiple of 2**-60 (a smaller epsilon: never less private).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from capc.labeldp.alibi import label_event
from capc.labeldp.training import TrainConfig, fit_soft
from capc.onehot import one_hot
from capc.privacy import events, exact_noise
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
    """The released labels (N,): each kept or moved to a uniformly drawn other class, with
    the exact law of the module docstring."""
    y = np.asarray(labels, dtype=np.int64)
    one_hot(y, classes)  # validates the labels
    if classes < 2:
        raise ValueError(f"randomized response needs at least two classes, got {classes}")
    gamma = Fraction(math.floor(Fraction(label_event(epsilon).epsilon) * 2**60), 2**60)
    out = np.empty(len(y), dtype=np.int64)
    pending = np.arange(len(y))
    while pending.size:
        proposal = exact_noise.randbelow(classes, pending.size, rng)
        accept = proposal == y[pending]
        accept |= exact_noise.bernoulli_exp(gamma, pending.size, rng)
        out[pending[accept]] = proposal[accept]
        pending = pending[~accept]
    return out


def train_rr(
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
