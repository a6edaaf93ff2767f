"""The CaPC loop's rule on plain values (capc.round.loop), with no ledger or wire:
a bound querier's hospital is always left out, and records leave in the clear only
by an explicit, audited choice."""

from __future__ import annotations

import pytest

from capc.round.errors import RoundRequestError
from capc.round.loop import MAX_NAME, Binding, LoopAsk, loop_terms


def test_a_bound_querier_leaves_its_hospital_out_whatever_it_claims() -> None:
    terms = loop_terms("q", Binding("h0"), LoopAsk(), 8)
    assert terms.left_out == frozenset({"h0"}) and terms.disclosure is None
    with pytest.raises(RoundRequestError, match="bound it to h0"):
        loop_terms("q", Binding("h0"), LoopAsk(hospital="h1"), 8)


def test_clear_records_of_a_bound_querier_need_the_explicit_choice_and_are_audited() -> None:
    with pytest.raises(RoundRequestError, match="reveal_records"):
        loop_terms("q", Binding("h0"), LoopAsk(clear=True), 8)
    who = "x" * (MAX_NAME + 50)
    terms = loop_terms("q", Binding("h0"), LoopAsk(clear=True, reveal=True, revealed_by=who), 8)
    assert terms.disclosure == {
        "querier": "q",
        "hospital": "h0",
        "records": 8,
        "revealed_by": "x" * MAX_NAME,
    }


def test_unbound_clear_queries_follow_the_ledgers_policy() -> None:
    with pytest.raises(RoundRequestError, match="no binding covers it"):
        loop_terms("q", Binding(), LoopAsk(clear=True, reveal=True), 8)
    allowed = loop_terms("q", Binding(refuse_unbound_clear=False), LoopAsk(clear=True), 8)
    assert allowed.left_out == frozenset() and allowed.disclosure is None


def test_an_outside_querier_claims_no_hospital_and_its_clear_rounds_are_audited() -> None:
    with pytest.raises(RoundRequestError, match="outside the consortium"):
        loop_terms("q", Binding(outside=True), LoopAsk(hospital="h0"), 8)
    terms = loop_terms("q", Binding(outside=True), LoopAsk(clear=True), 3)
    assert terms.disclosure == {"querier": "q", "hospital": None, "records": 3, "outside": True}
