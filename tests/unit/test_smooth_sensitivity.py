"""Smooth-sensitivity release: the local-sensitivity bound holds on real neighbours."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from capc.audit import canaries
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


# ---------------------------------------------------------------------------
# Brute force over every histogram a dataset can reach: the smooth sensitivity
# must cover them all, and no histogram that cannot occur may drive it.
# ---------------------------------------------------------------------------

Hist = tuple[int, ...]


def compositions(total: int, k: int) -> list[Hist]:
    """Every histogram of k non-negative counts summing to ``total``."""
    out = []
    for cut in itertools.combinations(range(total + k - 1), k - 1):
        edges = (-1, *cut, total + k - 1)
        out.append(tuple(edges[i + 1] - edges[i] - 1 for i in range(k)))
    return out


def one_moves(h: Hist) -> Iterator[Hist]:
    """Every histogram one teacher's vote change away from ``h``."""
    for i, j in itertools.permutations(range(len(h)), 2):
        if h[i] > 0:
            moved = list(h)
            moved[i] -= 1
            moved[j] += 1
            yield tuple(moved)


def brute_local_sensitivity(
    h: Hist, charged: Callable[[Hist], float], max_distance: int
) -> np.ndarray:
    """LS_d for d = 0..max_distance: the largest one-move change of ``charged`` at any
    histogram within d vote moves of ``h``, over every histogram that can occur."""
    change = {
        x: max(abs(charged(y) - charged(x)) for y in one_moves(x))
        for x in compositions(sum(h), len(h))
    }
    dist = {h: 0}
    frontier = collections.deque([h])
    while frontier:
        x = frontier.popleft()
        for y in one_moves(x):
            if y not in dist:
                dist[y] = dist[x] + 1
                frontier.append(y)
    ls = np.zeros(max_distance + 1)
    for x, d in dist.items():
        ls[min(d, max_distance) :] = np.maximum(ls[min(d, max_distance) :], change[x])
    return ls


def brute_smooth_sensitivity(
    hists: list[Hist],
    answered: list[bool],
    n: int,
    sigma2: float,
    order: float,
    beta: float,
    threshold: float | None,
    sigma1: float | None,
) -> float:
    """max_d exp(-beta d) sum over queries of LS_d: every query may move by d votes at once."""
    k = len(hists[0])
    gn = ss.gnmax_gap_table(n, k, sigma2, order)
    thr = None if threshold is None else ss.threshold_table(n, threshold, sigma1 or 1.0, order)

    def charged_for(ans: bool) -> Callable[[Hist], float]:
        def charged(x: Hist) -> float:
            top, second = sorted(x)[-1], sorted(x)[-2]
            return (gn[top - second] if ans else 0.0) + (0.0 if thr is None else thr[top])

        return charged

    reach = 2 * n
    total = sum(
        brute_local_sensitivity(h, charged_for(a), reach)
        for h, a in zip(hists, answered, strict=True)
    )
    return float(np.max(np.exp(-beta * np.arange(reach + 1)) * total))


def library_smooth_sensitivity(
    hists: list[Hist],
    answered: list[bool],
    n: int,
    sigma2: float,
    order: float,
    beta: float,
    threshold: float | None,
    sigma1: float | None,
) -> ss.SanitisedEpsilon:
    return ss.sanitise(
        np.array(hists, dtype=np.float64),
        np.array(answered),
        n,
        sigma2,
        order,
        1e-5,
        SecureRandom.from_seed(0),
        threshold=threshold,
        sigma1=sigma1,
        beta=beta,
    )


@pytest.mark.parametrize(("total", "k"), [(0, 3), (1, 2), (5, 2), (12, 3), (13, 5), (9, 4)])
def test_reachable_statistics_are_exactly_those_of_some_histogram(total: int, k: int) -> None:
    hists = compositions(total, k)
    size = total + 4
    tops = {max(h) for h in hists}
    gaps = {sorted(h)[-1] - sorted(h)[-2] for h in hists}
    assert set(np.flatnonzero(ss.reachable_maxima(total, k, size))) == tops
    assert set(np.flatnonzero(ss.reachable_gaps(total, k, size))) == gaps


DIET_ORDER = 5.5  # The order a DIET run (T = 0, sigma1 = 1) released at its eps-5 budget.


@pytest.mark.parametrize(
    ("hists", "answered", "n", "sigma2", "order", "threshold", "sigma1"),
    [
        ([(10, 10, 10)], [False], 30, 4.0, DIET_ORDER, 0.0, 1.0),
        ([(20, 6, 4)], [True], 30, 4.0, DIET_ORDER, 0.0, 1.0),
        ([(30, 0, 0)], [True], 30, 4.0, DIET_ORDER, 0.0, 1.0),
        ([(12, 12, 12, 4)], [False], 40, 4.0, DIET_ORDER, 0.0, 1.0),
        ([(10, 10, 10)], [True], 30, 1.0, DIET_ORDER, 0.0, 1.0),
        ([(11, 9)], [False], 20, 4.0, 8.0, 14.0, 1.0),
        ([(24, 0, 0, 0), (6, 6, 6, 6)], [True, True], 24, 4.0, DIET_ORDER, 0.0, 1.0),
        ([(7, 3, 2), (12, 0, 0)], [True, False], 12, 1.0, 5.0, None, None),
        ([(11, 1)], [True], 12, 1.0, 5.0, None, None),
        # Fewer votes than teachers on a query: its own total bounds what it can reach.
        ([(8, 2, 0), (25, 3, 2)], [True, True], 30, 2.0, 6.0, 3.0, 1.5),
    ],
)
def test_smooth_sensitivity_covers_every_reachable_histogram(
    hists: list[Hist],
    answered: list[bool],
    n: int,
    sigma2: float,
    order: float,
    threshold: float | None,
    sigma1: float | None,
) -> None:
    beta = 0.2 / order
    brute = brute_smooth_sensitivity(hists, answered, n, sigma2, order, beta, threshold, sigma1)
    got = library_smooth_sensitivity(hists, answered, n, sigma2, order, beta, threshold, sigma1)
    assert got.smooth_sensitivity >= brute * (1 - 1e-12)


@pytest.mark.parametrize(
    ("hists", "n", "order", "threshold"),
    [
        # DIET's mechanism (T = 0, sigma1 = 1): a top vote below n / K = 10 cannot occur,
        # yet the steepest part of the threshold table at order 5.5 lies at m = 2..5.
        ([(10, 10, 10)], 30, DIET_ORDER, 0.0),
        ([(20, 6, 4)], 30, DIET_ORDER, 0.0),
        ([(12, 12, 12, 4)], 40, DIET_ORDER, 0.0),
        # T = 14, n = 20, K = 2: every possible top (10..20) is charged the cap, so R never moves.
        ([(11, 9)], 20, 8.0, 14.0),
    ],
)
def test_impossible_top_votes_do_not_drive_the_release(
    hists: list[Hist], n: int, order: float, threshold: float
) -> None:
    # Before the fix the release read the table below ceil(n / K): 0.82, 0.57, 0.76 and 0.72
    # against what reachable histograms give, 0.0023, 0.0017, 0.0019 and 0.
    answered = [False] * len(hists)
    beta = 0.2 / order
    brute = brute_smooth_sensitivity(hists, answered, n, 4.0, order, beta, threshold, 1.0)
    got = library_smooth_sensitivity(hists, answered, n, 4.0, order, beta, threshold, 1.0)
    assert brute * (1 - 1e-12) <= got.smooth_sensitivity <= 1.2 * brute + 1e-12
    assert got.epsilon_std <= 0.03


def test_support_attack_reads_the_float_release_and_not_the_exact_one() -> None:
    # Two neighbouring vote sets (one teacher moves one vote), each released many times.
    hist = _random_hist(np.random.default_rng(3), 20)
    answered = np.ones(20, dtype=bool)
    moved = hist.copy()
    top = int(np.argmax(moved[0]))
    moved[0, top] -= 1
    moved[0, (top + 1) % K] += 1
    first, second = release(hist, answered, 5), release(moved, answered, 5)
    r1, r2 = first.data_dependent_rdp, second.data_dependent_rdp
    assert r1 != r2
    scale = max(first.smooth_sensitivity, second.smooth_sensitivity) * first.sigma_ss
    n = 6_000
    truth = np.arange(n) % 2 == 0
    rng = SecureRandom.from_seed("attack")
    # The old release: R + a float Gaussian draw, released as the float sum.
    old = np.where(truth, r1, r2) + rng.normal(n, scale)
    made, says_first = canaries.guess_offset(old, r1, r2)
    assert made.sum() > n // 5 and np.array_equal(says_first[made], truth[made])
    new = np.array([ss.released_rdp(r1 if t else r2, scale, rng) for t in truth])
    assert np.array_equal(new / float(ss.RELEASE_GRID), np.rint(new / float(ss.RELEASE_GRID)))
    made, says_first = canaries.guess_offset(new, r1, r2)
    right = int((says_first[made] == truth[made]).sum())
    assert right <= made.sum() / 2 + 4 * np.sqrt(made.sum() / 4) + 1


def test_release_without_noise_is_its_total_on_the_grid() -> None:
    assert ss.released_rdp(0.75, 0.0, SecureRandom.from_seed(0)) == 0.75
    with pytest.raises(ValueError, match="scale"):
        ss.released_rdp(1.0, -1.0, SecureRandom.from_seed(0))
