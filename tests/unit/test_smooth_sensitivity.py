"""Smooth-sensitivity release: the local-sensitivity bound holds on real neighbours."""

from __future__ import annotations

import numpy as np
import pytest

from capc.privacy import smooth_sensitivity as ss
from capc.privacy.randomness import SecureRandom

N, K, SIGMA2, SIGMA1, T, ORDER = 50, 4, 4.0, 6.0, 30.0, 8.0


def _total(hist: np.ndarray, answered: np.ndarray) -> float:
    srt = np.sort(hist, axis=1)
    gap = (srt[:, -1] - srt[:, -2]).astype(int)[answered]
    mx = srt[:, -1].astype(int)
    gn = ss.gnmax_gap_table(N, K, SIGMA2, ORDER)
    thr = ss.threshold_table(N, T, SIGMA1, ORDER)
    return float(gn[gap].sum() + thr[mx].sum())


def _random_hist(rng: np.random.Generator, queries: int) -> np.ndarray:
    h = np.zeros((queries, K))
    for b in range(queries):
        np.add.at(h[b], rng.choice(K, size=N, p=rng.dirichlet(np.ones(K) * 0.3)), 1.0)
    return h


def test_release_cost_formula() -> None:
    assert ss.release_rdp(0.01, 10.0, 8.0) == pytest.approx(
        8 * np.exp(0.02) / 100 + (0.08 - 0.5 * np.log(1 - 0.16)) / 7
    )
    with pytest.raises(ValueError, match="order"):
        ss.release_rdp(0.1, 10.0, 8.0)


def test_one_teacher_changes_total_by_at_most_local_sensitivity() -> None:
    # Move one teacher's vote on every query (the neighbouring relation) many times over.
    gen = np.random.default_rng(7)
    hist = _random_hist(gen, 30)
    answered = np.ones(30, dtype=bool)
    release = ss.sanitise(
        hist,
        answered,
        N,
        SIGMA2,
        ORDER,
        1e-5,
        SecureRandom.from_seed(1),
        threshold=T,
        sigma1=SIGMA1,
        beta=1e-9,
    )
    # With beta ~ 0 the smooth sensitivity is at least the local sensitivity at distance 0.
    base = _total(hist, answered)
    for _ in range(300):
        moved = hist.copy()
        for b in range(moved.shape[0]):
            src = gen.choice(np.flatnonzero(moved[b] > 0))
            moved[b, src] -= 1
            moved[b, gen.integers(K)] += 1
        assert abs(_total(moved, answered) - base) <= release.smooth_sensitivity + 1e-12


def release(hist: np.ndarray, answered: np.ndarray, seed: int) -> ss.SanitisedEpsilon:
    return ss.sanitise(
        hist,
        answered,
        N,
        SIGMA2,
        ORDER,
        1e-5,
        SecureRandom.from_seed(seed),
        threshold=T,
        sigma1=SIGMA1,
    )


def test_release_reports_its_parameters_and_is_reproducible() -> None:
    hist = _random_hist(np.random.default_rng(3), 20)
    answered = np.ones(20, dtype=bool)
    a, b = (release(hist, answered, 5) for _ in range(2))
    assert a == b
    assert a.beta == pytest.approx(0.2 / ORDER) and a.release_rdp > 0
    assert a.epsilon_std == pytest.approx(a.smooth_sensitivity * a.sigma_ss)
    assert a.expected_epsilon > 0


def test_rejects_non_integer_or_too_many_votes() -> None:
    with pytest.raises(ValueError, match="integer vote counts"):
        ss.sanitise(np.array([[1.5, 0.0]]), np.array([True]), 5, 1.0, 4.0, 1e-5, SecureRandom())
    with pytest.raises(ValueError, match="integer vote counts"):
        ss.sanitise(np.array([[6.0, 0.0]]), np.array([True]), 5, 1.0, 4.0, 1e-5, SecureRandom())
