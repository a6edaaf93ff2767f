"""The privacy statements about the circuits' noise hold exactly.

1. Rounding commutes with the grids: the guardian rounds its noise eta to the circuit's
   grid alone and adds the counts h, and the statement is about round(h + eta). Rounding
   half to even broke that for odd counts (weighted and tau tasks) whenever eta lay on a
   half: 1 + round(0.5) = 1 but round(1.5) = 2.
2. The 9-sigma cut-off's delta: the rounds that run release the exact Gaussian mechanism
   conditioned on a vote-independent event of probability 1 - p, which is
   (eps, (delta + e^eps p) / (1 - p)); it is part of every party's full delta.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from capc.mpc import ring
from capc.mpc.mechanism_circuits import (
    MAX_CUTOFF_FAILURE,
    MAX_NOISE_VALUES,
    NOISE_BOUND_SIGMAS,
    NOISE_TAIL,
    cutoff_delta,
    cutoff_failure,
    round_noise,
)
from capc.privacy.rounded_gaussian import GRID_BITS
from services.common.ledger.records import PartyBudget


@pytest.mark.parametrize("frac_bits", range(GRID_BITS + 1))
def test_rounding_the_noise_alone_commutes_with_every_grid(frac_bits: int) -> None:
    """Counts h on the circuit's grid (odd multiples included), noise on the 2^-24 grid
    the sampler rounds to, with every tie: encode(h) + encode(eta) = encode(h + eta)."""
    rng = np.random.default_rng(frac_bits)
    unit = 2.0**-frac_bits
    h = rng.integers(-999, 1000, 400) * unit  # any count on the grid, odd ones half of them
    eta = rng.integers(-(2**30), 2**30, 400) * 2.0**-GRID_BITS
    if frac_bits < GRID_BITS:
        eta[:200] = (np.floor(eta[:200] / unit) + 0.5) * unit  # exactly on a half: ties
    alone = ring.encode_fixed(h, frac_bits) + ring.encode_fixed(eta, frac_bits)
    assert np.array_equal(alone, ring.encode_fixed(h + eta, frac_bits))
    # The plaintext oracle rounds the noise as the circuit does.
    assert np.array_equal(h + round_noise(eta, frac_bits), round_noise(h + eta, frac_bits))


def test_a_tie_on_an_odd_count_is_where_half_to_even_failed() -> None:
    assert ring.decode_fixed(ring.encode_fixed(1.0, 0) + ring.encode_fixed(0.5, 0), 0) == 2.0
    assert float(ring.decode_fixed(ring.encode_fixed(-0.5, 0), 0)) == 0.0  # ties upward
    big = np.array([2.0**53 + 2, -(2.0**52) - 1])  # integers already: kept as they are
    assert np.array_equal(ring.round_half_up(big), big)


def test_the_cutoff_probability_is_the_normal_tail() -> None:
    tail = float(2 * norm.sf(NOISE_BOUND_SIGMAS))
    assert abs(NOISE_TAIL - tail) <= 1e-12 * tail
    assert 2.25e-19 < NOISE_TAIL < 2.27e-19
    assert math.isclose(MAX_CUTOFF_FAILURE, MAX_NOISE_VALUES * NOISE_TAIL, rel_tol=1e-9)
    assert cutoff_failure(0) == 0.0
    assert cutoff_failure(1000) == pytest.approx(1000 * MAX_CUTOFF_FAILURE, rel=1e-9)
    with pytest.raises(ValueError, match="whole number"):
        cutoff_failure(-1)


def truncated_delta(eps: float, shift: float, cut: float) -> float:
    """sup_S P[S] - e^eps Q[S] for N(0, 1) and N(shift, 1), each conditioned on lying
    within ``cut`` of its mean (what a round that ran releases), by quadrature."""
    x = np.linspace(-cut - 1, cut + shift + 1, 400_001)
    dx = x[1] - x[0]
    keep = 1 - 2 * norm.sf(cut)
    p = np.where(np.abs(x) <= cut, norm.pdf(x), 0.0) / keep
    q = np.where(np.abs(x - shift) <= cut, norm.pdf(x - shift), 0.0) / keep
    return float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0)) * dx)


@pytest.mark.parametrize(("eps", "cut"), [(0.5, 2.0), (1.0, 2.5), (2.0, 3.0)])
def test_the_conditioning_bound_holds_where_the_cutoff_is_visible(eps: float, cut: float) -> None:
    """At a cut-off near the mean the conditioned mechanism's delta is measurable: it stays
    within (delta + e^eps p) / (1 - p), and the exact mechanism's delta alone is short."""
    shift = 1.0  # sensitivity over sigma
    exact = norm.cdf(shift / 2 - eps / shift) - math.exp(eps) * norm.cdf(-shift / 2 - eps / shift)
    p = 2 * norm.sf(cut)
    truncated = truncated_delta(eps, shift, cut)
    assert truncated <= (exact + math.exp(eps) * p) / (1 - p) + 1e-6
    assert truncated > exact  # the cut-off's own term is real


def test_every_partys_full_delta_counts_the_cutoff() -> None:
    delta, rounds, spent = 1e-5, 1000, 8.0
    budget = PartyBudget(
        "h", "answerer", "active", 10.0, spent, 2.0, None, rounds, None, rounds_asked=rounds
    )
    p = cutoff_failure(rounds)
    want = (delta + math.exp(spent) * p) / (1 - p) + rounds * 2.0**-40
    assert budget.full_delta(delta) == pytest.approx(want, rel=1e-12)
    assert cutoff_delta(delta, spent, rounds) == pytest.approx(want - rounds * 2.0**-40)
    # Far more than the ring conversion's term alone (what was stated before).
    assert budget.full_delta(delta) - delta - rounds * 2.0**-40 > 100 * rounds * 2.0**-40
    nothing = PartyBudget("h", "answerer", "active", 10.0, 0.0, 10.0, None, 0, None)
    assert nothing.full_delta(delta) == delta


def test_a_round_drawing_more_noise_than_the_bound_is_refused() -> None:
    """What keeps every round's cut-off failure within MAX_CUTOFF_FAILURE."""
    from capc.round.admission import check_noise_values, noise_values
    from capc.round.errors import RoundRequestError
    from capc.task_config import TaskConfig, config_hash

    config = {
        "num_classes": 10,
        "input_shape": [4],
        "mechanism": {"name": "gnmax", "sigma": 4.0},
    }
    task = TaskConfig.parse("t", config, config_hash(config))
    assert noise_values(task, 4096) == 2 * 4096 * 10 <= MAX_NOISE_VALUES
    check_noise_values(task, 4096)  # the largest batch of a 10-class task fits
    wide = {**config, "num_classes": 500}
    big = TaskConfig.parse("wide", wide, config_hash(wide))
    with pytest.raises(RoundRequestError, match="send at most 262 queries per round"):
        check_noise_values(big, 4096)
    check_noise_values(big, 262)
