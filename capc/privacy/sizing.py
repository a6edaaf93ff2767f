"""Sizing GNMax for a consortium: the noise that lets a target number of queries fit each
hospital's cap, solved by the ledger's own accountant, and whether the labels stay useful.

Privacy: a hospital's records move one of its teachers' votes, so every
hospital pays GNMax's per-query cost at weight 1 whatever its number of
teachers (:meth:`capc.mechanisms.base.Mechanism.per_query`); the sigma is
the smallest one for which ``queries`` such charges fit (epsilon, delta) in
the guardian's default accountant, rounded up to three significant figures.

Utility: a query is labelled right when its noisy top count stays above the
others. Each count gets N(0, sigma**2), so the winner beats one rival by a
margin m with probability Phi(m / (sqrt(2) sigma)); by the union bound over
the K - 1 rivals, a margin of ``sqrt(2) sigma z`` with
Phi(-z) = (1 - CONFIDENCE) / (K - 1) labels it right with probability at
least CONFIDENCE. When that margin exceeds the fewest voters a round may
have (quorum x teachers), even a unanimous vote is mostly noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.special import ndtri

from capc.mechanisms import from_config
from capc.privacy import accountants

#: The probability a labelling margin is sized for.
CONFIDENCE = 0.95


class NoUsefulSigmaError(ValueError):
    """No sigma both fits the budget and leaves labels better than noise; says what to change."""


@dataclass(frozen=True)
class GnmaxPlan:
    """What :func:`plan_gnmax` chose and why."""

    sigma: float
    classes: int
    hospitals: int
    teachers_per_hospital: int
    quorum: int
    epsilon: float
    delta: float
    accountant: str
    target_queries: int
    #: Queries that fit each hospital's cap at ``sigma`` (>= target_queries).
    queries_fit: int
    #: Votes by which the top class must lead for a CONFIDENCE chance of a right label.
    margin: float

    @property
    def voters(self) -> int:
        """Teachers when every hospital answers."""
        return self.hospitals * self.teachers_per_hospital

    @property
    def min_voters(self) -> int:
        """Teachers in the smallest round the quorum allows."""
        return self.quorum * self.teachers_per_hospital

    def mechanism(self) -> dict[str, object]:
        """The task file's ``mechanism`` object."""
        return {"name": "gnmax", "sigma": self.sigma}

    def explain(self) -> list[str]:
        """Human-readable lines: what was chosen and why."""
        return [
            f"voters: {self.hospitals} hospitals x {self.teachers_per_hospital} teachers = "
            f"{self.voters} (a round needs {self.quorum} hospitals: at least {self.min_voters})",
            f"sigma {self.sigma:g} votes = {self.sigma / self.voters:.1%} of all voters, "
            f"{self.sigma / self.min_voters:.1%} of a quorum's; the smallest sigma for which "
            f"{self.target_queries} queries fit each hospital's cap of eps {self.epsilon:g} at "
            f"delta {self.delta:g} ({self.accountant} accountant, the guardian's default)",
            f"queries that fit each hospital's cap: {self.queries_fit}",
            f"a query is labelled right with probability >= {CONFIDENCE:.0%} when its top class "
            f"leads every other by {self.margin:.0f} votes ({self.margin / self.voters:.0%} of "
            f"all voters, {self.margin / self.min_voters:.0%} of a quorum's)",
        ]


def _three_figures_up(x: float) -> float:
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return round(math.ceil(x / step - 1e-9) * step, 12)


def labelling_margin(sigma: float, classes: int, confidence: float = CONFIDENCE) -> float:
    """Votes by which a class must lead so that GNMax at ``sigma`` returns it with probability
    at least ``confidence`` (union bound over the other ``classes - 1``)."""
    z = float(-ndtri((1.0 - confidence) / max(classes - 1, 1)))
    return math.sqrt(2.0) * sigma * z


def plan_gnmax(
    *,
    classes: int,
    hospitals: int,
    teachers_per_hospital: int,
    quorum: int,
    epsilon: float,
    delta: float,
    queries: int,
    accountant: str = accountants.DEFAULT_ACCOUNTANT,
) -> GnmaxPlan:
    """GNMax's sigma for ``queries`` queries at each hospital's (epsilon, delta); NoUsefulSigmaError
    when that sigma leaves a quorum's unanimous vote mostly noise, ValueError on bad inputs."""
    if min(classes - 1, hospitals, teachers_per_hospital, quorum, queries) < 1:
        raise ValueError("classes >= 2, and hospitals, teachers, quorum and queries >= 1")
    if quorum > hospitals:
        raise ValueError(f"the quorum ({quorum}) cannot exceed the hospitals ({hospitals})")
    acct = accountants.make(accountant)
    unit = from_config({"name": "gnmax", "sigma": 1.0}, classes)
    # The largest multiple m of the sigma-1 cost that fits `queries` times; a Gaussian
    # loss scales as 1 / sigma**2, so sigma = 1 / sqrt(m).
    m = acct.max_multiplier(unit.per_query(), queries, epsilon, delta)
    if m <= 0:
        raise NoUsefulSigmaError(f"eps {epsilon:g} at delta {delta:g} admits no query at any sigma")
    sigma = _three_figures_up(1.0 / math.sqrt(m))
    fit = acct.max_count(
        from_config({"name": "gnmax", "sigma": sigma}, classes).per_query(), epsilon, delta
    )
    plan = GnmaxPlan(
        sigma,
        classes,
        hospitals,
        teachers_per_hospital,
        quorum,
        epsilon,
        delta,
        acct.name,
        queries,
        fit,
        labelling_margin(sigma, classes),
    )
    if plan.margin > plan.min_voters:
        need = math.ceil(plan.margin / quorum)
        raise NoUsefulSigmaError(
            f"no useful sigma: {queries} queries at eps {epsilon:g} need sigma {sigma:g}, and a "
            f"right label ({CONFIDENCE:.0%}) then needs a lead of {plan.margin:.0f} votes, more "
            f"than the {plan.min_voters} teachers of a quorum of {quorum} hospitals: labels would "
            f"be mostly noise. Use at least {need} teachers per hospital (--teachers-per-hospital), "
            "more hospitals or a larger quorum, fewer --queries, or a larger --epsilon"
        )
    return plan
