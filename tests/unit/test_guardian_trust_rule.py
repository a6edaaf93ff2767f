"""When a party trusts the guardian enough to vote (capc.round.trust), on plain values."""

from __future__ import annotations

from capc.round.trust import goes_back, welcome

KEY, OTHER = "ab" * 32, "cd" * 32


def test_first_contact_pins_the_key_and_votes() -> None:
    got = welcome("gdp", "gdp", KEY, None)
    assert got.refusing is None and got.pin


def test_another_accounting_is_refused_even_at_first_contact() -> None:
    got = welcome("gdp", "rdp", KEY, None)
    assert got.refusing is not None and "cannot be compared" in got.refusing


def test_a_changed_key_is_refused_and_never_pinned_over_the_old_one() -> None:
    got = welcome("gdp", "gdp", OTHER, KEY)
    assert got.refusing is not None and "--guardian-audit-key " + OTHER in got.refusing
    assert not got.pin


def test_a_guardian_that_signs_nothing_is_refused() -> None:
    got = welcome("gdp", "gdp", "", None)
    assert got.refusing is not None and "signs no audit heads" in got.refusing
    assert not got.pin


def test_the_audit_history_may_only_grow() -> None:
    assert not goes_back(None, (0, "h"))
    assert not goes_back((3, "a"), (4, "b"))
    assert not goes_back((3, "a"), (3, "a"))
    assert goes_back((3, "a"), (2, "z"))
    assert goes_back((3, "a"), (3, "b"))  # same entry, other content: rewritten
