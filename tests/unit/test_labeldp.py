"""ALIBI, randomized response and PATE-FM: their guarantees checked against the mechanisms.

ALIBI's posterior is compared with Bayes' rule on Laplace densities and on
the discrete Laplace law of its grid, written out independently; its privacy
with the exact likelihood ratio of the released grid vectors (teeth: half
the noise breaks the claimed epsilon); its noise with the exact law. Randomized
response's output distribution is exact. PATE-FM's query count is fixed by the
budget before any vote: labels cannot move it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from capc.labeldp import alibi, pate_fm, rr
from capc.learning.fixmatch import FixMatchConfig, ViewBank
from capc.mechanisms import from_config
from capc.onehot import one_hot
from capc.privacy import accountants, events, gaussian_dp
from capc.privacy.randomness import SecureRandom


def laplace_log_likelihood(o: np.ndarray, label: int, scale: float) -> float:
    """log p(o | y = label) for the released vector o, written from the densities."""
    target = np.zeros_like(o)
    target[label] = 1.0
    return float(np.sum(-np.abs(o - target) / scale - math.log(2 * scale)))


def test_grid_scale_and_event() -> None:
    assert alibi.laplace_scale(2.0) == 1.0
    assert alibi.grid(2.0) == alibi.Grid(256, 256) and alibi.grid(0.25).noise == 2048
    odd = alibi.grid(1.5)  # 512 / 1.5 is not an integer: t rounds up, epsilon down
    assert odd.noise == 342 and odd.epsilon == Fraction(512, 342) < Fraction(1.5)
    assert alibi.grid(1000.0) == alibi.Grid(256, 1) and alibi.grid(1000.0).epsilon == 512
    for eps in (0.1, 0.3, 1.0, 3.7, 8.0):
        g = alibi.grid(eps)
        assert g.epsilon <= Fraction(eps) and g.epsilon > Fraction(eps) * (1 - Fraction(1, g.noise))
    assert alibi.label_event(0.5) == events.PureDpEvent(0.5)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="epsilon"):
            alibi.laplace_scale(bad)


def test_posterior_is_bayes_rule_on_laplace_densities() -> None:
    rng = np.random.default_rng(0)
    classes, scale = 5, 0.7
    o = rng.normal(0.3, 1.0, (20, classes))
    prior = rng.dirichlet(np.ones(classes), 20)
    got = alibi.posterior(torch.tensor(o), scale, torch.tensor(np.log(prior))).numpy()
    for i in range(20):
        joint = np.array(
            [math.exp(laplace_log_likelihood(o[i], c, scale)) * prior[i, c] for c in range(classes)]
        )
        np.testing.assert_allclose(got[i], joint / joint.sum(), rtol=1e-9)


def test_released_vector_is_epsilon_dp_and_half_the_noise_is_not() -> None:
    """The log-likelihood ratio of any released vector between two labels is at most eps."""
    eps, classes = 1.5, 4
    o = SecureRandom.from_seed("o").normal((2000, classes), 2.0)
    scale = alibi.laplace_scale(eps)
    ratios = [laplace_log_likelihood(v, 0, scale) - laplace_log_likelihood(v, 1, scale) for v in o]
    assert max(ratios) <= eps + 1e-12 and max(ratios) > 0.95 * eps  # attained where o is extreme
    broken = [
        laplace_log_likelihood(v, 0, scale / 2) - laplace_log_likelihood(v, 1, scale / 2) for v in o
    ]
    assert max(broken) > eps


def discrete_log_likelihood(k: np.ndarray, label: int, s: int, t: int) -> float:
    """log P[k | y = label] for the released grid integers k, from the discrete Laplace law."""
    q = math.exp(-1.0 / t)
    target = np.zeros_like(k)
    target[label] = s
    return float(np.sum(np.log((1 - q) / (1 + q)) - np.abs(k - target) / t))


def test_posterior_is_bayes_rule_on_the_grid_law() -> None:
    g = alibi.grid(1.0)
    rng = np.random.default_rng(1)
    k = rng.integers(-3 * g.noise, 3 * g.noise, (20, 4))
    prior = rng.dirichlet(np.ones(4), 20)
    o = torch.tensor(k / g.resolution)
    got = alibi.posterior(o, g.scale, torch.tensor(np.log(prior))).numpy()
    for i in range(20):
        logs = [discrete_log_likelihood(k[i], c, g.resolution, g.noise) for c in range(4)]
        joint = np.exp(np.array(logs) - max(logs)) * prior[i]
        np.testing.assert_allclose(got[i], joint / joint.sum(), rtol=1e-9)


def test_grid_release_is_exactly_its_epsilon_dp_and_half_the_noise_is_not() -> None:
    """The log-likelihood ratio of every released grid vector between two labels is at most
    2s/t and reaches it; with t halved it exceeds the claim."""
    eps = 2.0
    g = alibi.grid(eps)
    k = alibi.release(np.arange(3000) % 3, 3, eps, SecureRandom.from_seed("grid"))
    s, t = g.resolution, g.noise
    ratios = [discrete_log_likelihood(v, 0, s, t) - discrete_log_likelihood(v, 1, s, t) for v in k]
    assert max(ratios) <= float(g.epsilon) + 1e-9 and max(ratios) > float(g.epsilon) - 1e-9
    broken = [
        discrete_log_likelihood(v, 0, s, t // 2) - discrete_log_likelihood(v, 1, s, t // 2)
        for v in k
    ]
    assert max(broken) > eps
    odds = alibi.log_odds(k / s, np.zeros(3000, int), np.ones(3000, int), g.scale)
    np.testing.assert_allclose(odds, ratios, atol=1e-9)


def test_noisy_labels_are_on_the_grid_with_the_exact_noise() -> None:
    y = np.arange(4000) % 10
    o = alibi.noisy_labels(y, 10, 2.0, SecureRandom.from_seed(1))
    k = o * alibi.RESOLUTION
    np.testing.assert_array_equal(k, np.round(k))  # on the grid, division exact
    noise = o - one_hot(y, 10)
    # scale lambda = 1: mean |x| = 1, variance 2, to O(1/t^2).
    assert abs(np.abs(noise).mean() - 1.0) < 0.02 and abs(noise.var() - 2.0) < 0.1
    # A coarse grid (t = 2): the noise in grid units has the discrete Laplace law exactly.
    z = alibi.release(np.zeros(50_000, dtype=np.int64), 2, 256.0, SecureRandom.from_seed(2))
    z[:, 0] -= alibi.RESOLUTION
    q = math.exp(-0.5)
    for v in range(-3, 4):
        p = (1 - q) / (1 + q) * q ** abs(v)
        assert abs((z == v).mean() - p) < 5 * math.sqrt(p * (1 - p) / z.size)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        alibi.noisy_labels(np.array([10]), 10, 1.0, SecureRandom.from_seed(1))


def test_randomized_response_distribution_is_exact() -> None:
    eps, classes, n = 1.0, 5, 200_000
    p = rr.keep_probability(eps, classes)
    assert p == pytest.approx(math.exp(eps) / (math.exp(eps) + classes - 1))
    out = rr.randomize(np.zeros(n, dtype=np.int64), classes, eps, SecureRandom.from_seed(2))
    freq = np.bincount(out, minlength=classes) / n
    other = (1 - p) / (classes - 1)
    assert abs(freq[0] - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(freq[1:] - other) < 4 * math.sqrt(other * (1 - other) / n))
    assert p / other == pytest.approx(math.exp(eps))
    assert rr.event(eps) == events.PureDpEvent(eps)


def bank_and_labels(n: int = 300, seed: int = 0) -> tuple[ViewBank, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    clean = 4.0 * np.eye(3)[y] + rng.standard_normal((n, 3))
    weak = clean[:, None] + 0.2 * rng.standard_normal((n, 2, 3))
    strong = clean[:, None] + 0.6 * rng.standard_normal((n, 2, 3))
    return ViewBank(tensor(clean), tensor(weak), tensor(strong)), y


def tensor(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float32)


def config(epsilon: float, **kw: object) -> pate_fm.PateFmConfig:
    quick = FixMatchConfig(steps=40, batch=8, unlabelled_ratio=4)
    base: dict[str, object] = {
        "epsilon": epsilon,
        "mechanism": {"name": "confident-gnmax", "sigma": 8.0, "sigma1": 6.0, "threshold": 10.0},
        "teachers": 30,
        "teacher": quick,
        "student": quick,
        "selection": "random",
    }
    base.update(kw)
    return pate_fm.PateFmConfig(**base)  # type: ignore[arg-type]


def test_pate_fm_fixes_its_query_count_from_the_budget_and_stays_within_it() -> None:
    bank, y = bank_and_labels()
    cfg = config(3.0)
    mech = from_config(cfg.mechanism, 3)
    acct = accountants.make("gdp")
    # Independently: every query costs (1/sigma1)^2 + 2/sigma^2 in mu^2 if answered.
    per_query = math.sqrt(1 / 6.0**2 + 2 / 8.0**2)
    expected = gaussian_dp.max_queries_gdp(per_query, 3.0, 1e-5)
    assert pate_fm.budget_queries(mech, acct, 3.0, 1e-5) == expected
    result = pate_fm.label_pool(bank, np.arange(300), y, 3, cfg, SecureRandom.from_seed("pate"))
    assert len(result.queries) == expected == result.budget_queries
    assert result.event == mech.event(result.answered)
    assert result.epsilon <= 3.0
    tests_ = len(result.queries)
    answers = int(result.answered.sum())
    mu = math.sqrt(tests_ / 36.0 + 2 * answers / 64.0)
    assert result.epsilon == pytest.approx(gaussian_dp.epsilon_at(mu, 1e-5), rel=1e-9)
    answered = result.labels[result.answered]
    assert (answered == y[result.queries][result.answered]).mean() > 0.8
    assert result.teacher_votes.shape == (expected, 30)


def test_labels_cannot_move_what_pate_fm_asks() -> None:
    bank, y = bank_and_labels()
    other = (y + 1) % 3
    a = pate_fm.label_pool(bank, np.arange(300), y, 3, config(2.0), SecureRandom.from_seed(0))
    b = pate_fm.label_pool(bank, np.arange(300), other, 3, config(2.0), SecureRandom.from_seed(0))
    np.testing.assert_array_equal(a.queries, b.queries)
    assert a.budget_queries == b.budget_queries


def test_pate_fm_refuses_a_budget_that_pays_for_nothing() -> None:
    bank, y = bank_and_labels()
    with pytest.raises(ValueError, match="does not pay for one query"):
        pate_fm.label_pool(bank, np.arange(300), y, 3, config(1e-4), SecureRandom.from_seed(0))
    with pytest.raises(ValueError, match="selection"):
        config(1.0, selection="votes")


def test_prototype_queries_are_distinct_and_label_free() -> None:
    bank, _ = bank_and_labels()
    q = pate_fm.select_queries(bank, 12, "prototypes", 0)
    assert len(np.unique(q)) == 12 and q.min() >= 0 and q.max() < len(bank)
    np.testing.assert_array_equal(q, pate_fm.select_queries(bank, 12, "prototypes", 0))
