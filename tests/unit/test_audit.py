"""The canary audit: exact intervals, the game's draws, and an audit that catches what it is for.

Randomized response released as is gives the attack its best case: guessing
the released label is right with probability exactly e^eps / (1 + e^eps),
so the bound must stay below the true epsilon and come close to it; a claim
of a tenth of the real epsilon must be refuted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from capc.audit import bounds, canaries
from capc.labeldp import alibi, rr
from capc.onehot import one_hot
from capc.privacy.randomness import SecureRandom


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (47, 100), (990, 1000)])
def test_clopper_pearson_matches_scipy(k: int, n: int) -> None:
    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    assert bounds.clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_epsilon_of_an_accuracy() -> None:
    assert bounds.epsilon_for_accuracy(0.5) == 0.0 and bounds.epsilon_for_accuracy(0.3) == 0.0
    assert bounds.epsilon_for_accuracy(math.e / (1 + math.e)) == pytest.approx(1.0)
    assert bounds.epsilon_for_accuracy(0.9, delta=0.05) == pytest.approx(math.log(0.85 / 0.1))
    assert math.isinf(bounds.epsilon_for_accuracy(1.0))
    e = bounds.empirical_epsilon(100, 100)
    assert e.lower == pytest.approx(math.log(e.accuracy_low / (1 - e.accuracy_low)))
    assert e.upper is not None and math.isinf(e.upper) and e.to_dict()["upper"] is None
    none = bounds.empirical_epsilon(0, 0, 50)
    assert none.lower == 0.0 and none.canaries == 50
    with pytest.raises(ValueError, match="cannot make"):
        bounds.empirical_epsilon(3, 5, 4)


def test_canaries_draw_two_distinct_wrong_labels_uniformly() -> None:
    y = np.zeros(30_000, dtype=np.int64)
    planted, c = canaries.plant(y, 4, np.arange(30_000), np.random.default_rng(0))
    assert (c.planted != 0).all() and (c.alternative != 0).all()
    assert (c.planted != c.alternative).all()
    np.testing.assert_array_equal(planted, c.planted)
    pairs = np.bincount(c.planted * 4 + c.alternative, minlength=16).reshape(4, 4)[1:, 1:]
    off = pairs[~np.eye(3, dtype=bool)]
    assert off.min() > 0.9 * 5000 and off.max() < 1.1 * 5000  # 6 ordered pairs, 5000 each
    with pytest.raises(ValueError, match="distinct"):
        canaries.plant(y[:5], 4, np.array([1, 1]), np.random.default_rng(0))


def test_the_attack_guesses_only_where_the_release_points_at_a_candidate() -> None:
    c = canaries.Canaries(
        index=np.arange(4),
        true=np.array([0, 0, 0, 0]),
        planted=np.array([1, 1, 2, 3]),
        alternative=np.array([2, 3, 1, 1]),
    )
    probs = np.eye(4)[[1, 0, 1, 2]]  # top: planted, true class, alternative, neither
    g = canaries.guess(c, probs)
    np.testing.assert_array_equal(g.made, [True, False, True, False])
    np.testing.assert_array_equal(g.right, [True, False, False, False])
    released = np.array([-1, 1, -1, 3])
    g = canaries.guess(c, probs, released)
    assert g.count == 4 and g.correct == 3


def rr_audit(
    true_eps: float, claimed: float, m: int = 3000
) -> tuple[bounds.EmpiricalEpsilon, bool]:
    y = np.zeros(m, dtype=np.int64)
    planted, c = canaries.plant(y, 10, np.arange(m), np.random.default_rng(1))
    released = rr.randomize(planted, 10, true_eps, SecureRandom.from_seed(repr(true_eps)))
    result = canaries.audit(c, None, released)
    return result, result.exceeds(claimed)


def test_the_audit_is_sound_and_nearly_tight_on_randomized_response() -> None:
    for eps in (0.5, 1.0, 2.0, 4.0):
        result, flagged = rr_audit(eps, eps)
        assert not flagged and result.lower <= eps
        assert result.upper is not None and result.upper >= eps
        assert result.lower > 0.5 * eps  # the attack is near-optimal here


def test_the_audit_refutes_a_mechanism_charged_at_a_tenth_of_its_cost() -> None:
    result, flagged = rr_audit(4.0, 0.4)
    assert flagged and result.lower > 0.4


def float_alibi(labels: np.ndarray, classes: int, epsilon: float, rng: SecureRandom) -> np.ndarray:
    """The old ALIBI release, kept here only as the thing being audited: one-hot labels plus
    floating-point Laplace(2 / epsilon) noise (Mironov 2012's porous support)."""
    clean = one_hot(labels, classes)
    return clean + rng.laplace(clean.shape, 2.0 / epsilon)


def test_every_one_plus_a_double_passes_the_support_test() -> None:
    """The attack's premise: the label's coordinate of a float release always passes."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**63 - 1, 2_000_000, dtype=np.int64).view(np.float64)
    x = bits[np.isfinite(bits)]
    x = np.concatenate([x, -x, rng.laplace(0, 1, 500_000) * 10.0 ** rng.integers(-20, 20, 500_000)])
    with np.errstate(over="ignore"):
        assert canaries.after_adding_one(1.0 + x).all()
    assert canaries.after_adding_one(np.arange(-5000, 5000) / 256).all()  # ALIBI's grid
    assert not canaries.after_adding_one(np.array([0.1, 1e-3, -0.3])).any()


def test_every_output_of_the_float_laplace_sampler_is_in_its_support() -> None:
    rng = SecureRandom.from_seed("support")
    for scale in (2.0, 0.25, 1 / 3, 16.0):
        x = rng.laplace(100_000, scale)
        assert canaries.float_laplace_support(x, scale).all()
        # and most of 1.0 + x is not: the label's coordinate stands out
        assert canaries.float_laplace_support(1.0 + x, scale).mean() < 0.4


def alibi_release_audits(
    release: str, scale: float | None, m: int = 20_000, epsilon: float = 1.0
) -> tuple[bounds.EmpiricalEpsilon, bounds.EmpiricalEpsilon]:
    y = np.zeros(m, dtype=np.int64)
    planted, c = canaries.plant(y, 10, np.arange(m), np.random.default_rng(3))
    rng = SecureRandom.from_seed(f"alibi-{release}")
    o = (
        float_alibi(planted, 10, epsilon, rng)
        if release == "float"
        else alibi.noisy_labels(planted, 10, epsilon, rng)
    )
    g = alibi.grid(epsilon)
    odds = alibi.log_odds(o, c.planted, c.alternative, g.scale)
    return (
        canaries.audit_support(c, o, scale),
        canaries.audit_scores(c, odds, float(g.epsilon) * (1 - 1e-9)),
    )


@pytest.mark.parametrize(("scale", "share"), [(None, 0.2), (2.0, 0.6)])
def test_the_support_attack_refutes_float_alibi(scale: float | None, share: float) -> None:
    support, score = alibi_release_audits("float", scale)
    assert support.guesses > share * support.canaries and support.correct == support.guesses
    assert support.exceeds(1.0) and support.refuting_lower > 5.0
    assert not score.exceeds(1.0)  # the likelihood-ratio attack alone cannot see it


@pytest.mark.parametrize("scale", [None, 2.0])
def test_exact_grid_alibi_passes_both_release_attacks(scale: float | None) -> None:
    support, score = alibi_release_audits("grid", scale)
    assert support.lower <= 1.0 and not support.exceeds(1.0)
    if scale is None:
        assert support.guesses == 0  # every grid value could be fl(1.0 + x)
    else:  # grid values that are float Laplace outputs: guesses at chance
        assert abs(support.accuracy - 0.5) < 0.05
    assert score.guesses > 1000 and score.lower <= 1.0 and not score.exceeds(1.0)
    assert score.upper is not None and score.upper >= 1.0
