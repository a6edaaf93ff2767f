"""Round reservations and charges agree with composing events through the accountant."""

from __future__ import annotations

import numpy as np
import pytest

from capc.privacy import events
from capc.privacy.accountant import Accountant
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.privacy.round_cost import MechanismSpec


def test_confident_gnmax_charges_thresholds_always_and_answers_when_answered() -> None:
    spec = MechanismSpec("confident-gnmax", sigma=40.0, threshold=200.0, sigma1=150.0)
    acc = Accountant("h")
    acc.compose(events.threshold_test(200.0, 150.0), 100)
    acc.compose(events.gnmax(40.0), 37)
    np.testing.assert_allclose(spec.actual(100, 37), acc.rdp, rtol=1e-12)
    assert (spec.worst_case(100) >= spec.actual(100, 37)).all()
    np.testing.assert_allclose(spec.actual(10, 10, weight=2.0), 4 * spec.actual(10, 10))


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


def test_bad_specs() -> None:
    with pytest.raises(ValueError, match="one of"):
        MechanismSpec("median", sigma=1.0)
    with pytest.raises(ValueError, match="sigma1"):
        MechanismSpec("confident-gnmax", sigma=1.0)
    with pytest.raises(ValueError, match="answered"):
        MechanismSpec("gnmax", sigma=1.0).actual(3, 4)
