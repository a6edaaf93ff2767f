"""ALIBI: Additive Laplace noise with Iterative Bayesian Inference (Malek et al. 2021).

1. Release, once, each record's one-hot label plus independent Laplace
   noise of scale ``lambda = 2 / epsilon`` on every coordinate: o = e_y + Lap(lambda)^C.
2. Train on soft labels: at every step, each record's posterior over its
   label given o, with the current model's prediction as the prior,

       p(y = c | o) = softmax_c( (|o_c| - |o_c - 1|) / lambda + log prior_c ),

   the paper's eq. (3) with the constant sum of |o_k| cancelled.

Privacy (label-DP, pure). Changing one record's label moves its one-hot
vector by 2 in L1 and nothing else, so step 1 is the Laplace mechanism of
L1 sensitivity 2 at scale 2 / epsilon: epsilon-DP with **delta = 0**, for
every record, whatever the data (Dwork and Roth 2014, Thm 3.6). Each record's
label enters only through its own noisy vector, which is released once;
everything after it, the Bayesian refinement and every training step
included, is post-processing, so the trained model is epsilon-label-DP.
The charge is fixed before anything runs: it depends on epsilon only.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional

from capc.labeldp.training import TrainConfig, fit_soft
from capc.privacy import events
from capc.privacy.randomness import SecureRandom


def _epsilon(epsilon: float) -> float:
    e = float(epsilon)
    if not (np.isfinite(e) and e > 0):
        raise ValueError(f"epsilon must be a positive number (nats), got {epsilon!r}")
    return e


def laplace_scale(epsilon: float) -> float:
    """Scale lambda of the Laplace noise per coordinate for epsilon-label-DP: 2 / epsilon."""
    return 2.0 / _epsilon(epsilon)


def label_event(epsilon: float) -> events.PureDpEvent:
    """The privacy event of one record's label under ALIBI: epsilon-DP, delta 0."""
    return events.PureDpEvent(_epsilon(epsilon))


def one_hot(labels: NDArray[np.integer], classes: int) -> NDArray[np.float64]:
    """(N,) classes in [0, classes) -> (N, classes) one-hot rows."""
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {y.dtype} {y.shape}")
    if len(y) and (y.min() < 0 or y.max() >= classes):
        raise ValueError(f"labels must lie in [0, {classes})")
    out = np.zeros((len(y), classes), dtype=np.float64)
    out[np.arange(len(y)), y] = 1.0
    return out


def noisy_labels(
    labels: NDArray[np.integer], classes: int, epsilon: float, rng: SecureRandom
) -> NDArray[np.float64]:
    """The released vectors o (N, classes): one-hot labels plus Laplace(2 / epsilon) noise
    drawn from the secure generator ``rng``."""
    clean = one_hot(labels, classes)
    return clean + rng.laplace(clean.shape, laplace_scale(epsilon))


def posterior(noisy: torch.Tensor, scale: float, log_prior: torch.Tensor) -> torch.Tensor:
    """p(y | o) (N, C) for released vectors ``noisy`` (N, C) at Laplace ``scale``, given a
    prior's log-probabilities ``log_prior`` (N, C)."""
    if noisy.shape != log_prior.shape or noisy.ndim != 2:
        raise ValueError(
            f"noisy vectors and prior must both be (N, C), got {tuple(noisy.shape)} "
            f"and {tuple(log_prior.shape)}"
        )
    if not scale > 0:
        raise ValueError(f"the Laplace scale must be positive, got {scale}")
    evidence = (noisy.abs() - (noisy - 1.0).abs()) / scale
    return functional.softmax(evidence + log_prior, dim=1)


def log_odds(
    noisy: NDArray[np.float64],
    first: NDArray[np.integer],
    second: NDArray[np.integer],
    scale: float,
) -> NDArray[np.float64]:
    """log p(o | y = first) - log p(o | y = second) per row of ``noisy`` (N, C), at Laplace
    ``scale``: (|o_a| - |o_a - 1| + |o_b - 1| - |o_b|) / scale, at most 2 / scale = epsilon
    (reached where o_a >= 1 and o_b <= 0)."""
    o = np.asarray(noisy, dtype=np.float64)
    rows = np.arange(len(o))
    a, b = o[rows, np.asarray(first)], o[rows, np.asarray(second)]
    return (np.abs(a) - np.abs(a - 1.0) + np.abs(b - 1.0) - np.abs(b)) / scale


def train(
    model: nn.Module,
    x: NDArray[np.float32],
    noisy: NDArray[np.float64],
    scale: float,
    config: TrainConfig,
) -> nn.Module:
    """Train ``model`` on (N, C, H, W) images whose labels were released as ``noisy`` (N, K)
    at Laplace ``scale``: each step's targets are the posteriors under the model's own
    current prediction (Algorithm 3 of the paper). Post-processing only."""
    if len(noisy) != len(x):
        raise ValueError(f"need one noisy vector per image, got {len(noisy)} for {len(x)}")
    o = torch.from_numpy(np.asarray(noisy, dtype=np.float32))

    def targets(idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return posterior(o[idx], scale, functional.log_softmax(logits.float(), dim=1))

    return fit_soft(model, x, targets, config)
