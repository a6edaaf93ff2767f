"""From an attack's guesses to an empirical lower bound on epsilon.

The game (label-DP, seeds/alibi-pate-fm.txt section 7): a canary is a training
record whose label is one of two wrong classes y', y'', picked uniformly;
the attacker sees what the training released and guesses which. Against an
(epsilon, delta)-DP mechanism no guess is right with probability above
(e^eps + delta) / (1 + e^eps), so an accuracy alpha certifies

    epsilon >= log((alpha - delta) / (1 - alpha)).

Many canaries share one training run. Steinke, Nasr and Jagielski (2023,
"Privacy auditing with one (1) training run", Thm 3.1) show that with
independent uniform canary bits, the number of right guesses among r guesses
of an epsilon-DP mechanism is stochastically dominated by
Binomial(r, e^eps / (1 + e^eps)), abstentions allowed. A one-sided
Clopper-Pearson bound on the guesses is therefore a valid lower bound for
pure DP (ALIBI, randomized response) from one run. For (epsilon, delta)-DP
their bound adds a failure probability of order r delta (at most 1e-2 here:
delta 1e-5, r <= 1000); the paper's heuristic, which we follow, subtracts
delta from alpha instead.

A tight attack (the release attacks on ALIBI and randomized response are
exact) makes a 95% lower bound exceed the true epsilon 2.5% of the time, so
the interval reported is the 95% one, as in the paper, but a claim is
*refuted* only when the lower end of the :data:`REFUTE_CONFIDENCE` interval
exceeds it: a true claim then survives each tight audit with probability
at least 0.9995.

Units: epsilon in nats; confidence a probability.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from scipy.special import betaincinv

#: Two-sided confidence of the interval whose lower end must exceed a claim to refute it.
REFUTE_CONFIDENCE = 0.999


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval for a binomial proportion (exact: the
    interval covers the true proportion with probability at least ``confidence``)."""
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if trials == 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2.0
    # The beta quantiles, from scipy.special: scipy.stats costs every service a second
    # of start-up.
    lo = 0.0 if successes == 0 else float(betaincinv(successes, trials - successes + 1, tail))
    hi = (
        1.0
        if successes == trials
        else float(betaincinv(successes + 1, trials - successes, 1 - tail))
    )
    return lo, hi


def epsilon_for_accuracy(accuracy: float, delta: float = 0.0) -> float:
    """The smallest epsilon an attack of this accuracy is consistent with: 0 at or below 1/2."""
    if not 0.0 <= accuracy <= 1.0 or not 0.0 <= delta < 1.0:
        raise ValueError(f"need accuracy in [0, 1] and delta in [0, 1), got {accuracy}, {delta}")
    if accuracy >= 1.0:
        return math.inf
    return max(0.0, math.log(max(accuracy - delta, 1e-300) / (1.0 - accuracy)))


@dataclass(frozen=True)
class EmpiricalEpsilon:
    """What ``correct`` right guesses out of ``guesses`` (of ``canaries``) certify.

    ``lower``/``upper``: epsilon at the ends of the two-sided ``confidence``
    Clopper-Pearson interval on the accuracy (``lower`` is the empirical
    lower bound, at one-sided confidence (1 + confidence) / 2); ``point``: at
    the observed accuracy. All 0 when nothing was guessed. ``refuting_lower``: the
    lower end at :data:`REFUTE_CONFIDENCE`, what :meth:`exceeds` compares.
    """

    canaries: int
    guesses: int
    correct: int
    accuracy: float
    accuracy_low: float
    accuracy_high: float
    lower: float
    point: float
    upper: float
    delta: float
    confidence: float
    refuting_lower: float = 0.0

    def exceeds(self, claimed: float) -> bool:
        """True when the audit refutes a claimed epsilon: the lower end of its
        :data:`REFUTE_CONFIDENCE` interval is above it."""
        return self.refuting_lower > claimed

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and math.isinf(v) else v)
            for k, v in asdict(self).items()
        }


def empirical_epsilon(
    correct: int,
    guesses: int,
    canaries: int | None = None,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
) -> EmpiricalEpsilon:
    """Empirical epsilon of an attack that was right ``correct`` times out of ``guesses``."""
    total = guesses if canaries is None else canaries
    if total < guesses:
        raise ValueError(f"cannot make {guesses} guesses on {total} canaries")
    lo, hi = clopper_pearson(correct, guesses, confidence)
    strict = clopper_pearson(correct, guesses, max(confidence, REFUTE_CONFIDENCE))[0]
    acc = correct / guesses if guesses else 0.5
    return EmpiricalEpsilon(
        canaries=total,
        guesses=guesses,
        correct=correct,
        accuracy=acc,
        accuracy_low=lo,
        accuracy_high=hi,
        lower=epsilon_for_accuracy(lo, delta) if guesses else 0.0,
        point=epsilon_for_accuracy(acc, delta) if guesses else 0.0,
        upper=epsilon_for_accuracy(hi, 0.0) if guesses else math.inf,
        delta=delta,
        confidence=confidence,
        refuting_lower=epsilon_for_accuracy(strict, delta) if guesses else 0.0,
    )
