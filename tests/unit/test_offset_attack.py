"""Issue 33 attacks on the threshold test, against the real mechanism circuits.

A deviating student adds an offset to its own share sum (its circuit input);
a deviating hospital could vote the same offset. Before the histogram checks
and the offset-robust test, an offset of 2^(l-1) on one class made
"answered" a noiseless comparison of two counts: P[not answered | D] = 0
against about 0.03 on a neighbour. Now an out-of-range offset trips the
circuit's violation bit (the round aborts, charged at its reservation) on
both neighbours alike, and an in-range offset leaves the answered-rate gap
within what the charged Gaussian test allows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from numpy.typing import NDArray

from capc.mechanisms.base import Mechanism
from capc.mechanisms.registry import from_config
from capc.mpc.mechanism_circuits import HistogramViolationError
from capc.privacy.randomness import SecureRandom
from capc.task_config import TaskConfig, config_hash

QUERIES = 4000
PARTIES = 20
ROBUST = {"name": "robust-confident-gnmax", "sigma": 2.0, "threshold": 15.0, "sigma1": 2.0}


def neighbours() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Two histograms of 20 one-hot votes, one teacher moved from class 0 to class 1."""
    d = np.zeros(10)
    d[:3] = (10, 9, 1)
    d2 = d.copy()
    d2[:2] = (9, 10)
    return np.tile(d, (QUERIES, 1)), np.tile(d2, (QUERIES, 1))


def run(
    mech: Mechanism, hist: NDArray[np.float64], offset: NDArray[np.uint64], seed: str
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """(answered, violation) per query when the student adds ``offset`` (ring elements,
    (K,)) to its share sum; the guardian is honest, with the voters' true weight."""
    rng = np.random.default_rng(0)
    student = rng.integers(0, 2**64 - 1, hist.shape, dtype=np.uint64, endpoint=True)
    guardian = hist.astype(np.uint64) - student
    spec = mech.circuit(PARTIES, PARTIES, 0)
    noise = mech.draw_noise(len(hist), SecureRandom.from_seed(seed))
    g_in = mech.garbler_inputs(spec, guardian, noise, None, float(PARTIES))
    e_in = spec.evaluator_inputs(student + offset)
    out = spec.circuit().evaluate_plain(g_in, e_in, len(hist))
    return out["answered"][:, 0].astype(bool), out["violation"][:, 0].astype(bool)


def gaussian_tv(mu: float) -> float:
    """Largest gap of any event's probability between N(0, 1) and N(mu, 1)."""
    return float(2 * scipy.stats.norm.cdf(mu / 2) - 1)


def test_a_wrapping_offset_aborts_on_both_neighbours_alike() -> None:
    mech = from_config(ROBUST, 10)
    spec = mech.circuit(PARTIES, PARTIES, 0)
    offset = np.zeros(10, dtype=np.uint64)
    # The issue's attack: 2^(l-1) on the circuit's grid flips class 1's sign region.
    offset[1] = np.uint64(1 << (spec.bits - 1 - spec.frac_bits))
    d, d2 = neighbours()
    for hist, seed in ((d, "a"), (d2, "b")):
        _, violation = run(mech, hist, offset, seed)
        assert violation.all()
    # The student's decode turns it into a clear error, not labels.
    with pytest.raises(HistogramViolationError, match="reservation"):
        spec.decode(
            {
                "label": np.zeros((2, 1), dtype=np.uint64),
                "answered": np.ones((2, 1), dtype=np.uint64),
                "violation": np.array([[0], [1]], dtype=np.uint64),
            }
        )


@pytest.mark.parametrize("shift", [0, 3, 6])
def test_an_in_range_offset_leaves_the_gap_the_charged_test_allows(shift: int) -> None:
    mech = from_config(ROBUST, 10)
    # Move mass between the two contested classes (total kept, counts in range).
    offset = np.zeros(10, dtype=np.int64)
    offset[0], offset[1] = -shift, shift
    d, d2 = neighbours()
    a1, v1 = run(mech, d, offset.astype(np.uint64), f"d-{shift}")
    a2, v2 = run(mech, d2, offset.astype(np.uint64), f"d2-{shift}")
    events = {
        "answered": (a1 & ~v1, a2 & ~v2),
        "not answered": (~a1 & ~v1, ~a2 & ~v2),
        "violation": (v1, v2),
    }
    # Each query's test is charged as a Gaussian mechanism of L2 sensitivity sqrt(2).
    bound = gaussian_tv(math.sqrt(2.0) / mech.params.sigma1)  # type: ignore[attr-defined]
    for name, (e1, e2) in events.items():
        p1, p2 = e1.mean(), e2.mean()
        se = math.sqrt((p1 * (1 - p1) + p2 * (1 - p2)) / QUERIES)
        assert abs(p1 - p2) <= bound + 5 * se, (name, p1, p2, bound)
    # No event has probability 0 on one neighbour and not the other: the attack
    # made "not answered" impossible on D.
    assert (~a1).any() and (~a2).any()


def test_rounds_refuse_a_test_noise_shared_by_every_class() -> None:
    shared = from_config({**ROBUST, "name": "confident-gnmax"}, 10)
    assert not shared.offset_robust
    assert from_config(ROBUST, 10).offset_robust
    task_json = {"num_classes": 10, "input_shape": [2], "mechanism": dict(shared.to_config())}
    task = TaskConfig.parse("t", task_json, config_hash(task_json))
    assert not task.mechanism.offset_robust
    # Confident powerset draws its test noise per subset count.
    confident_powerset = {"name": "powerset", "sigma": 2, "threshold": 3, "sigma1": 2}
    assert from_config(confident_powerset, 3).offset_robust
    assert from_config({"name": "powerset", "sigma": 2}, 3).offset_robust
