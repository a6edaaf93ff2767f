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
#: Fewest labelled records a teacher of a partitioned hospital should learn from: a rule
#: of thumb, not a measured threshold (a 2-row teacher's vote is close to a coin's; the
#: side-by-side tables' smallest teachers, 30 to 50 rows, still beat chance). Below it,
#: splitting a hospital into more teachers buys votes, not knowledge.
MIN_RECORDS_PER_TEACHER = 20
#: Where partitioning cannot work: one teacher per hospital, trained with DP-SGD.
DP_TEACHER_COMMAND = "capc teacher fit --dp-epsilon E"


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
    #: Labelled records of the smallest hospital, when known: the advice fits its size.
    records_per_hospital: int | None = None

    def size_notes(self) -> list[str]:
        """Warnings when a hospital is too small for its teachers: each would learn from
        fewer than :data:`MIN_RECORDS_PER_TEACHER` records."""
        n, t = self.records_per_hospital, self.teachers_per_hospital
        if n is None or t <= 1 or n >= t * MIN_RECORDS_PER_TEACHER:
            return []
        return [
            f"a hospital of {n} labelled records split into {t} teachers gives each about "
            f"{n // t} records, fewer than the {MIN_RECORDS_PER_TEACHER} a teacher needs to "
            f"vote much better than chance: use at most {max(n // MIN_RECORDS_PER_TEACHER, 1)} "
            f"teacher(s) per hospital, or one DP-trained teacher ({DP_TEACHER_COMMAND})"
        ]

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
    records_per_hospital: int | None = None,
) -> GnmaxPlan:
    """GNMax's sigma for ``queries`` queries at each hospital's (epsilon, delta); NoUsefulSigmaError
    when that sigma leaves a quorum's unanimous vote mostly noise, ValueError on bad inputs.

    ``records_per_hospital``: labelled records of the smallest hospital, when known; the
    advice then never asks for more teachers than it can fill
    (:data:`MIN_RECORDS_PER_TEACHER` each) and points to a DP-trained teacher instead."""
    if records_per_hospital is not None and records_per_hospital < 1:
        raise ValueError("records_per_hospital must be at least 1")
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
        records_per_hospital,
    )
    if plan.margin > plan.min_voters:
        need = math.ceil(plan.margin / quorum)
        why = (
            f"no useful sigma: {queries} queries at eps {epsilon:g} need sigma {sigma:g}, and a "
            f"right label ({CONFIDENCE:.0%}) then needs a lead of {plan.margin:.0f} votes, more "
            f"than the {plan.min_voters} teachers of a quorum of {quorum} hospitals: labels would "
            "be mostly noise. "
        )
        n = records_per_hospital
        if n is not None and n < need * MIN_RECORDS_PER_TEACHER:
            # Splitting cannot reach the votes needed: teachers of a few records each
            # would vote almost at random.
            raise NoUsefulSigmaError(
                why + f"{need} teachers per hospital would be needed, but a hospital of {n} "
                f"records split so gives each about {n // need} (a teacher needs some "
                f"{MIN_RECORDS_PER_TEACHER}): partitioning cannot work at this size. Train "
                f"one DP-trained teacher per hospital instead ({DP_TEACHER_COMMAND}: its "
                "training is charged once to the hospital's ledger) and join more hospitals "
                "or ask fewer --queries at a larger --epsilon; or pool records with other "
                "hospitals before partitioning"
            )
        raise NoUsefulSigmaError(
            why + f"Use at least {need} teachers per hospital (--teachers-per-hospital), "
            "more hospitals or a larger quorum, fewer --queries, or a larger --epsilon"
        )
    return plan


def recheck(
    mechanism: dict[str, object],
    classes: int,
    quorum: int,
    teachers: list[int],
    names: list[str] | None = None,
) -> list[str]:
    """Warnings for a GNMax task run with ``teachers`` (each hospital's count, as they
    register) rather than the counts it was planned for: whether the smallest round the
    quorum allows still leaves labels better than noise, and whether a hospital carries
    far less of the vote than it pays for (every hospital pays the same epsilon a query
    whatever its number of teachers). ``names``: the hospitals' (default hospital-0,
    hospital-1, ...). [] for another mechanism or when all is well."""
    if mechanism.get("name") != "gnmax" or not teachers:
        return []
    sigma = float(str(mechanism["sigma"]))
    margin = labelling_margin(sigma, classes)
    smallest = sum(sorted(teachers)[: max(1, min(quorum, len(teachers)))])
    out = []
    if margin > smallest:
        out.append(
            f"with these teachers ({', '.join(map(str, teachers))}) a round of the quorum's "
            f"{quorum} hospital(s) may have only {smallest} voters, and sigma {sigma:g} needs "
            f"a lead of {margin:.0f} votes for a right label ({CONFIDENCE:.0%}): such rounds "
            "would label mostly noise. Re-plan the task for these counts (capc task init "
            "--teachers-per-hospital N) or raise the quorum"
        )
    total = sum(teachers)
    small = [i for i, t in enumerate(teachers) if t * len(teachers) * 10 < total]
    if small:
        called = names or [f"hospital-{i}" for i in range(len(teachers))]
        which = ", ".join(f"{called[i]} ({teachers[i]} of {total} votes)" for i in small)
        out.append(
            f"{which} carries under a tenth of an equal share of the vote but pays the same "
            "epsilon a query as every hospital: bring more teachers (disjoint parts of its "
            f"records) or one DP-trained teacher per hospital ({DP_TEACHER_COMMAND})"
        )
    return out
