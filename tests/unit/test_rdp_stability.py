"""Numerical robustness of the data-dependent bounds over the whole documented range."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from capc.privacy import rdp
from capc.privacy.conversion import DEFAULT_ORDERS

sigmas = st.floats(0.5, 1e4)


@st.composite
def histograms(draw: st.DrawFn) -> np.ndarray:
    k = draw(st.integers(2, 10_000) if draw(st.booleans()) else st.integers(2, 12))
    teachers = draw(st.integers(1, 5000))
    kind = draw(st.sampled_from(["random", "tie", "single", "zeros-but-one", "all-zero"]))
    h = np.zeros(k)
    if kind == "random":
        small = draw(arrays(np.int64, min(k, 12), elements=st.integers(0, teachers)))
        h[: small.size] = small
    elif kind == "tie":
        h[:2] = teachers
    elif kind == "single":
        h[draw(st.integers(0, k - 1))] = 1
    elif kind == "zeros-but-one":
        h[0] = teachers
    return h


@settings(max_examples=150, deadline=None)
@given(histograms(), sigmas)
def test_gnmax_is_finite_and_capped(votes: np.ndarray, sigma: float) -> None:
    got = rdp.gnmax_data_dependent(votes, sigma, DEFAULT_ORDERS)
    cap = rdp.gnmax_data_independent(sigma, DEFAULT_ORDERS)
    assert np.isfinite(got).all() and (got >= 0).all() and (got <= cap).all()
    # Up to one ulp: math.log and numpy's log may round 1 - 1/K differently.
    assert rdp.log_q_gnmax(votes, sigma) <= np.log(1 - 1 / votes.size) + 1e-15


@settings(max_examples=150, deadline=None)
@given(histograms(), sigmas, st.floats(0, 1e4))
def test_threshold_is_finite_and_capped(votes: np.ndarray, sigma1: float, threshold: float) -> None:
    got = rdp.threshold_data_dependent(votes, threshold, sigma1, DEFAULT_ORDERS)
    cap = rdp.threshold_data_independent(sigma1, DEFAULT_ORDERS)
    assert np.isfinite(got).all() and (got >= 0).all() and (got <= cap).all()


def test_more_confident_votes_cost_less() -> None:
    weak = rdp.gnmax_data_dependent([120, 100, 30], 40, DEFAULT_ORDERS)
    strong = rdp.gnmax_data_dependent([240, 10, 0], 40, DEFAULT_ORDERS)
    assert (strong <= weak).all() and strong[20] < weak[20]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rdp.gnmax_data_dependent([1, float("nan")], 1.0, [2.0]), "finite"),
        (lambda: rdp.gnmax_data_dependent([1, -1], 1.0, [2.0]), "non-negative"),
        (lambda: rdp.gnmax_data_dependent([1, 2], 0.0, [2.0]), "sigma"),
        (lambda: rdp.gnmax_data_dependent([1, 2], 1.0, [0.5]), "orders"),
        (lambda: rdp.gnmax_data_dependent([[1, 2]], 1.0, [2.0]), "1-D"),
        (lambda: rdp.gnmax_data_dependent([3], 1.0, [2.0]), "at least 2 classes"),
        (lambda: rdp.threshold_data_dependent([1, 2], -1.0, 1.0, [2.0]), "threshold"),
        (lambda: rdp.multilabel_binary(0, 1.0, [2.0]), "num_labels"),
        (lambda: rdp.multilabel_tau(3, 0.0, 1.0, [2.0]), "tau"),
        (lambda: rdp.vanishing_expected(1.5, 1.0, [2.0]), "participation"),
    ],
)
def test_bad_input_raises_value_error(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]
