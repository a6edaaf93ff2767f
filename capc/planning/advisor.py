"""Choosing a multi-label mechanism from non-sensitive label statistics.

Inputs are statistics of label vectors that a consortium may publish (from
public data, a data dictionary, or a separately privatised count): k, the
mean l2 norm of a label vector, and how many label subsets occur. For each
mechanism the advisor solves the noise that ``queries`` answered queries
need at (epsilon, delta) (data-independent RDP, as the guardian charges) and
scores it by a proxy for utility: the probability that *every* label of a
query is right when the n teachers agree on a typical vector.

- Binary: label j is right iff its noisy count stays on the teachers' side
  of n/2: margin n/2 per label, P = Phi(n / (2 sigma))**k.
- tau: the same with clipped votes. tau is set slightly above the mean l2
  norm (``TAU_MARGIN`` times it, at most sqrt(k)), so a typical vector is
  not clipped and keeps margin n/2, while the sensitivity drops from sqrt(k)
  to sqrt(2) tau. A vector of norm r > tau keeps entries tau / r. Only where its
  vote-validity statement fits (25 labels, 26 at tau < 2; :meth:`Mechanism.proven_outputs`).
- Powerset (k <= ``MAX_POWERSET_LABELS``, 9): noisy argmax over 2**k subsets; the agreed subset has
  n votes and the others none, P = E_z[Phi((n + sigma z) / sigma)**(2**k - 1)].
  Teachers that disagree on any label split the subset vote; when many
  subsets occur that happens more often, so Powerset is only proposed when at
  most ``POWERSET_SUBSET_FRACTION`` of the 2**k subsets occur.

The proxy ignores teacher disagreement otherwise; the experiment in
``experiments/multilabel_voting.py`` checks the advice against measured label
quality.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ndtr

from capc.mechanisms.base import MechanismError
from capc.mechanisms.powerset import MAX_POWERSET_LABELS
from capc.mechanisms.registry import from_config
from capc.privacy import planning, rdp
from capc.privacy.conversion import DEFAULT_ORDERS

#: tau is this much above the mean l2 norm of the label vectors.
TAU_MARGIN = 1.1
#: Powerset is proposed only when at most this share of the 2**k subsets occurs.
POWERSET_SUBSET_FRACTION = 0.5


@dataclass(frozen=True)
class LabelStatistics:
    """Non-sensitive statistics of k-bit label vectors."""

    num_labels: int
    mean_l2: float
    distinct_subsets: int

    def __post_init__(self) -> None:
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {self.num_labels}")
        if not 0 <= self.mean_l2 <= math.sqrt(self.num_labels):
            raise ValueError(f"mean_l2 must lie in [0, sqrt(k)], got {self.mean_l2}")
        if not 1 <= self.distinct_subsets <= 2.0**self.num_labels:
            raise ValueError("distinct_subsets must lie in [1, 2**k]")

    @classmethod
    def from_labels(cls, labels: ArrayLike) -> LabelStatistics:
        """Statistics of (N, k) 0/1 label vectors (public or already privatised data)."""
        y = np.asarray(labels)
        if y.ndim != 2 or y.shape[0] == 0 or not np.isin(y, (0, 1)).all():
            raise ValueError(f"labels must be a non-empty (N, k) array of 0/1, got {y.shape}")
        return cls(
            num_labels=int(y.shape[1]),
            mean_l2=float(np.sqrt(y.sum(axis=1)).mean()),
            distinct_subsets=len(np.unique(y, axis=0)),
        )


@dataclass(frozen=True)
class Option:
    """One mechanism at the noise a plan needs: ``sigma`` (and ``tau``), and its utility proxy."""

    mechanism: str
    sigma: float
    tau: float | None
    all_labels_right: float


@dataclass(frozen=True)
class Recommendation:
    """The advised mechanism for ``queries`` answered queries at (epsilon, delta)."""

    best: Option
    options: list[Option] = field(default_factory=list)
    reason: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "mechanism": self.best.mechanism,
            "sigma": self.best.sigma,
            "tau": self.best.tau,
            "reason": self.reason,
            "options": {
                o.mechanism: {
                    "sigma": o.sigma,
                    "tau": o.tau,
                    "all_labels_right": o.all_labels_right,
                }
                for o in self.options
            },
        }


def _powerset_success(margin: float, sigma: float, subsets: int) -> float:
    """P[n + N(0, s^2) beats subsets - 1 independent N(0, s^2)], by quadrature over z."""
    z = np.linspace(-9.0, 9.0, 4001)
    weights = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) * (z[1] - z[0])
    inner = ndtr((margin + sigma * z) / sigma)
    return float(np.sum(weights * inner ** (subsets - 1)))


def recommend(
    stats: LabelStatistics,
    num_teachers: int,
    queries: int,
    epsilon: float,
    delta: float,
    orders: ArrayLike = DEFAULT_ORDERS,
) -> Recommendation:
    """Binary vs tau vs Powerset, each with the sigma that fits ``queries`` at (epsilon, delta).

    ``num_teachers``: answering parties voting (n). Epsilon per party, delta
    per party; every query is assumed answered (no confidence test).
    """
    if num_teachers < 1 or queries < 1:
        raise ValueError("num_teachers and queries must be >= 1")
    k, n = stats.num_labels, float(num_teachers)
    o = np.asarray(orders, dtype=np.float64)

    def sigma_for(unit: np.ndarray) -> float:
        return planning.noise_scale_for(unit, o, queries, epsilon, delta)

    options = []
    s_bin = sigma_for(rdp.multilabel_binary(k, 1.0, o))
    options.append(Option("binary", s_bin, None, float(ndtr(n / (2 * s_bin)) ** k)))
    tau = min(TAU_MARGIN * max(stats.mean_l2, 1.0), math.sqrt(k))
    tau_ok = _has_vote_statement({"name": "tau", "sigma": 1.0, "tau": tau}, k)
    if tau_ok:
        s_tau = sigma_for(rdp.multilabel_tau(k, tau, 1.0, o))
        # A typical vector (norm mean_l2 <= tau) is not clipped: entries 1, margin n/2.
        entry = min(1.0, tau / max(stats.mean_l2, 1e-12))
        options.append(Option("tau", s_tau, tau, float(ndtr(n * (entry - 0.5) / s_tau) ** k)))
    powerset_ok = (
        k <= MAX_POWERSET_LABELS and stats.distinct_subsets <= POWERSET_SUBSET_FRACTION * 2**k
    )
    if powerset_ok:
        s_pow = sigma_for(rdp.multilabel_powerset(1.0, o))
        options.append(Option("powerset", s_pow, None, _powerset_success(n, s_pow, 2**k)))
    best = max(options, key=lambda opt: opt.all_labels_right)
    why = (
        f"{best.mechanism} keeps all {k} labels right for agreeing teachers with probability "
        f"{best.all_labels_right:.3f} at sigma {best.sigma:.3g} for {queries} queries"
    )
    if not powerset_ok:
        why += f"; Powerset not considered ({stats.distinct_subsets} of {2**k} subsets occur, or k > {MAX_POWERSET_LABELS})"
    if not tau_ok:
        why += (
            f"; tau not considered (over {k} labels at tau {tau:.3g} it has no vote-validity "
            "statement: split the labels into smaller tasks)"
        )
    return Recommendation(best, options, why)


def _has_vote_statement(config: dict[str, object], k: int) -> bool:
    """Whether the mechanism ``config`` over ``k`` labels can run in the services: it
    exists there and has a vote-validity statement (a task without one is refused)."""
    try:
        from_config(config, k).require_vote_statement()
    except MechanismError:
        return False
    return True
