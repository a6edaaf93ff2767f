"""Where failed checks between queriers and parties point (issue 41, item 2)."""

from __future__ import annotations

from pathlib import Path

from services.common.ledger import Ledger
from services.common.ledger.disputes import Dispute, attribute, dispute_pair


def test_one_pair_points_nowhere_however_often_it_fails() -> None:
    """A deviating student can fail one honest party's checks as often as it likes."""
    assert attribute([("s", "h")] * 50) == [Dispute("s", "h", 50, 1, 1, "undetermined")]
    assert attribute([]) == []


def test_a_party_failing_with_many_queriers_points_to_the_party() -> None:
    pairs = [("s1", "bad"), ("s2", "bad"), ("s2", "bad"), ("s3", "bad")]
    assert attribute(pairs) == [
        Dispute("s1", "bad", 1, 3, 1, "party"),
        Dispute("s2", "bad", 2, 3, 1, "party"),
        Dispute("s3", "bad", 1, 3, 1, "party"),
    ]


def test_a_querier_failing_with_many_parties_points_to_the_querier() -> None:
    pairs = [("framer", "h0"), ("framer", "h1"), ("framer", "h0")]
    assert attribute(pairs) == [
        Dispute("framer", "h0", 2, 1, 2, "querier"),
        Dispute("framer", "h1", 1, 1, 2, "querier"),
    ]


def test_both_sides_failing_with_others_points_nowhere() -> None:
    """s1 fails with h0 and h1, h0 with s1 and s2: every pair could be either side's
    doing (s1 framing both, or h0 and h1 deviating), so none points anywhere."""
    pairs = [("s1", "h0"), ("s1", "h1"), ("s2", "h0")]
    points = {(d.querier, d.party): d.points_to for d in attribute(pairs)}
    assert points == {
        ("s1", "h0"): "undetermined",
        ("s1", "h1"): "undetermined",
        ("s2", "h0"): "undetermined",
    }


def test_a_known_framer_and_one_more_querier_do_not_point_to_an_honest_party() -> None:
    """Two deviating students frame honest h0: s1 also fails with h1 and h2 (its pattern
    looks like a framer), s2 only with h0. h0's accusers are not all clean, so no pair
    points to h0 (before, (s2, h0) did: one clean accuser sufficed). s1's parties are
    not all clean either (h0 fails with s2 too), so as docs/security.md states the rule
    its pairs stay undetermined as well."""
    pairs = [("s1", "h0"), ("s1", "h1"), ("s1", "h2"), ("s2", "h0"), ("s2", "h0")]
    points = {(d.querier, d.party): d.points_to for d in attribute(pairs)}
    assert points[("s2", "h0")] == "undetermined"
    assert points[("s1", "h0")] == "undetermined"
    assert points[("s1", "h1")] == points[("s1", "h2")] == "undetermined"


def test_entries_name_their_pair_and_legacy_entries_count() -> None:
    detail = {"querier": "s", "party": "h", "round": 3}
    assert dispute_pair("dispute", "guardian", detail) == ("s", "h")
    # Before disputes the guardian wrote invalid_vote with the party as actor.
    assert dispute_pair("invalid_vote", "h", {"querier": "s", "round": 3}) == ("s", "h")
    assert dispute_pair("abort", "guardian", detail) is None
    assert dispute_pair("dispute", "guardian", {"querier": "s"}) is None


def test_the_ledger_counts_disputes_over_its_whole_log(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "d.db"))
    ledger.record("h0", "invalid_vote", {"round": 1, "querier": "s1"})  # an older log's entry
    for r, (querier, party) in enumerate([("s2", "h0"), ("s1", "h1"), ("s2", "h0")], start=2):
        check = {"round": r, "querier": querier, "party": party, "check": "vote_validity"}
        ledger.record("guardian", "dispute", check)
    ledger.record("guardian", "abort", {"round": 9, "reason": "h0 ... s1"})
    assert ledger.disputes() == [
        Dispute("s1", "h0", 1, 2, 2, "undetermined"),
        Dispute("s1", "h1", 1, 1, 2, "undetermined"),
        Dispute("s2", "h0", 2, 2, 1, "undetermined"),
    ]
