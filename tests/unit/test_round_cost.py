"""Round reservations and charges agree with composing events through the accountant."""

from __future__ import annotations

import numpy as np
import pytest

from capc.privacy import events, rdp
from capc.privacy.accountant import Accountant
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.privacy.round_cost import MechanismSpec


def test_confident_gnmax_charges_thresholds_always_and_answers_when_answered() -> None:
    spec = MechanismSpec("confident-gnmax", sigma=40.0, threshold=200.0, sigma1=150.0)
    acc = Accountant("h")
    acc.compose(events.threshold_test(200.0, 150.0), 100)
    acc.compose(events.gnmax(40.0), 37)
    answered = np.arange(100) < 37
    np.testing.assert_allclose(spec.charge(answered), acc.rdp, rtol=1e-12)
    assert (spec.worst_case(100) >= spec.charge(answered)).all()
    np.testing.assert_allclose(spec.worst_case(10, weight=2.0), 4 * spec.worst_case(10), rtol=1e-12)


@pytest.mark.parametrize(
    ("spec", "event"),
    [
        (MechanismSpec("gnmax", sigma=10.0), events.gnmax(10.0)),
        (MechanismSpec("binary", sigma=10.0, num_labels=5), events.multilabel_binary(5, 10.0)),
        (
            MechanismSpec("tau", sigma=10.0, num_labels=5, tau=1.5),
            events.multilabel_tau(5, 1.5, 10.0),
        ),
        (MechanismSpec("powerset", sigma=10.0, num_labels=3), events.multilabel_powerset(10.0)),
    ],
)
def test_other_mechanisms(spec: MechanismSpec, event: events.PrivacyEvent) -> None:
    np.testing.assert_allclose(spec.worst_case(8, DEFAULT_ORDERS), 8 * event.rdp, rtol=1e-12)


def test_binary_confidence_charges_the_test_on_all_labels_and_decisions_on_released_ones() -> None:
    spec = MechanismSpec("binary", sigma=3.0, threshold=2.0, sigma1=5.0, num_labels=4)
    answered = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)
    o = DEFAULT_ORDERS
    # Test: Gaussian at sensitivity sqrt(k) on every query; decisions: sqrt(m_b) on query b.
    expected = 3 * rdp.gaussian(2.0, 5.0, o) + sum(rdp.gaussian(np.sqrt(m), 3.0, o) for m in (2, 4))
    np.testing.assert_allclose(spec.charge(answered, o), expected, rtol=1e-12)
    # Releasing a label more always costs more (the charge is monotone in what was released).
    more = answered.copy()
    more[1, 0] = True
    assert (spec.charge(more, o) > spec.charge(answered, o)).all()


def test_tau_clipping_caps_the_charge_of_queries_with_many_labels() -> None:
    spec = MechanismSpec("tau", sigma=3.0, threshold=1.0, sigma1=4.0, num_labels=6, tau=1.0)
    o = DEFAULT_ORDERS
    one = spec.charge(np.array([[1, 0, 0, 0, 0, 0]], dtype=bool), o)
    many = spec.charge(np.ones((1, 6), dtype=bool), o)
    test = rdp.gaussian(rdp.tau_sensitivity(6, 1.0), 4.0, o)
    np.testing.assert_allclose(one, test + rdp.gaussian(1.0, 3.0, o), rtol=1e-12)
    # Six released labels cost no more than the clipped sensitivity sqrt(2) tau.
    np.testing.assert_allclose(many, test + rdp.gaussian(np.sqrt(2.0), 3.0, o), rtol=1e-12)


def test_confident_powerset_is_confident_gnmax_over_subsets() -> None:
    spec = MechanismSpec("powerset", sigma=4.0, threshold=3.0, sigma1=5.0, num_labels=3)
    same = MechanismSpec("confident-gnmax", sigma=4.0, threshold=3.0, sigma1=5.0)
    answered = np.array([True, False, True])
    np.testing.assert_allclose(spec.charge(answered), same.charge(answered), rtol=1e-12)


def test_bad_specs_and_outcomes() -> None:
    with pytest.raises(ValueError, match="one of"):
        MechanismSpec("median", sigma=1.0)
    with pytest.raises(ValueError, match="sigma1"):
        MechanismSpec("confident-gnmax", sigma=1.0)
    with pytest.raises(ValueError, match="no threshold test"):
        MechanismSpec("gnmax", sigma=1.0, sigma1=2.0)
    with pytest.raises(ValueError, match="all True"):
        MechanismSpec("gnmax", sigma=1.0).charge(np.array([True, False]))
    with pytest.raises(ValueError, match="shape"):
        MechanismSpec("binary", sigma=1.0, num_labels=3).charge(np.ones((2, 4), dtype=bool))
