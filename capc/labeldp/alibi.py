"""ALIBI: Additive Laplace noise with Iterative Bayesian Inference (Malek et al. 2021),
released on an integer grid with exactly sampled discrete Laplace noise.

1. Release, once, each record's one-hot label on a grid of :data:`RESOLUTION`
   points per unit, with independent discrete Laplace noise on every
   coordinate: the integers k = s e_y + Z (N, C), s = RESOLUTION, each Z_c
   with P[Z_c = z] proportional to exp(-|z| / t) (:func:`grid`). The vector
   the trainer reads, o = k / s, is k in label units (s is a power of two,
   so the division is exact in floating point).
2. Train on soft labels: at every step, each record's posterior over its
   label given o, with the current model's prediction as the prior,

       p(y = c | o) = softmax_c( (|o_c| - |o_c - 1|) / lambda + log prior_c ),  lambda = t / s,

   the paper's eq. (3) with the constant sum of |o_k| cancelled. On the grid
   the likelihood is P[k | y] = prod_c Z(t)^-1 exp(-|k_c - s [y = c]| / t),
   whose normaliser Z(t) does not depend on the shift, so the same ratios
   hold exactly with |k_c - s [y = c]| / t = |o_c - [y = c]| / lambda.

Privacy (label-DP, pure). Changing one record's label from y to y' changes
k's law only on coordinates y and y'; for every output k,

    log P[k | y] - log P[k | y'] = (|k_y| - |k_y - s| + |k_y' - s| - |k_y'|) / t
                                 <= 2 s / t,

by the triangle inequality, with equality where k_y >= s and k_y' <= 0. So
the release is exactly (2 s / t)-DP with delta 0 (the discrete Laplace
mechanism of L1 sensitivity 2 s in grid units). :func:`grid` takes
t = ceil(2 s / epsilon), so 2 s / t <= epsilon, with equality whenever
2 s / epsilon is an integer (every power of two up to 2^9 = 512 among
them); the record is charged the requested epsilon, an upper bound on the
exact 2 s / t that :attr:`Grid.epsilon` gives. The noise is exact integer
sampling (:mod:`capc.privacy.exact_noise`): no floating point touches a
released number, so there is no porous support to read (Mironov 2012; a
float sampler's release is refuted by :func:`capc.audit.canaries.audit_support`).
Each record's label enters only through its own vector, released once;
everything after it, the Bayesian refinement and every training step
included, is post-processing, so the trained model is epsilon-label-DP.
The charge is fixed before anything runs: it depends on epsilon only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional

from capc.labeldp.training import TrainConfig, fit_soft
from capc.onehot import one_hot
from capc.privacy import events, exact_noise
from capc.privacy.randomness import SecureRandom

#: Grid points per label unit (s). A power of two: k / s is exact in float32 and float64
#: for |k| < 2^24, and a step of 1/256 is far below the noise (lambda >= 2 / epsilon).
RESOLUTION = 256


def _epsilon(epsilon: float) -> float:
    e = float(epsilon)
    if not (np.isfinite(e) and e > 0):
        raise ValueError(f"epsilon must be a positive number (nats), got {epsilon!r}")
    return e


@dataclass(frozen=True)
class Grid:
    """The release's grid: ``resolution`` s points per label unit, discrete Laplace noise of
    integer scale ``noise`` t in grid units (P[z] proportional to exp(-|z| / t))."""

    resolution: int
    noise: int

    @property
    def epsilon(self) -> Fraction:
        """The release's exact epsilon (nats), 2 s / t: its L1 sensitivity over the scale."""
        return Fraction(2 * self.resolution, self.noise)

    @property
    def scale(self) -> float:
        """lambda = t / s, the noise scale in label units (what the posterior divides by)."""
        return self.noise / self.resolution

    def to_dict(self) -> dict[str, int | float]:
        return {"resolution": self.resolution, "noise": self.noise, "epsilon": float(self.epsilon)}


def grid(epsilon: float, resolution: int = RESOLUTION) -> Grid:
    """The grid for epsilon-label-DP: t = ceil(2 s / epsilon), computed on the exact binary
    value of ``epsilon``, so that :attr:`Grid.epsilon` = 2 s / t <= epsilon."""
    e = Fraction(_epsilon(epsilon))
    if resolution < 1:
        raise ValueError(f"the grid resolution must be a positive integer, got {resolution}")
    return Grid(resolution, max(1, math.ceil(Fraction(2 * resolution) / e)))


def laplace_scale(epsilon: float) -> float:
    """lambda, the noise scale per coordinate in label units: t / s of :func:`grid`, which is
    2 / epsilon exactly when 2 s / epsilon is an integer and a hair above otherwise."""
    return grid(epsilon).scale


def label_event(epsilon: float) -> events.PureDpEvent:
    """The privacy event of one record's label under ALIBI: epsilon-DP, delta 0."""
    return events.PureDpEvent(_epsilon(epsilon))


def release(
    labels: NDArray[np.integer], classes: int, epsilon: float, rng: SecureRandom
) -> NDArray[np.int64]:
    """The released integers k (N, classes) in grid units: s times the one-hot labels plus
    exact discrete Laplace noise of scale t (:func:`grid`), drawn from the secure ``rng``."""
    g = grid(epsilon)
    k = one_hot(labels, classes).astype(np.int64) * g.resolution
    return k + exact_noise.discrete_laplace(g.noise, k.shape, rng)


def noisy_labels(
    labels: NDArray[np.integer], classes: int, epsilon: float, rng: SecureRandom
) -> NDArray[np.float64]:
    """The released vectors o (N, classes) in label units: :func:`release` divided by the
    resolution s (exact: s is a power of two), i.e. one-hot labels plus noise on the grid
    of step 1 / s. Post-processing of the integers; the trainer reads these."""
    return release(labels, classes, epsilon, rng).astype(np.float64) / grid(epsilon).resolution


def posterior(noisy: torch.Tensor, scale: float, log_prior: torch.Tensor) -> torch.Tensor:
    """p(y | o) (N, C) for released vectors ``noisy`` (N, C) in label units at noise
    ``scale`` lambda (label units; :attr:`Grid.scale`), given a prior's log-probabilities
    ``log_prior`` (N, C). Exact for the grid release (module docstring, step 2) and for the
    continuous Laplace alike: only differences of |o_c - [y = c]| / lambda enter."""
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
    """log p(o | y = first) - log p(o | y = second) per row of ``noisy`` (N, C), at noise
    ``scale`` lambda: (|o_a| - |o_a - 1| + |o_b - 1| - |o_b|) / scale, at most 2 / scale,
    which is :attr:`Grid.epsilon` on the grid (reached where o_a >= 1 and o_b <= 0)."""
    o = np.asarray(noisy, dtype=np.float64)
    rows = np.arange(len(o))
    a, b = o[rows, np.asarray(first)], o[rows, np.asarray(second)]
    return (np.abs(a) - np.abs(a - 1.0) + np.abs(b - 1.0) - np.abs(b)) / scale


def train_alibi(
    model: nn.Module,
    x: NDArray[np.float32],
    noisy: NDArray[np.float64],
    scale: float,
    config: TrainConfig,
) -> nn.Module:
    """Train ``model`` on (N, C, H, W) images whose labels were released as ``noisy`` (N, K)
    (label units) at noise ``scale`` lambda: each step's targets are the posteriors under the model's own
    current prediction (Algorithm 3 of the paper). Post-processing only."""
    if len(noisy) != len(x):
        raise ValueError(f"need one noisy vector per image, got {len(noisy)} for {len(x)}")
    o = torch.from_numpy(np.asarray(noisy, dtype=np.float32))

    def targets(idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return posterior(o[idx], scale, functional.log_softmax(logits.float(), dim=1))

    return fit_soft(model, x, targets, config)
