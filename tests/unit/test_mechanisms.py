"""Mechanism primitives and plaintext forms: explicit noise, sampled noise, edge cases and
bad input, on the mechanism objects the services and the central driver run."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from capc.mechanisms import Mechanism, MechanismError, Personalization, from_config
from capc.mechanisms.argmax import LAPLACE_RESOLUTION, laplace_noisy_max, noisy_argmax
from capc.mechanisms.base import NOT_ANSWERED, gaussian_noise
from capc.mechanisms.powerset import MAX_POWERSET_LABELS, subset_bits
from capc.planning import advisor
from capc.privacy.accountants import RenyiDp
from capc.privacy.randomness import SecureRandom


def rng(seed: str = "t") -> SecureRandom:
    return SecureRandom.from_seed(seed)


def gnmax(classes: int, sigma: float) -> Mechanism:
    return from_config({"name": "gnmax", "sigma": sigma}, classes)


def confident(classes: int, threshold: float, sigma1: float, sigma: float) -> Mechanism:
    return from_config(
        {"name": "confident-gnmax", "sigma": sigma, "threshold": threshold, "sigma1": sigma1},
        classes,
    )


def test_noisy_argmax_breaks_ties_to_lowest_index() -> None:
    h = np.array([[3.0, 5.0, 5.0], [0.0, 0.0, 0.0]])
    assert noisy_argmax(h, np.zeros_like(h)).tolist() == [1, 0]


def test_gnmax_noise_is_the_secure_gaussian_and_decides_by_noisy_argmax() -> None:
    h = np.array([[10.0, 9.0, 0.0], [0.0, 1.0, 7.0]])
    mech = gnmax(3, 2.0)
    drawn = mech.draw_noise(2, rng("a"))
    np.testing.assert_array_equal(drawn["eta2"], gaussian_noise(h.shape, 2.0, rng("a")))
    labels, answered = mech.decide(h, drawn)
    assert np.array_equal(labels, noisy_argmax(h, drawn["eta2"])) and answered.all()


def test_confident_gnmax_answers_only_above_threshold() -> None:
    h = np.array([[200.0, 50.0], [120.0, 130.0]])
    mech = confident(2, 150.0, 1.0, 1.0)
    labels, answered = mech.decide(h, {"eta1": np.zeros(2), "eta2": np.zeros_like(h)})
    assert answered.tolist() == [True, False]
    assert labels.tolist() == [0, NOT_ANSWERED]


def test_confident_gnmax_draws_answer_noise_then_test_noise() -> None:
    # The order the guardian draws in, and the one every replaying test follows.
    h = np.array([[200.0, 50.0, 0.0]] * 50)
    mech = confident(3, 180.0, 30.0, 10.0)
    got = mech.draw_noise(50, rng("c"))
    r = rng("c")
    eta2 = gaussian_noise(h.shape, 10.0, r)
    eta1 = gaussian_noise((50,), 30.0, r)
    np.testing.assert_array_equal(got["eta2"], eta2)
    np.testing.assert_array_equal(got["eta1"], eta1)
    labels, answered = mech.decide(h, got)
    want = h.max(axis=1) + eta1 >= 180.0
    np.testing.assert_array_equal(answered, want)
    assert 0 < want.sum() < 50
    np.testing.assert_array_equal(labels, np.where(want, noisy_argmax(h, eta2), NOT_ANSWERED))


def test_gnmax_is_accurate_on_clear_majorities() -> None:
    h = np.tile(np.array([[100.0, 0.0, 0.0, 0.0]]), (2000, 1))
    mech = gnmax(4, 10.0)
    assert (mech.decide(h, mech.draw_noise(2000, rng()))[0] == 0).all()


def test_discrete_noise_is_integer_and_decides_valid_labels() -> None:
    h = np.array([[5.0, 4.0, 0.0]] * 20)
    noise = gaussian_noise(h.shape, 1.0, rng(), discrete=True)
    assert np.array_equal(noise, np.rint(noise)) and noise.std() > 0
    labels, _ = gnmax(3, 1.0).decide(h, {"eta2": noise})
    assert labels.shape == (20,) and set(labels.tolist()) <= {0, 1, 2}


def test_laplace_noisy_max_shapes() -> None:
    assert laplace_noisy_max(np.array([[3.0, 0.0]] * 7), 1.0, rng()).shape == (7,)


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
    s = LAPLACE_RESOLUTION
    t = int(np.ceil(scale * s))
    gap = int(np.floor(counts[0] * s) - np.floor(counts[1] * s))
    n = 40_000
    labels = laplace_noisy_max(np.array([counts] * n), scale, rng(f"lnmax{scale}"))
    wins = int((labels == 0).sum())
    p = lnmax_first_wins(gap, t)
    assert abs(wins - n * p) < 4 * np.sqrt(n * p * (1 - p))
    # Teeth: the law at twice the scale is far outside those counts.
    q = lnmax_first_wins(gap, 2 * t)
    assert abs(wins - n * q) > 10 * np.sqrt(n * q * (1 - q))


def test_laplace_noisy_max_is_pure_dp_at_two_over_its_scale() -> None:
    # Neighbours: one vote moves from class 0 to class 1. The exact law's ratio, both ways.
    s, scale = LAPLACE_RESOLUTION, 0.5
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
        noisy_argmax(hist, np.zeros_like(hist))


def test_bad_noise_shape_and_sigma() -> None:
    with pytest.raises(MechanismError, match="shape"):
        noisy_argmax(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(MechanismError, match="finite"):
        noisy_argmax(np.ones((2, 3)), np.full((2, 3), np.inf))
    with pytest.raises(ValueError, match="sigma"):
        gaussian_noise((2, 3), 0.0, rng())
    with pytest.raises(MechanismError, match="sigma"):
        gnmax(3, 0.0)
    with pytest.raises(MechanismError, match="eta1"):
        confident(3, 1.0, 1.0, 1.0).decide(
            np.ones((2, 3)), {"eta1": np.ones(3), "eta2": np.ones((2, 3))}
        )


def test_per_label_decisions_and_confidence() -> None:
    counts = np.array([[9.0, 1.0, 5.0]])
    zero = {"noise": np.zeros_like(counts), "confidence": np.zeros_like(counts)}
    labels, _ = from_config({"name": "binary", "sigma": 1.0}, 3).decide(counts, zero, 5.0)
    assert labels.tolist() == [[1, 0, 1]]
    tested = from_config({"name": "binary", "sigma": 1.0, "threshold": 3.0, "sigma1": 1.0}, 3)
    labels, answered = tested.decide(counts, zero, 5.0)
    assert labels.tolist() == [[1, 0, NOT_ANSWERED]]
    assert answered.tolist() == [[True, True, False]]
    with pytest.raises(MechanismError, match="decision threshold"):
        tested.decide(counts, zero)


def test_binary_and_tau_voting_on_clear_votes() -> None:
    votes = np.zeros((4, 30, 5), dtype=np.int64)
    votes[:, :, [0, 2]] = 1
    binary = from_config({"name": "binary", "sigma": 1.0}, 5)
    counts = binary.summed_votes(votes)
    assert counts.tolist()[0] == [30.0, 0.0, 30.0, 0.0, 0.0]
    labels, _ = binary.decide(counts, binary.draw_noise(4, rng()), 15.0)
    assert (labels == np.array([1, 0, 1, 0, 0])).all()
    # Clipped to norm 1, each positive label still gets 30 / sqrt(2) ~ 21.2 > 15.
    tau = from_config({"name": "tau", "sigma": 1.0, "tau": 1.0}, 5)
    tau_counts = tau.summed_votes(votes)
    assert tau_counts[0, 0] == pytest.approx(30 / np.sqrt(2))
    labels, _ = tau.decide(tau_counts, tau.draw_noise(4, rng()), 15.0)
    assert (labels == np.array([1, 0, 1, 0, 0])).all()


def test_tau_clipping_norms() -> None:
    votes = np.array([[1, 1, 1, 1], [1, 0, 0, 0]])
    clipped = from_config({"name": "tau", "sigma": 1.0, "tau": 1.0}, 4).unit_votes(votes)
    assert np.linalg.norm(clipped[0]) == pytest.approx(1.0)
    assert clipped[1].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_powerset_round_trip() -> None:
    votes = np.array([[[1, 0, 1], [1, 0, 1], [0, 1, 0]]])
    mech = from_config({"name": "powerset", "sigma": 1.0}, 3)
    hist = mech.summed_votes(votes)
    assert hist.shape == (1, 8) and hist[0, 0b101] == 2 and hist[0, 0b010] == 1
    labels, _ = mech.decide(hist, {"eta2": np.zeros_like(hist)})
    assert labels.tolist() == [[1, 0, 1]]
    assert subset_bits(np.array([0b101, 0b010]), 3).tolist() == [[1, 0, 1], [0, 1, 0]]
    with pytest.raises(MechanismError, match=r"1 to 9 labels.*at most 9"):
        from_config({"name": "powerset", "sigma": 1.0}, 11)


def test_powerset_takes_the_same_k_in_every_path_and_the_docs() -> None:
    # One limit for the plain histogram, the secure mechanism, the advisor and the docs:
    # they once disagreed (12 in the plain path, 10 in the circuit).
    k = MAX_POWERSET_LABELS
    assert k == 9  # 2**10 subsets have no vote statement (issue 41)
    docs = (Path(__file__).parents[2] / "docs" / "multilabel.md").read_text()
    stated = re.findall(r"`powerset` \(k <= (\d+)\)", docs)
    assert stated == [str(k)]
    privacy = (Path(__file__).parents[2] / "docs" / "privacy.md").read_text()
    assert re.findall(r"Powerset takes k <= (\d+)", privacy) == [str(k)]
    mech = from_config({"name": "powerset", "sigma": 2}, k)
    assert mech.vote_width == 2**k
    assert mech.summed_votes(np.zeros((1, 2, k), dtype=np.int64)).shape == (1, 2**k)
    with pytest.raises(MechanismError, match=f"powerset takes .*at most {k} labels"):
        from_config({"name": "powerset", "sigma": 2}, k + 1)
    for labels, offered in ((k, True), (k + 1, False)):
        stats = advisor.LabelStatistics(num_labels=labels, mean_l2=1.0, distinct_subsets=2)
        rec = advisor.recommend(stats, num_teachers=10, queries=100, epsilon=4.0, delta=1e-5)
        assert ("powerset" in {o.mechanism for o in rec.options}) is offered


def test_weighted_and_vanishing_votes() -> None:
    # Three teachers of weights 3, 1, 1; then only the participating ones.
    labels = np.array([[0, 1, 1], [2, 2, 0]])
    mech = gnmax(3, 1.0)
    weighted = sum(mech.encode_votes(labels[:, i], weight=w) for i, w in enumerate((3.0, 1.0, 1.0)))
    assert np.asarray(weighted).tolist() == [[3, 2, 0], [1, 0, 4]]
    mask = np.array([[True, False, True], [False, False, False]])
    voted = sum(mech.encode_votes(labels[:, i], participation=mask[:, i]) for i in range(3))
    assert np.asarray(voted).tolist() == [[1, 1, 0], [0, 0, 0]]
    with pytest.raises(MechanismError, match="must lie in"):
        mech.encode_votes(np.array([5]))


def test_participation_rates() -> None:
    mask = Personalization.participation([0.0, 0.3, 1.0], 20_000, rng())
    assert mask.shape == (20_000, 3)
    rates = mask.mean(axis=0)
    assert rates[0] == 0.0 and rates[2] == 1.0 and abs(rates[1] - 0.3) < 0.015
    with pytest.raises(MechanismError, match="probabilities"):
        Personalization.participation([0.5, 1.5], 10, rng())


def test_weights_follow_caps() -> None:
    plan = Personalization(mode="weighting", planned_queries=200)
    w = plan.weights([np.log(2), np.log(8)], gnmax(10, 40.0), RenyiDp(), 1e-5, frac_bits=16)
    assert 0 < w[0] < w[1]


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


def test_the_library_example_in_the_usage_docs_runs(capsys: pytest.CaptureFixture[str]) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "usage.md").read_text()
    section = docs.split("## The privacy library", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(example, "docs/usage.md", "exec"), {})
    report = capsys.readouterr().out
    # The example charged something, and said so.
    assert "hospital-a" in report and "epsilon" in report.lower()
