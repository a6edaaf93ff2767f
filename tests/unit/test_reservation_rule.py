"""The reservation rule is one pure function (capc.round.reservation.decide) that both
ledgers call: the same rounds against the memory and the SQL ledger include and exclude
the same parties and refuse with the same message. And one vocabulary: the SQL ledger
raises the core's refusals, which one table maps to gRPC statuses."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capc.privacy import accountants
from capc.privacy.events import GaussianEvent
from capc.round import errors as core
from capc.round.memory_ledger import MemoryLedger
from capc.round.reservation import Standing, decide
from services.common.ledger import Ledger
from services.guardian.status import REFUSALS, STATUS, status_of

ROOT = Path(__file__).resolve().parents[2]
GDP = accountants.make("gdp")
DELTA = 1e-5


def _cost(sigma: float) -> GaussianEvent:
    return GaussianEvent(1.0, sigma)


def _loss(sigma: float) -> np.ndarray:
    return GDP.filter_cost(_cost(sigma))


def test_a_party_whose_cap_the_round_would_pass_is_left_out_and_told_what_is_left() -> None:
    costs = {"a": _loss(2.0), "b": _loss(2.0)}
    standing = {
        "a": Standing(10.0, True, GDP.zero()),
        # Already near its cap: this round would pass it.
        "b": Standing(1.0, True, _loss(0.8)),
    }
    got = decide(GDP, DELTA, costs, standing, allowance=None, quorum=1, queries=4)
    assert got.included == ("a",)
    left = 1.0 - GDP.spent(_loss(0.8), DELTA).epsilon
    assert got.excluded["b"] == pytest.approx(max(0.0, left))


def test_the_querier_allowance_binds_even_when_the_cap_does_not() -> None:
    costs = {"a": _loss(2.0)}
    held = _loss(1.0)
    standing = {"a": Standing(100.0, True, held, held)}
    allowance = GDP.spent(held, DELTA).epsilon + 0.01
    with pytest.raises(core.QuorumError) as refused:
        decide(GDP, DELTA, costs, standing, allowance=allowance, quorum=1, queries=1)
    assert refused.value.remaining["a"] == pytest.approx(0.01, abs=1e-9)
    # Without the allowance the same round fits.
    got = decide(GDP, DELTA, costs, standing, allowance=None, quorum=1, queries=1)
    assert got.included == ("a",)


def test_an_inactive_party_is_never_reserved_and_has_nothing_left() -> None:
    costs = {"a": _loss(5.0), "b": _loss(5.0)}
    standing = {"a": Standing(10.0, False, GDP.zero()), "b": Standing(10.0, True, GDP.zero())}
    got = decide(GDP, DELTA, costs, standing, allowance=None, quorum=1, queries=1)
    assert got.included == ("b",) and got.excluded == {"a": 0.0}


def test_below_quorum_the_refusal_names_each_excluded_party_and_what_fits() -> None:
    costs = {"a": _loss(1.0), "b": _loss(1.0)}
    standing = {"a": Standing(0.5, True, GDP.zero()), "b": Standing(10.0, True, GDP.zero())}
    with pytest.raises(core.QuorumError, match=r"only 1 of 2 parties .* quorum is 2.*a: "):
        decide(GDP, DELTA, costs, standing, allowance=None, quorum=2, queries=8)


def test_the_refusals_count_of_queries_that_fit_counts_the_allowance_too() -> None:
    """A party left out on the querier's allowance (its cap has room) was said to fit as
    many more queries as its cap covers: the student, told to ask for at most that many
    per round, was refused again. The count is what the reservation would admit."""
    unit = _loss(4.0)  # one query's worst case
    held = unit * 3  # this querier's rounds hold three queries' worth of the party
    standing = {"a": Standing(50.0, True, held, held)}
    allowance = GDP.spent(unit * 5, DELTA).epsilon  # room for two more queries, not ten
    with pytest.raises(core.QuorumError) as refused:
        decide(GDP, DELTA, {"a": unit * 10}, standing, allowance=allowance, quorum=1, queries=10)
    said = re.search(r"at most (\d+) more queries fit", str(refused.value))
    assert said is not None, str(refused.value)
    told = int(said.group(1))
    assert 0 < told < 10, str(refused.value)
    # What the refusal said fits, fits.
    got = decide(
        GDP, DELTA, {"a": unit * told}, standing, allowance=allowance, quorum=1, queries=told
    )
    assert got.included == ("a",)


@pytest.mark.parametrize(("queries", "quorum"), [(0, 1), (1, 0), (-3, 2)])
def test_a_round_of_no_query_or_no_quorum_is_a_bad_value(queries: int, quorum: int) -> None:
    with pytest.raises(core.LedgerValueError):
        decide(GDP, DELTA, {}, {}, allowance=None, quorum=quorum, queries=queries)


def test_an_unknown_party_is_refused_by_name() -> None:
    with pytest.raises(core.UnknownPartyError, match="'ghost'"):
        decide(GDP, DELTA, {"ghost": _loss(1.0)}, {}, allowance=None, quorum=1, queries=1)


@pytest.fixture
def sql_ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(str(tmp_path / "ledger.db"))
    ledger.create_task("t", {"k": 1})
    yield ledger
    ledger.close()


CAPS = {"a": 1.0, "b": 2.0, "c": 4.0}
round_sizes = st.lists(
    st.tuples(
        st.sampled_from([0.8, 1.5, 3.0, 6.0]),  # sigma of the round's worst case
        st.integers(1, 3),  # quorum
        st.sampled_from(["s1", "s2"]),  # querier
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(rounds=round_sizes, allowance=st.sampled_from([None, 1.5, 3.0]))
def test_both_ledgers_decide_every_round_alike(
    tmp_path_factory: pytest.TempPathFactory,
    rounds: list[tuple[float, int, str]],
    allowance: float | None,
) -> None:
    """A differential test: one sequence of reservations (some refused) on the memory
    and the SQL ledger gives the same included, excluded and refusal messages."""
    mem = MemoryLedger(accounting=accountants.make("gdp"), delta=DELTA)
    sql = Ledger(str(tmp_path_factory.mktemp("diff") / "ledger.db"), accountant="gdp", delta=DELTA)
    try:
        sql.create_task("t", {"k": 1})
        for name, cap in CAPS.items():
            mem.register(name, cap)
            sql.register_party(name, cap)
        for q in ("s1", "s2"):
            mem.set_allowance(q, allowance)
            if allowance is not None:
                sql.set_allowance(q, allowance, actor="op")
        for i, (sigma, quorum, querier) in enumerate(rounds):
            worst = {p: _cost(sigma) for p in CAPS}
            outcomes: list[tuple[object, dict[str, float]]] = []
            for ledger in (mem, sql):
                try:
                    r = ledger.reserve(
                        f"k{i}", "t", querier, 3, worst, mechanism="m", quorum=quorum
                    )
                    outcomes.append((r.included, dict(r.excluded)))
                except core.QuorumError as err:
                    outcomes.append((str(err), err.remaining))
            (a_in, a_ex), (b_in, b_ex) = outcomes
            assert a_in == b_in
            assert a_ex.keys() == b_ex.keys()
            for p in a_ex:
                assert a_ex[p] == pytest.approx(b_ex[p], abs=1e-9)
        for p in CAPS:
            assert mem.spent(p) == pytest.approx(sql.budget(p).spent, abs=1e-9)
    finally:
        sql.close()


def test_the_sql_ledger_raises_the_cores_refusals(sql_ledger: Ledger) -> None:
    sql_ledger.register_party("a", 0.01)
    worst = {"a": _cost(0.5)}
    with pytest.raises(core.QuorumError):
        sql_ledger.reserve("k", "t", "s", 1, worst, mechanism="m", quorum=1)
    with pytest.raises(core.UnknownPartyError):
        sql_ledger.reserve("k2", "t", "s", 1, {"zed": _cost(9.0)}, mechanism="m", quorum=1)
    with pytest.raises(core.UnknownTaskError):
        sql_ledger.reserve("k3", "nope", "s", 1, worst, mechanism="m", quorum=1)
    with pytest.raises(core.RoundStateError):
        sql_ledger.release(12345)


def _classes_defined(package: Path) -> list[tuple[str, str, list[str]]]:
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                found.append((str(path.relative_to(ROOT)), node.name, bases))
    return found


def test_the_ledger_and_the_guardian_define_no_refusal_of_their_own() -> None:
    """One vocabulary: a refusal class defined in the SQL ledger or the guardian would be
    a second name for a core refusal (the guardian keeps one: a duplicate stream)."""
    allowed = {
        ("services/guardian/round_errors.py", "DuplicateLinkError"),
        # Not refusals: a signing key that cannot be read, and a stream's own abort.
        ("services/common/ledger/audit.py", "AuditKeyError"),
        ("services/guardian/streams.py", "_AbortedError"),
    }
    own = [
        (path, name)
        for pkg in ("services/common/ledger", "services/guardian")
        for path, name, bases in _classes_defined(ROOT / pkg)
        if any(b.endswith(("Error", "Exception")) for b in bases)
    ]
    assert set(own) <= allowed, own


def test_every_core_refusal_maps_to_a_status_and_no_entry_is_shadowed() -> None:
    refusals: list[type[core.RoundError]] = [
        member
        for _, member in inspect.getmembers(core, inspect.isclass)
        if issubclass(member, core.RoundError) and member is not core.RoundError
    ]
    for refusal in refusals:
        if refusal is core.VoteRefusedError:
            continue  # a party's own refusal, reported in its stream, never an RPC status
        assert issubclass(refusal, REFUSALS), refusal
        assert status_of(refusal.__new__(refusal)) != grpc.StatusCode.UNKNOWN, refusal
    # An entry after one of its bases would never be reached.
    for i, (cls, _) in enumerate(STATUS):
        for base, _ in STATUS[:i]:
            assert not issubclass(cls, base), (cls, base)


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (core.QuorumError("x", {}), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (core.DuplicateRoundError("x"), grpc.StatusCode.ALREADY_EXISTS),
        (core.UnknownTaskError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (core.LedgerValueError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (core.RoundInputError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (core.RoundStateError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (core.TeacherCountError("x"), grpc.StatusCode.PERMISSION_DENIED),
        (RuntimeError("a defect"), grpc.StatusCode.UNKNOWN),
    ],
)
def test_the_status_table(err: Exception, code: grpc.StatusCode) -> None:
    assert status_of(err) == code
