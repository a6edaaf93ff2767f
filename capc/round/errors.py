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


class LedgerRefusedError(RoundError):
    """A ledger refused an operation (unknown party, reused key, bad event, past a cap);
    the message says why and what to do. Every ledger, in memory or SQL, raises these
    classes and no others of its own."""


class LedgerValueError(LedgerRefusedError, ValueError):
    """A value given to a ledger is out of its range (a count, a confidence, a text's
    length): the caller's request is at fault, not the ledger's state."""


class QuorumError(LedgerRefusedError):
    """Too few parties can afford the round; nothing was reserved. ``remaining`` maps every
    excluded party to the epsilon it has left."""

    def __init__(self, message: str, remaining: Mapping[str, float]) -> None:
        super().__init__(message)
        self.remaining = dict(remaining)


class RoundStateError(LedgerRefusedError):
    """The ledger's round is not in a state that allows this transition."""


class DuplicateRoundError(LedgerRefusedError):
    """A round key or round id was used before: a replayed or duplicated round."""


class UnknownPartyError(LedgerRefusedError):
    """No party of that name is registered."""


class UnknownTaskError(LedgerRefusedError):
    """No task of that name is registered; the message lists the known ones."""


class TeacherCountError(LedgerRefusedError):
    """A party declared more teachers than its operator pinned, or none are pinned."""


class BatchBrokenError(LedgerRefusedError):
    """A step inside a ledger batch failed other than by a refusal: nothing of the batch
    was written."""


class VoteRefusedError(RoundError):
    """An answering party will not vote in a round; ``budget``: because of its own cap.
    Nothing was spent in its own ledger."""

    def __init__(self, reason: str, *, budget: bool = False) -> None:
        super().__init__(reason)
        self.budget = budget


__all__ = [
    "BatchBrokenError",
    "DuplicateRoundError",
    "LedgerRefusedError",
    "LedgerValueError",
    "LimitError",
    "QuorumError",
    "RoundError",
    "RoundInputError",
    "RoundRefusedError",
    "RoundRequestError",
    "RoundStateError",
    "TeacherCountError",
    "UnknownPartyError",
    "UnknownTaskError",
    "VoteRefusedError",
]
