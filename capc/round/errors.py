"""Why the round core refuses something. Services map each class to their own status."""

from __future__ import annotations

from collections.abc import Mapping


class RoundError(Exception):
    """Base of the round core's refusals; the message says why and what to do."""


class RoundRequestError(RoundError, ValueError):
    """A round request is malformed or not allowed (INVALID_ARGUMENT)."""


class RoundInputError(RoundRequestError):
    """A party's or the student's message does not belong to the round (INVALID_ARGUMENT)."""


class RoundRefusedError(RoundError):
    """The round cannot run or go on: quorum lost, unknown or closed (FAILED_PRECONDITION)."""


class LimitError(RoundError):
    """An identity holds as many open rounds as it may (RESOURCE_EXHAUSTED)."""


class QuorumError(RoundError):
    """Too few parties can afford the round; nothing was reserved. ``remaining`` maps every
    excluded party to the epsilon it has left."""

    def __init__(self, message: str, remaining: Mapping[str, float]) -> None:
        super().__init__(message)
        self.remaining = dict(remaining)


class RoundStateError(RoundError):
    """The ledger's round is not in a state that allows this transition."""


class LedgerRefusedError(RoundError):
    """A ledger refused an operation (unknown party, reused key, bad event); the message
    says why."""


class DuplicateRoundError(LedgerRefusedError):
    """A round key or round id was used before: a replayed or duplicated round."""


class VoteRefusedError(RoundError):
    """An answering party will not vote in a round; ``budget``: because of its own cap.
    Nothing was spent in its own ledger."""

    def __init__(self, reason: str, *, budget: bool = False) -> None:
        super().__init__(reason)
        self.budget = budget


__all__ = [
    "DuplicateRoundError",
    "LedgerRefusedError",
    "LimitError",
    "QuorumError",
    "RoundError",
    "RoundInputError",
    "RoundRefusedError",
    "RoundRequestError",
    "RoundStateError",
    "VoteRefusedError",
]
