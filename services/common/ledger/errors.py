"""What the ledger raises when it refuses an operation; each message says why and what to do."""

from __future__ import annotations

from collections.abc import Mapping


class LedgerError(Exception):
    """A ledger operation was refused; the message says why and what to do."""


class BatchBrokenError(LedgerError):
    """A write inside a batch failed other than by a refusal: nothing of the batch was
    written (:meth:`services.common.ledger.store.Ledger.batch`)."""


class UnknownPartyError(LedgerError):
    pass


class UnknownTaskError(LedgerError):
    """No task of that name is registered; the message lists the known ones."""


class DuplicateRoundError(LedgerError):
    """A round key was used before: a replayed or duplicated round."""


class RoundStateError(LedgerError):
    """The round is not in a state that allows this transition."""


class TeacherCountError(LedgerError):
    """A party declared more teachers than its operator pinned, or none are pinned."""


class QuorumError(LedgerError):
    """Too few parties can afford the round. ``remaining`` maps every excluded party to its epsilon left."""

    def __init__(self, message: str, remaining: Mapping[str, float]) -> None:
        super().__init__(message)
        self.remaining = dict(remaining)
