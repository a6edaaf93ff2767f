"""A DP-trained teacher's record: its one charge under capc's accountants (checked against
Google's dp-accounting) and the attacks a record read from a file must survive."""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from capc.privacy import gaussian_dp
from capc.privacy.accountant import Accountant, Budget
from capc.privacy.accountants import GaussianDp, RenyiDp
from capc.privacy.conversion import DEFAULT_ORDERS, convert
from capc.privacy.dp_training import (
    CARD_KEY,
    DpTraining,
    DpTrainingError,
    noise_multiplier,
)
from capc.privacy.dp_training import (
    plan_training as plan,
)

PLANS = [(10.0, 1e-5, 300), (2.0, 1e-5, 300), (1.0, 1e-6, 50), (4.0, 1e-5, 1)]


@pytest.mark.parametrize(("epsilon", "delta", "steps"), PLANS)
def test_gdp_charges_the_closed_form_and_keeps_to_the_target(
    epsilon: float, delta: float, steps: int
) -> None:
    record = plan(epsilon, delta, steps, clip=1.0, records=100)
    gdp = GaussianDp()
    total = gdp.cost(record.event())
    # One step moves the clipped sum by 2 clip; the noise is sigma clip: mu_step = 2 / sigma.
    mu = 2.0 * math.sqrt(steps) / record.noise_multiplier
    assert math.sqrt(float(total[0])) == pytest.approx(mu, rel=1e-12)
    assert record.mu == pytest.approx(mu, rel=1e-12)
    spent = gdp.spent(total, delta)
    assert spent.epsilon <= epsilon
    assert spent.epsilon == pytest.approx(epsilon, abs=1e-9)
    assert record.spent() == pytest.approx(spent.epsilon, rel=1e-12)
    # The noise is the smallest that fits: a hair less would overspend.
    smaller = 2.0 * math.sqrt(steps) / (record.noise_multiplier * (1 - 1e-6))
    assert not gaussian_dp.within(smaller, epsilon, delta)


@pytest.mark.parametrize(("epsilon", "delta", "steps"), PLANS)
def test_rdp_agrees_with_dp_accountings_rdp_accountant(
    epsilon: float, delta: float, steps: int
) -> None:
    record = plan(epsilon, delta, steps, clip=1.0)
    mine = RenyiDp().spent(RenyiDp().cost(record.event()), delta).epsilon
    theirs = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS))
    # dp-accounting's Gaussian is stated per unit sensitivity: sigma / 2.
    theirs.compose(dp_accounting.GaussianDpEvent(record.noise_multiplier / 2.0), steps)
    their_eps = float(theirs.get_epsilon(delta))
    # dp-accounting takes the total-variation shortcut where it applies; so may we.
    shortcut = convert(
        RenyiDp().cost(record.event()), DEFAULT_ORDERS, delta, tv_shortcut=True
    ).epsilon
    assert shortcut == pytest.approx(their_eps, abs=1e-6)
    assert mine == pytest.approx(their_eps, abs=1e-6)
    # RDP is looser than exact GDP, which the record was planned under.
    assert mine >= record.spent() - 1e-9


@pytest.mark.parametrize(("epsilon", "delta", "steps"), PLANS[:3])
def test_agrees_with_dp_accountings_pld_accountant(
    epsilon: float, delta: float, steps: int
) -> None:
    record = plan(epsilon, delta, steps, clip=1.0)
    theirs = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    theirs.compose(dp_accounting.GaussianDpEvent(record.noise_multiplier / 2.0), steps)
    their_eps = float(theirs.get_epsilon(delta))
    # The PLD discretises pessimistically: never below the exact value, close above it.
    assert record.spent() <= their_eps + 1e-9
    assert record.spent() == pytest.approx(their_eps, abs=2e-3)


@pytest.mark.parametrize("accounting", [GaussianDp(), RenyiDp()])
def test_both_ledger_filters_admit_the_event(accounting: Any) -> None:
    record = plan(5.0, 1e-5, 300, clip=1.0)
    assert accounting.admissible(record.event())
    cost = accounting.filter_cost(record.event())
    assert np.array_equal(cost, accounting.cost(record.event()))
    # A ledger with a budget of the target admits the training once, and no second time.
    ledger = Accountant("hospital", accounting)
    budget = Budget(5.0 if accounting.name == "gdp" else 6.0, 1e-5)
    ledger.compose(record.event(), budget=budget, label="dp-training")
    assert ledger.would_exceed(record.event(), budget)


def test_the_record_charges_steps_gaussian_steps_not_its_claimed_epsilon() -> None:
    record = plan(3.0, 1e-5, 100, clip=0.5)
    # A file claiming a larger epsilon for the same noise charges the same: the event counts.
    claims_more = DpTraining(**{**record.to_dict(), "epsilon": 30.0})
    assert np.array_equal(GaussianDp().cost(claims_more.event()), GaussianDp().cost(record.event()))


def test_sampling_rate_below_one_is_refused() -> None:
    data = {**plan(3.0, 1e-5, 100, clip=1.0).to_dict(), "sampling_rate": 0.01}
    with pytest.raises(DpTrainingError, match="sampling_rate"):
        DpTraining.from_dict(data)


@pytest.mark.parametrize("relation", ["add-remove", "add/remove", ""])
def test_other_neighbouring_relations_are_refused(relation: str) -> None:
    data = {**plan(3.0, 1e-5, 100, clip=1.0).to_dict(), "neighbouring": relation}
    with pytest.raises(DpTrainingError, match="neighbouring"):
        DpTraining.from_dict(data)


def test_round_trip() -> None:
    record = plan(2.5, 1e-6, 77, clip=0.3, records=1234)
    data = record.to_dict()
    assert set(data) == set(DpTraining.__dataclass_fields__)
    assert DpTraining.from_dict(data) == record
    assert CARD_KEY == "dp_training"


@pytest.mark.parametrize("field", ["noise_multiplier", "steps", "clip", "epsilon", "delta"])
def test_a_missing_field_is_named(field: str) -> None:
    data = plan(3.0, 1e-5, 100, clip=1.0).to_dict()
    del data[field]
    with pytest.raises(DpTrainingError, match=field):
        DpTraining.from_dict(data)


def test_an_unknown_field_is_named() -> None:
    data = {**plan(3.0, 1e-5, 100, clip=1.0).to_dict(), "batch_size": 64}
    with pytest.raises(DpTrainingError, match="batch_size"):
        DpTraining.from_dict(data)


BAD = [
    ("noise_multiplier", math.nan),
    ("noise_multiplier", -1.0),
    ("noise_multiplier", 0.0),
    ("noise_multiplier", math.inf),
    ("noise_multiplier", True),
    ("noise_multiplier", "12.5"),
    ("steps", -3),
    ("steps", 0),
    ("steps", 2.5),
    ("steps", True),
    ("steps", "300"),
    ("clip", math.nan),
    ("clip", -1.0),
    ("clip", False),
    ("epsilon", math.nan),
    ("epsilon", -2.0),
    ("epsilon", True),
    ("delta", math.nan),
    ("delta", 0.0),
    ("delta", 1.0),
    ("delta", True),
    ("sampling_rate", True),
    ("sampling_rate", math.nan),
    ("records", -1),
    ("records", True),
    ("records", 1.5),
    ("neighbouring", None),
]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_a_bad_value_is_refused_naming_its_field(field: str, value: object) -> None:
    data = {**plan(3.0, 1e-5, 100, clip=1.0).to_dict(), field: value}
    with pytest.raises(DpTrainingError, match=field):
        DpTraining.from_dict(data)


@pytest.mark.parametrize("data", [None, [], "dp_training", 3.0])
def test_a_record_is_an_object(data: object) -> None:
    with pytest.raises(DpTrainingError, match="JSON object"):
        DpTraining.from_dict(data)


@pytest.mark.parametrize(
    ("epsilon", "delta", "steps"), [(0.0, 1e-5, 10), (1.0, 0.0, 10), (1.0, 1e-5, 0)]
)
def test_planning_refuses_what_cannot_be_trained(epsilon: float, delta: float, steps: int) -> None:
    with pytest.raises(ValueError):
        noise_multiplier(epsilon, delta, steps)
