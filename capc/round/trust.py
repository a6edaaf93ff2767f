"""When an answering party trusts the guardian enough to vote: the same accounting
(else the two ledgers' spends cannot be compared), an audit key it can check heads
with (pinned at first contact, never silently changed), and a signed audit history
that only grows. Pure rules over plain values; the party's adapter reads its ledger
and the guardian's messages, and checks signatures."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Welcome:
    """What the party makes of the guardian's welcome: ``refusing`` why it will not vote
    (None: it will), and ``pin``: the guardian's key is to be pinned now (first contact)."""

    refusing: str | None
    pin: bool


def welcome(mine: str, theirs: str, key: str, pinned: str | None) -> Welcome:
    """The party's accounting ``mine`` and the guardian's ``theirs`` (their JSON
    descriptions), the guardian's audit ``key`` (hex; '' when it signs no heads) and the
    key this party pinned before (None: none yet)."""
    refusing = None
    if theirs != mine:
        refusing = (
            f"the guardian accounts with {theirs or 'an unstated accountant'}, this party's "
            f"ledger with {mine}: their spends cannot be compared. Start this party with a "
            "new --ledger and the guardian's --accountant and --delta"
        )
    if not key:
        return Welcome(
            refusing
            or (
                "the guardian signs no audit heads; this party votes only for a guardian "
                "whose audit log it can check"
            ),
            False,
        )
    if pinned is None:
        return Welcome(refusing, True)
    if pinned != key:
        refusing = (
            f"the guardian's audit key changed from {pinned} to {key}: its earlier heads "
            "could no longer be checked. If the consortium rotated the key, restart this "
            f"party with --guardian-audit-key {key}"
        )
    return Welcome(refusing, False)


def goes_back(before: tuple[int, str] | None, now: tuple[int, str]) -> bool:
    """Whether the guardian's audit head ``now`` (sequence number, hash) goes back from,
    or rewrites, the newest one accepted ``before``: its history must only grow."""
    if before is None:
        return False
    (seq0, hash0), (seq, digest) = before, now
    return seq < seq0 or (seq == seq0 and digest != hash0)


__all__ = ["Welcome", "goes_back", "welcome"]
