"""Failed checks between a querier (student) and an answering party, and where they point.

A vote validity check fails when the party's vote is invalid *or* when the
student's verifier message is wrong; a sealed seed fails to open when the party
sealed garbage *or* when the student says so falsely. One failure therefore
proves nothing about who deviated: the guardian records it as a *dispute*
naming both sides (audit action ``dispute``), and only the pattern over many
pairs says more. A party whose checks fail with several queriers while each of
those queriers fails with no other party points to the party; a querier whose
checks fail with several parties while each of those parties fails with no
other querier points to the querier. Anything else (a single pair, or both sides
failing with others) is left undetermined: a deviating student can make any one
honest party fail with it as often as it likes, so repetition within a pair is
no evidence. Colluding queriers can make a party look bad, as colluding parties
can a querier; the pattern is a lead for the operators, not a verdict.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

#: The audit action of a failed check between a querier and a party.
DISPUTE = "dispute"
#: Entries written before disputes (the party as actor, the querier in the detail).
LEGACY_INVALID_VOTE = "invalid_vote"
#: A dispute's ``check`` detail is "vote_validity" (the party's vote validity proof) or
#: "sealed_seed" (its sealed seed, which the student said did not open).
PointsTo = Literal["party", "querier", "undetermined"]


@dataclass(frozen=True)
class Dispute:
    """The failed checks between one querier and one party, and where the pattern points.

    ``party_queriers``: how many queriers this party has failed checks with;
    ``querier_parties``: how many parties this querier has failed checks with.
    """

    querier: str
    party: str
    failures: int
    party_queriers: int
    querier_parties: int
    points_to: PointsTo


def dispute_pair(action: str, actor: str, detail: Mapping[str, object]) -> tuple[str, str] | None:
    """The (querier, party) pair an audit entry disputes, or None for any other entry."""
    if action == DISPUTE:
        querier, party = detail.get("querier"), detail.get("party")
    elif action == LEGACY_INVALID_VOTE:
        querier, party = detail.get("querier"), actor
    else:
        return None
    if not isinstance(querier, str) or not isinstance(party, str):
        return None
    return querier, party


def attribute(pairs: Iterable[tuple[str, str]]) -> list[Dispute]:
    """Count the disputed (querier, party) pairs (one per failed check) and say where
    each pair's pattern points; sorted by querier, then party."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for pair in pairs:
        counts[pair] += 1
    queriers_of: dict[str, set[str]] = defaultdict(set)
    parties_of: dict[str, set[str]] = defaultdict(set)
    for querier, party in counts:
        queriers_of[party].add(querier)
        parties_of[querier].add(party)
    out = []
    for (querier, party), failures in sorted(counts.items()):
        with_party, with_querier = len(queriers_of[party]), len(parties_of[querier])
        # Every accuser must be clean, not only this pair's: one querier that also fails
        # with others is as likely a framer, and one more framer would then suffice.
        party_side = all(len(parties_of[q]) == 1 for q in queriers_of[party])
        querier_side = all(len(queriers_of[p]) == 1 for p in parties_of[querier])
        points: PointsTo = "undetermined"
        if with_party >= 2 and party_side:
            points = "party"
        elif with_querier >= 2 and querier_side:
            points = "querier"
        out.append(Dispute(querier, party, failures, with_party, with_querier, points))
    return out
