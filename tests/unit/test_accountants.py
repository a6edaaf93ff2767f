"""Privacy events and the additive accountants (gdp, rdp) that interpret them."""

from __future__ import annotations

import json
import math
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from capc.mechanisms import Mechanism, mechanism_class
from capc.privacy import events, gaussian_dp, planning, rdp
from capc.privacy.accountant import Accountant, Budget, BudgetExceededError
from capc.privacy.accountants import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    Accounting,
    GaussianDp,
    RenyiDp,
    UnsupportedEventError,
    make,
)
from capc.privacy.conversion import DEFAULT_ORDERS, PATE_ORDERS, Conversion, convert
from capc.privacy.events import (
    ComposedEvent,
    EventError,
    GaussianEvent,
    NoOpEvent,
    PureDpEvent,
    RdpCurveEvent,
    SelfComposedEvent,
)

SQRT2 = math.sqrt(2.0)


def mech(name: str, outputs: int, **params: float) -> Mechanism:
    return mechanism_class(name).from_params(outputs, params)


# -- events --------------------------------------------------------------------

small_orders = st.lists(st.floats(1.01, 1e4), min_size=1, max_size=6, unique=True)


@st.composite
def curves(draw: st.DrawFn) -> RdpCurveEvent:
    o = draw(small_orders)
    r = draw(st.lists(st.floats(0.0, 1e6), min_size=len(o), max_size=len(o)))
    return RdpCurveEvent(np.array(r), np.array(o), draw(st.text(max_size=12)), draw(st.booleans()))


primitives: st.SearchStrategy[events.DpEvent] = st.one_of(
    st.just(NoOpEvent()),
    st.builds(GaussianEvent, st.floats(0.0, 1e4), st.floats(1e-3, 1e6)),
    st.builds(PureDpEvent, st.floats(0.0, 100.0)),
    curves(),
)
any_event: st.SearchStrategy[events.DpEvent] = st.recursive(
    primitives,
    lambda inner: st.one_of(
        st.builds(SelfComposedEvent, inner, st.integers(0, 10**6)),
        st.builds(ComposedEvent, st.lists(inner, max_size=4).map(tuple)),
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(any_event)
def test_events_round_trip_through_json(event: events.DpEvent) -> None:
    data = json.loads(json.dumps(event.to_dict()))
    back = events.from_dict(data)
    assert back == event
    assert type(back) is type(event)
    assert back.to_dict() == event.to_dict()


def test_every_event_kind_round_trips() -> None:
    curve = RdpCurveEvent(np.array([0.1, 0.2]), np.array([2.0, 3.0]), "pate", True)
    for event in (
        NoOpEvent(),
        GaussianEvent(SQRT2, 40.0),
        PureDpEvent(0.5),
        curve,
        SelfComposedEvent(GaussianEvent(1.0, 3.0), 7),
        ComposedEvent((PureDpEvent(1.0), SelfComposedEvent(curve, 2), NoOpEvent())),
    ):
        assert events.from_dict(json.loads(json.dumps(event.to_dict()))) == event
    assert {e.kind for e in (NoOpEvent(), GaussianEvent(1, 1), PureDpEvent(1), curve)} == {
        "noop",
        "gaussian",
        "pure",
        "rdp-curve",
    }
    # Curves compare by value, label and provenance.
    assert curve != RdpCurveEvent(np.array([0.1, 0.2]), np.array([2.0, 3.0]), "pate", False)
    assert curve != RdpCurveEvent(np.array([0.1, 0.3]), np.array([2.0, 3.0]), "pate", True)


GOOD_GAUSSIAN = {"kind": "gaussian", "sensitivity": 1.0, "sigma": 2.0}
MALFORMED: list[Any] = [
    None,
    [],
    "gaussian",
    {},
    {"kind": "laplace", "scale": 1.0},
    {"kind": "gaussian", "sigma": 2.0},
    {"kind": "gaussian", "sensitivity": 1.0},
    {"kind": "gaussian", "sensitivity": None, "sigma": 2.0},
    {"kind": "gaussian", "sensitivity": "much", "sigma": 2.0},
    {"kind": "gaussian", "sensitivity": -1.0, "sigma": 2.0},
    {"kind": "gaussian", "sensitivity": 1.0, "sigma": 0.0},
    {"kind": "gaussian", "sensitivity": 1.0, "sigma": float("nan")},
    {"kind": "gaussian", "sensitivity": float("inf"), "sigma": 1.0},
    {"kind": "pure"},
    {"kind": "pure", "epsilon": -0.1},
    {"kind": "pure", "epsilon": float("inf")},
    {"kind": "rdp-curve", "rdp": [0.1, 0.2]},
    {"kind": "rdp-curve", "rdp": [0.1, -0.2], "orders": [2.0, 3.0]},
    {"kind": "rdp-curve", "rdp": [0.1, float("nan")], "orders": [2.0, 3.0]},
    {"kind": "rdp-curve", "rdp": [0.1, 0.2, 0.3], "orders": [2.0, 3.0]},
    {"kind": "rdp-curve", "rdp": [0.1, 0.2], "orders": [0.5, 3.0]},
    {"kind": "rdp-curve", "rdp": [[0.1], [0.2, 0.3]], "orders": [2.0, 3.0]},
    {"kind": "self-composed", "count": 2},
    {"kind": "self-composed", "event": GOOD_GAUSSIAN},
    {"kind": "self-composed", "event": GOOD_GAUSSIAN, "count": -1},
    {"kind": "self-composed", "event": GOOD_GAUSSIAN, "count": 1.5},
    {"kind": "self-composed", "event": GOOD_GAUSSIAN, "count": float("inf")},
    {"kind": "self-composed", "event": GOOD_GAUSSIAN, "count": float("nan")},
    {"kind": "self-composed", "event": {"kind": "nope"}, "count": 2},
    {"kind": "composed"},
    {"kind": "composed", "events": 3},
    {"kind": "composed", "events": [GOOD_GAUSSIAN, {"kind": "pure"}]},
    {"kind": "composed", "events": [GOOD_GAUSSIAN, "noop"]},
]


@pytest.mark.parametrize("data", MALFORMED, ids=[json.dumps(d) for d in MALFORMED])
def test_malformed_event_dicts_raise_event_error(data: Any) -> None:
    with pytest.raises(EventError):
        events.from_dict(data)


def test_from_dict_does_not_coerce_what_it_reads() -> None:
    """A saved event is read as written, not reinterpreted: the string "false" is not a
    data-dependent flag, nor "3" a count."""
    curve = {"kind": "rdp-curve", "rdp": [0.1], "orders": [2.0], "data_dependent": "false"}
    for data in (
        curve,
        {"kind": "self-composed", "event": GOOD_GAUSSIAN, "count": "3"},
        {"kind": "self-composed", "event": GOOD_GAUSSIAN, "count": True},
    ):
        with pytest.raises(EventError):
            events.from_dict(data)


def test_scaled_scales_gaussian_sensitivities_and_refuses_pure_dp() -> None:
    nested = events.compose(
        GaussianEvent(1.0, 150.0),
        events.repeat(GaussianEvent(SQRT2, 40.0), 3),
        NoOpEvent(),
    )
    half = events.scaled(nested, 0.5)
    assert half == ComposedEvent(
        (GaussianEvent(0.5, 150.0), SelfComposedEvent(GaussianEvent(SQRT2 / 2, 40.0), 3))
    )
    # mu scales by w, so mu**2 (the gdp loss) by w**2.
    np.testing.assert_allclose(GaussianDp().cost(half), 0.25 * GaussianDp().cost(nested))
    assert events.scaled(nested, 1.0) is nested
    assert events.is_noop(events.scaled(nested, 0.0))
    for event in (
        PureDpEvent(1.0),
        events.compose(GaussianEvent(1.0, 2.0), PureDpEvent(1.0)),
        RdpCurveEvent(np.array([0.1]), np.array([2.0])),
        events.repeat(PureDpEvent(0.5), 4),
    ):
        with pytest.raises(EventError, match="cannot be scaled"):
            events.scaled(event, 2.0)
        assert events.scaled(event, 1.0) is event  # weight 1 changes nothing
        assert events.is_noop(events.scaled(event, 0.0))  # weight 0: nothing ran
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(EventError, match="weight"):
            events.scaled(GaussianEvent(1.0, 1.0), bad)


def test_compose_repeat_and_leaves() -> None:
    g, p = GaussianEvent(1.0, 2.0), PureDpEvent(0.3)
    assert events.compose() == NoOpEvent()
    assert events.compose(NoOpEvent(), g) == g
    assert events.compose(events.compose(g, p), g) == ComposedEvent((g, p, g))
    assert events.repeat(g, 0) == NoOpEvent() and events.repeat(g, 1) == g
    assert events.repeat(NoOpEvent(), 5) == NoOpEvent()
    assert sorted(
        (leaf.to_dict()["kind"], n)
        for leaf, n in events.leaves(events.repeat(events.compose(g, events.repeat(p, 3)), 2))
    ) == [("gaussian", 2), ("pure", 6)]
    with pytest.raises(EventError, match="count"):
        SelfComposedEvent(g, -1)
    curve = events.rdp_curve(events.compose(events.repeat(g, 4), p), DEFAULT_ORDERS)
    want = 4 * rdp.gaussian_rdp(1.0, 2.0, DEFAULT_ORDERS) + np.minimum(
        0.3, DEFAULT_ORDERS * 0.3**2 / 2
    )
    np.testing.assert_allclose(curve, want, rtol=1e-12)
    with pytest.raises(EventError, match="order grid"):
        events.rdp_curve(RdpCurveEvent(np.array([0.1]), np.array([2.0])), DEFAULT_ORDERS)


# -- accountants against dp-accounting's PLD accountant ------------------------


def pld_epsilon(parts: list[tuple[float, int]], delta: float) -> float:
    """dp-accounting's PLD epsilon of Gaussian mechanisms (noise multiplier, count)."""
    theirs = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    theirs.compose(
        dp_accounting.ComposedDpEvent(
            [
                dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), n)
                for z, n in parts
            ]
        )
    )
    return float(theirs.get_epsilon(delta))


def binary_round() -> tuple[events.DpEvent, list[tuple[float, int]]]:
    """A confident Binary-voting round over k = 5 labels, each query releasing m labels."""
    k, sigma, sigma1 = 5, 20.0, 30.0
    m = mech("binary", k, sigma=sigma, threshold=2.0, sigma1=sigma1)
    released = np.random.default_rng(0).integers(0, k + 1, 300)
    answered = np.arange(k)[None, :] < released[:, None]
    parts = [(sigma1 / math.sqrt(k), len(released))]  # every test sees all k labels
    parts += [(sigma / math.sqrt(r), int((released == r).sum())) for r in range(1, k + 1)]
    return m.event(answered), parts


CASES = {
    # 3201 answered GNMax queries at sigma 40: sensitivity sqrt(2).
    "gnmax": (
        mech("gnmax", 10, sigma=40.0).worst_case(3201),
        [(40.0 / SQRT2, 3201)],
    ),
    # Confident-GNMax worst case: 1000 tests (sensitivity 1) and 1000 answers.
    "confident-gnmax": (
        mech("confident-gnmax", 10, sigma=40.0, threshold=200.0, sigma1=150.0).worst_case(1000),
        [(150.0, 1000), (40.0 / SQRT2, 1000)],
    ),
    "binary": binary_round(),
    # A party of vote weight 2.5 in a tau-voting round (k = 4, tau 1: sensitivity sqrt(2)).
    "tau-weighted": (
        mech("tau", 4, sigma=30.0, tau=1.0).worst_case(400, weight=2.5),
        [(30.0 / (2.5 * SQRT2), 400)],
    ),
}


@pytest.mark.parametrize("delta", [1e-5, 1e-7])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gdp_agrees_with_the_pld_accountant(case: str, delta: float) -> None:
    event, parts = CASES[case]
    gdp = GaussianDp()
    ours = gdp.spent(gdp.cost(event), delta)
    assert ours.accountant == "gdp" and ours.delta == delta and ours.order is None
    assert ours.mu == pytest.approx(math.sqrt(sum(n / z**2 for z, n in parts)), rel=1e-12)
    theirs = pld_epsilon(parts, delta)
    # The PLD accountant rounds the loss up on its grid: never below the exact value,
    # and at this grid within 1e-6 of it.
    assert ours.epsilon <= theirs * (1 + 1e-12)
    assert ours.epsilon == pytest.approx(theirs, rel=1e-6)
    # RDP is never tighter than exact Gaussian DP.
    assert RenyiDp().spent(RenyiDp().cost(event), delta).epsilon >= ours.epsilon


def test_the_250_teacher_query_counts() -> None:
    """sigma 40 at eps 10, delta 1e-5: 3201 GNMax queries exactly, 2849 by RDP (docs/diet.md)."""
    per_query = mech("gnmax", 10, sigma=40.0).per_query()
    assert per_query == GaussianEvent(SQRT2, 40.0)
    assert GaussianDp().max_count(per_query, 10.0, 1e-5) == 3201
    assert RenyiDp().max_count(per_query, 10.0, 1e-5) == 2849
    # What is left after 1000 queries.
    gdp = GaussianDp()
    assert gdp.max_count(per_query, 10.0, 1e-5, spent=1000 * gdp.cost(per_query)) == 2201
    # The boundary is exact for both.
    for acc, n in ((GaussianDp(), 3201), (RenyiDp(), 2849)):
        unit = acc.cost(per_query)
        assert acc.fits(n * unit, 10.0, 1e-5) and not acc.fits((n + 1) * unit, 10.0, 1e-5)
        assert acc.spent(n * unit, 1e-5).epsilon <= 10.0 < acc.spent((n + 1) * unit, 1e-5).epsilon


def test_rdp_matches_the_conversion_and_gdp_matches_gaussian_dp() -> None:
    event = CASES["confident-gnmax"][0]
    r = RenyiDp()
    total = r.cost(event)
    want = 1000 * (
        rdp.threshold_data_independent(150.0, DEFAULT_ORDERS)
        + rdp.gnmax_data_independent(40.0, DEFAULT_ORDERS)
    )
    np.testing.assert_allclose(total, want, rtol=1e-12)
    spent = r.spent(total, 1e-5)
    conv = convert(want, DEFAULT_ORDERS, 1e-5, Conversion.IMPROVED)
    assert spent.epsilon == pytest.approx(conv.epsilon, rel=1e-12)
    assert spent.order == conv.order and spent.mu is None
    g = GaussianDp()
    mu = math.sqrt(1000 / 150.0**2 + 1000 * 2 / 40.0**2)
    assert g.spent(g.cost(event), 1e-5).epsilon == gaussian_dp.epsilon_at(mu, 1e-5)
    assert r.spent(r.zero(), 1e-5).epsilon == 0.0 == g.spent(g.zero(), 1e-5).epsilon


def test_which_events_each_accountant_supports() -> None:
    gdp, renyi = GaussianDp(), RenyiDp()
    gauss = GaussianEvent(SQRT2, 40.0)
    pure = PureDpEvent(0.1)
    curve = RdpCurveEvent(rdp.gnmax_data_independent(40.0, DEFAULT_ORDERS), DEFAULT_ORDERS)
    mixed = events.compose(gauss, pure)
    # gdp: Gaussian (and no-op) only, as a cost or as a charge.
    for e in (gauss, NoOpEvent(), events.repeat(gauss, 3)):
        assert gdp.supports(e) and gdp.admissible(e)
    for e in (pure, curve, mixed):
        assert not gdp.supports(e)
        with pytest.raises(UnsupportedEventError, match="gdp accountant cannot interpret"):
            gdp.cost(e)
        with pytest.raises(UnsupportedEventError):
            gdp.filter_cost(e)
    # rdp: interprets pure-DP and curves on its grid, but charges only Gaussian events.
    for e in (pure, curve, mixed):
        assert renyi.supports(e) and not renyi.admissible(e)
        assert renyi.cost(e).shape == DEFAULT_ORDERS.shape
        with pytest.raises(UnsupportedEventError, match="budget filter"):
            renyi.filter_cost(e)
        with pytest.raises(UnsupportedEventError, match="budget filter"):
            renyi.max_count(e, 1.0, 1e-5)
        with pytest.raises(UnsupportedEventError, match="budget filter"):
            renyi.max_multiplier(e, 10, 1.0, 1e-5)
    np.testing.assert_allclose(renyi.cost(pure), np.minimum(0.1, DEFAULT_ORDERS * 0.01 / 2))
    np.testing.assert_allclose(renyi.cost(curve), renyi.cost(gauss), rtol=1e-12)
    assert renyi.admissible(gauss) and renyi.admissible(events.repeat(gauss, 5))
    # A curve on another grid is not interpreted at all.
    other = RdpCurveEvent(np.array([0.1, 0.2]), np.array([2.0, 3.0]))
    assert not renyi.supports(other)
    with pytest.raises(UnsupportedEventError, match="order grid"):
        renyi.cost(other)
    with pytest.raises(ValueError, match="free event"):
        gdp.max_count(NoOpEvent(), 1.0, 1e-5)


def test_make_rebuilds_an_accountant_from_its_settings() -> None:
    assert DEFAULT_ACCOUNTANT == "gdp" and set(ACCOUNTANTS) == {"gdp", "rdp"}
    assert isinstance(make("gdp"), GaussianDp) and make("gdp", {}).settings() == {}
    custom = RenyiDp(PATE_ORDERS, Conversion.BASIC)
    saved = json.loads(json.dumps(custom.settings()))
    rebuilt = make(custom.name, saved)
    assert isinstance(rebuilt, RenyiDp)
    np.testing.assert_array_equal(rebuilt.orders, PATE_ORDERS)
    assert rebuilt.conversion is Conversion.BASIC and rebuilt.settings() == custom.settings()
    event = GaussianEvent(SQRT2, 40.0)
    assert rebuilt.spent(rebuilt.cost(event) * 100, 1e-5) == custom.spent(
        custom.cost(event) * 100, 1e-5
    )
    default = make("rdp")
    assert isinstance(default, RenyiDp)
    np.testing.assert_array_equal(default.orders, DEFAULT_ORDERS)
    assert default.conversion is Conversion.IMPROVED
    with pytest.raises(ValueError, match="unknown accountant 'pld'"):
        make("pld")
    with pytest.raises(ValueError, match="takes no settings"):
        make("gdp", {"orders": [2.0]})
    with pytest.raises(ValueError):
        make("rdp", {"orders": [0.5, 2.0]})
    with pytest.raises(ValueError):
        make("rdp", {"conversion": "magic"})


def test_loss_vectors_are_validated() -> None:
    for acc in (GaussianDp(), RenyiDp()):
        with pytest.raises(ValueError, match="entries"):
            acc.spent(np.zeros(acc.size + 1), 1e-5)
        for bad in (-1.0, math.nan, math.inf):
            with pytest.raises(ValueError, match="finite and non-negative"):
                acc.spent(np.full(acc.size, bad), 1e-5)
        with pytest.raises(ValueError, match="delta"):
            acc.spent(acc.zero(), 1.5)


@pytest.mark.parametrize("accounting", [GaussianDp(), RenyiDp()], ids=["gdp", "rdp"])
@pytest.mark.parametrize(
    ("event", "eps"),
    [
        (GaussianEvent(SQRT2, 40.0), 10.0),
        (GaussianEvent(SQRT2, 40.0), 1.0),
        (events.compose(GaussianEvent(1.0, 150.0), GaussianEvent(SQRT2, 40.0)), 4.0),
        (GaussianEvent(math.sqrt(5), 20.0), 2.0),
    ],
)
def test_max_multiplier_is_consistent_with_max_count(
    accounting: Accounting, event: events.DpEvent, eps: float
) -> None:
    delta = 1e-5
    n = accounting.max_count(event, eps, delta)
    assert n > 0
    unit = accounting.cost(event)
    for count in (1, max(1, n // 3), n, n + 1):
        m = accounting.max_multiplier(event, count, eps, delta)
        # m is the largest multiplier that fits: it fits, and a hair more does not.
        assert accounting.fits(m * count * unit, eps, delta), (count, m)
        assert not accounting.fits(m * (1 + 1e-9) * count * unit, eps, delta), (count, m)
        # n copies fit at multiplier 1, n + 1 do not.
        assert (m >= 1.0) == (count <= n), (count, m, n)
    # For Gaussian events the multiplier is the budget's share: m(count) * count is constant.
    m1 = accounting.max_multiplier(event, 1, eps, delta)
    assert accounting.max_multiplier(event, 7, eps, delta) * 7 == pytest.approx(m1, rel=1e-9)
    # A budget already part-spent leaves max_count(spent) = max_count - used.
    used = n // 4
    assert accounting.max_count(event, eps, delta, spent=used * unit) in (n - used, n - used - 1)
    with pytest.raises(ValueError, match="count >= 1"):
        accounting.max_multiplier(event, 0, eps, delta)
    by_planning = planning.max_queries(
        RenyiDp().cost(event), DEFAULT_ORDERS, eps, delta, Conversion.IMPROVED
    )
    if isinstance(accounting, RenyiDp):
        assert n == by_planning
    else:
        assert n >= by_planning  # exact Gaussian DP never answers fewer


# -- the history accountant with gdp ---------------------------------------------


def test_gdp_history_refuses_what_would_exceed_and_changes_nothing() -> None:
    acc = Accountant("h1", GaussianDp())
    budget = Budget(10.0, 1e-5)
    gn = mech("gnmax", 10, sigma=40.0)
    acc.compose(gn.worst_case(3000), budget=budget, label="gnmax")
    before_total, before_history = acc.total, acc.history
    before_spent = acc.spent(1e-5)
    assert acc.would_exceed(gn.per_query(), budget, count=202)
    assert not acc.would_exceed(gn.per_query(), budget, count=201)
    with pytest.raises(BudgetExceededError, match="exceed the budget"):
        acc.compose(gn.per_query(), 202, budget=budget, label="gnmax")
    np.testing.assert_array_equal(acc.total, before_total)
    assert acc.history == before_history and acc.spent(1e-5) == before_spent
    # Events the gdp filter cannot read are refused the same way: nothing changes.
    with pytest.raises(UnsupportedEventError):
        acc.compose(PureDpEvent(0.01), budget=budget)
    with pytest.raises(UnsupportedEventError):
        acc.compose(PureDpEvent(0.01))
    np.testing.assert_array_equal(acc.total, before_total)
    acc.compose(gn.per_query(), 201, budget=budget, label="gnmax")
    spent = acc.spent(1e-5)
    assert spent.accountant == "gdp" and spent.epsilon <= 10.0
    assert spent.mu == pytest.approx(math.sqrt(3201 * 2) / 40.0, rel=1e-12)
    assert acc.remaining(budget) == pytest.approx(10.0 - spent.epsilon)
    with pytest.raises(BudgetExceededError):
        acc.compose(gn.per_query(), 1, budget=budget)


def test_gdp_history_round_trips_through_json() -> None:
    acc = Accountant("hospital-c", GaussianDp())
    conf = mech("confident-gnmax", 10, sigma=40.0, threshold=200.0, sigma1=150.0)
    answered = np.random.default_rng(1).random(50) < 0.6
    acc.compose(conf.event(answered), label="confident-gnmax")
    acc.compose(conf.event(answered, weight=0.5), 3, label="weighted")
    acc.compose(mech("binary", 5, sigma=20.0).worst_case(10), label="binary")
    state = json.loads(json.dumps(acc.state_dict()))
    assert state["version"] == 2 and state["accountant"] == {"name": "gdp"}
    restored = Accountant.from_state_dict(state)
    assert isinstance(restored.accounting, GaussianDp)
    assert restored.owner == "hospital-c"
    assert restored.history == acc.history
    np.testing.assert_array_equal(restored.total, acc.total)
    assert restored.spent(1e-5) == acc.spent(1e-5)
    rep, rep_back = acc.report(1e-5, Budget(5.0, 1e-5)), restored.report(1e-5, Budget(5.0, 1e-5))
    assert rep.to_dict() == rep_back.to_dict()
    assert rep.accountant == "gdp" and rep.order is None and not rep.data_dependent
    assert rep.events == 5 and set(rep.shares) == {"confident-gnmax", "weighted", "binary"}
    assert sum(rep.shares.values()) == pytest.approx(1.0)
    # Shares are of mu**2: the weighted copies cost a quarter each.
    assert rep.shares["weighted"] == pytest.approx(3 * 0.25 * rep.shares["confident-gnmax"])
    assert "gdp accountant" in rep.to_text()
    # A state naming an accountant that cannot read its events is refused.
    state["history"].append({"event": PureDpEvent(1.0).to_dict(), "count": 1, "label": "x"})
    with pytest.raises(UnsupportedEventError):
        Accountant.from_state_dict(state)


def test_a_budgeted_step_is_refused_over_a_history_the_filter_cannot_read() -> None:
    acc = Accountant("mixed")  # Renyi DP
    acc.compose(events.PureDpEvent(0.5), label="laplace")
    with pytest.raises(UnsupportedEventError, match="cannot filter further steps"):
        acc.compose(events.GaussianEvent(1.0, 10.0), budget=Budget(5.0, 1e-5))
