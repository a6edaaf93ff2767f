"""Mechanisms: explicit-noise forms, sampling forms, edge cases and bad input."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from capc.mechanisms.base import MechanismError
from capc.mechanisms.registry import from_config
from capc.privacy import advisor
from capc.privacy import mechanisms as m
from capc.privacy.randomness import SecureRandom


def rng(seed: str = "t") -> SecureRandom:
    return SecureRandom.from_seed(seed)


def test_noisy_argmax_breaks_ties_to_lowest_index() -> None:
    h = np.array([[3.0, 5.0, 5.0], [0.0, 0.0, 0.0]])
    assert m.noisy_argmax(h, np.zeros_like(h)).tolist() == [1, 0]


def test_gnmax_equals_decide_with_same_noise() -> None:
    h = np.array([[10.0, 9.0, 0.0], [0.0, 1.0, 7.0]])
    noise = m.gaussian_noise(h.shape, 2.0, rng("a"))
    assert np.array_equal(m.gnmax(h, 2.0, rng("a")), m.noisy_argmax(h, noise))


def test_confident_gnmax_answers_only_above_threshold() -> None:
    h = np.array([[200.0, 50.0], [120.0, 130.0]])
    res = m.confident_decide(h, 150.0, eta1=np.array([0.0, 0.0]), eta2=np.zeros_like(h))
    assert res.answered.tolist() == [True, False]
    assert res.labels.tolist() == [0, m.NOT_ANSWERED]


def test_confident_gnmax_sampling_matches_decide() -> None:
    h = np.array([[200.0, 50.0, 0.0]] * 50)
    r1, r2 = rng("c"), rng("c")
    got = m.confident_gnmax(h, 180.0, 30.0, 10.0, r1)
    eta1 = m.gaussian_noise((50,), 30.0, r2)
    eta2 = m.gaussian_noise(h.shape, 10.0, r2)
    want = m.confident_decide(h, 180.0, eta1, eta2)
    assert np.array_equal(got.labels, want.labels) and np.array_equal(got.answered, want.answered)


def test_gnmax_is_accurate_on_clear_majorities() -> None:
    h = np.tile(np.array([[100.0, 0.0, 0.0, 0.0]]), (2000, 1))
    assert (m.gnmax(h, 10.0, rng()) == 0).all()


def test_discrete_gnmax_returns_valid_labels() -> None:
    h = np.array([[5.0, 4.0, 0.0]] * 20)
    labels = m.gnmax(h, 1.0, rng(), discrete=True)
    assert labels.shape == (20,) and set(labels.tolist()) <= {0, 1, 2}


def test_laplace_noisy_max_shapes() -> None:
    assert m.laplace_noisy_max(np.array([[3.0, 0.0]] * 7), 1.0, rng()).shape == (7,)


def lnmax_first_wins(gap: int, t: int) -> float:
    """P[k0 + Z0 >= k1 + Z1] = P[Z1 - Z0 <= gap] for exact discrete Laplace Z of scale t,
    k0 - k1 = ``gap`` grid points (ties go to class 0), by convolving the two laws."""
    support = np.arange(-40 * t, 40 * t + 1)
    q = np.exp(-1.0 / t)
    pmf = (1 - q) / (1 + q) * q ** np.abs(support)
    diff = np.convolve(pmf, pmf[::-1])  # Z1 - Z0 on -80t .. 80t
    return float(diff[: 80 * t + gap + 1].sum())


@pytest.mark.parametrize(("counts", "scale"), [((0.25, 0.0), 0.25), ((0.3, 1.0), 0.5)])
def test_laplace_noisy_max_has_the_exact_grid_law(
    counts: tuple[float, float], scale: float
) -> None:
    s = m.LAPLACE_RESOLUTION
    t = int(np.ceil(scale * s))
    gap = int(np.floor(counts[0] * s) - np.floor(counts[1] * s))
    n = 40_000
    labels = m.laplace_noisy_max(np.array([counts] * n), scale, rng(f"lnmax{scale}"))
    wins = int((labels == 0).sum())
    p = lnmax_first_wins(gap, t)
    assert abs(wins - n * p) < 4 * np.sqrt(n * p * (1 - p))
    # Teeth: the law at twice the scale is far outside those counts.
    q = lnmax_first_wins(gap, 2 * t)
    assert abs(wins - n * q) > 10 * np.sqrt(n * q * (1 - q))


def test_laplace_noisy_max_is_pure_dp_at_two_over_its_scale() -> None:
    # Neighbours: one vote moves from class 0 to class 1. The exact law's ratio, both ways.
    s, scale = m.LAPLACE_RESOLUTION, 0.5
    t = int(np.ceil(scale * s))
    for before in range(-3, 4):
        a, b = lnmax_first_wins(before * s, t), lnmax_first_wins((before - 2) * s, t)
        bound = np.exp(2 * s / t) * (1 + 1e-9)
        assert a <= bound * b and (1 - b) <= bound * (1 - a)
    # Teeth: the ratio is near the bound, so a charge of half of it would be wrong.
    a, b = lnmax_first_wins(-s, t), lnmax_first_wins(-3 * s, t)
    assert a > np.exp(s / t) * b


@pytest.mark.parametrize(
    ("hist", "message"),
    [
        (np.array([[1.0, np.nan]]), "finite"),
        (np.array([[1.0, -1.0]]), "non-negative"),
        (np.ones((2, 2, 2)), "shape"),
        (np.ones((3, 1)), "at least 2 classes"),
    ],
)
def test_bad_histograms_are_rejected(hist: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        m.gnmax(hist, 1.0, rng())


def test_bad_noise_shape_and_sigma() -> None:
    with pytest.raises(ValueError, match="shape"):
        m.noisy_argmax(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="sigma"):
        m.gnmax(np.ones((2, 3)), 0.0, rng())
    with pytest.raises(ValueError, match="eta1"):
        m.confident_decide(np.ones((2, 3)), 1.0, np.ones(3), np.ones((2, 3)))


def test_multilabel_decide_and_confidence() -> None:
    counts = np.array([[9.0, 1.0, 5.0]])
    zero = np.zeros_like(counts)
    assert m.multilabel_decide(counts, 5.0, zero).tolist() == [[1, 0, 1]]
    out = m.multilabel_decide(counts, 5.0, zero, confidence_threshold=3.0, confidence_noise=zero)
    assert out.tolist() == [[1, 0, m.NOT_ANSWERED]]


def test_binary_and_tau_voting_on_clear_votes() -> None:
    votes = np.zeros((4, 30, 5))
    votes[:, :, [0, 2]] = 1.0
    counts = m.binary_counts(votes)
    assert counts.tolist()[0] == [30.0, 0.0, 30.0, 0.0, 0.0]
    labels = m.binary_voting(counts, 30, 1.0, rng())
    assert (labels == np.array([1, 0, 1, 0, 0])).all()
    # Clipped to norm 1, each positive label still gets 30 / sqrt(2) ~ 21.2 > 15.
    tau_counts = m.tau_counts(votes, 1.0)
    assert tau_counts[0, 0] == pytest.approx(30 / np.sqrt(2))
    tau = m.tau_voting(tau_counts, 30, 1.0, rng())
    assert (tau == np.array([1, 0, 1, 0, 0])).all()


def test_tau_clipping_norms() -> None:
    votes = np.zeros((1, 2, 4))
    votes[0, 0] = 1.0
    votes[0, 1, 0] = 1.0
    clipped = m.clip_votes(votes, 1.0)
    assert np.linalg.norm(clipped[0, 0]) == pytest.approx(1.0)
    assert clipped[0, 1].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_powerset_round_trip() -> None:
    votes = np.array([[[1, 0, 1], [1, 0, 1], [0, 1, 0]]], dtype=float)
    hist = m.powerset_histogram(votes)
    assert hist.shape == (1, 8) and hist[0, 0b101] == 2 and hist[0, 0b010] == 1
    assert m.powerset_decide(hist, np.zeros_like(hist), 3).tolist() == [[1, 0, 1]]
    with pytest.raises(ValueError, match="at most 9"):
        m.powerset_histogram(np.zeros((1, 2, 11)))


def test_powerset_takes_the_same_k_in_every_path_and_the_docs() -> None:
    # One limit for the plain histogram, the secure mechanism, the advisor and the docs:
    # they once disagreed (12 in the plain path, 10 in the circuit).
    k = m.MAX_POWERSET_LABELS
    assert k == 9  # 2**10 subsets have no vote statement (issue 41)
    docs = (Path(__file__).parents[2] / "docs" / "multilabel.md").read_text()
    stated = re.findall(r"`powerset` \(k <= (\d+)\)", docs)
    assert stated == [str(k)]
    privacy = (Path(__file__).parents[2] / "docs" / "privacy.md").read_text()
    assert re.findall(r"Powerset takes k <= (\d+)", privacy) == [str(k)]
    assert m.powerset_histogram(np.zeros((1, 2, k))).shape == (1, 2**k)
    assert from_config({"name": "powerset", "sigma": 2}, k).vote_width == 2**k
    with pytest.raises(ValueError, match=f"at most {k} labels"):
        m.powerset_histogram(np.zeros((1, 2, k + 1)))
    with pytest.raises(MechanismError, match="powerset takes"):
        from_config({"name": "powerset", "sigma": 2}, k + 1)
    for labels, offered in ((k, True), (k + 1, False)):
        stats = advisor.LabelStatistics(num_labels=labels, mean_l2=1.0, distinct_subsets=2)
        rec = advisor.recommend(stats, num_teachers=10, queries=100, epsilon=4.0, delta=1e-5)
        assert ("powerset" in {o.mechanism for o in rec.options}) is offered


def test_weighted_and_vanishing_histograms() -> None:
    labels = np.array([[0, 1, 1], [2, 2, 0]])
    h = m.weighted_histogram(labels, np.array([3.0, 1.0, 1.0]), 3)
    assert h.tolist() == [[3.0, 2.0, 0.0], [1.0, 0.0, 4.0]]
    mask = np.array([[True, False, True], [False, False, False]])
    assert m.participating_histogram(labels, mask, 3).tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="labels must lie"):
        m.weighted_histogram(np.array([[5]]), np.ones(1), 3)


def test_participation_rates() -> None:
    mask = m.sample_participation(np.array([0.0, 0.3, 1.0]), 20_000, rng())
    rates = mask.mean(axis=0)
    assert rates[0] == 0.0 and rates[2] == 1.0 and abs(rates[1] - 0.3) < 0.015


def test_weights_follow_caps() -> None:
    w = m.weights_for_caps(np.array([np.log(2), np.log(8)]), 1e-5, 40.0, 200)
    assert 0 < w[0] < w[1]


def test_upsampling_assignment_is_distinct() -> None:
    teams = m.assign_upsampled(np.array([0, 2, 5]), 5, rng())
    assert [t.size for t in teams] == [0, 2, 5]
    assert len(set(teams[2].tolist())) == 5


def test_secure_noise_moments() -> None:
    r = rng("moments")
    g = r.normal(200_000, 3.0)
    lap = r.laplace(200_000, 2.0)
    assert abs(g.mean()) < 0.05 and abs(g.std() - 3.0) < 0.03
    assert abs(lap.mean()) < 0.05 and abs(lap.std() - 2.0 * np.sqrt(2)) < 0.05
    assert scipy.stats.kstest(g / 3.0, "norm").pvalue > 1e-4


def test_secure_random_seeding() -> None:
    assert SecureRandom.from_seed(1).random_bytes(16) == SecureRandom.from_seed(1).random_bytes(16)
    assert SecureRandom().random_bytes(16) != SecureRandom().random_bytes(16)
