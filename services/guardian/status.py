"""The one table from a refusal to the gRPC status the guardian answers with.

The round core and the ledger raise :mod:`capc.round.errors`; the guardian's own
request checks raise :class:`services.common.protocol.RequestError`; each RPC handler
catches :data:`REFUSALS` and aborts with :func:`status_of`, so a refusal keeps its
class (and its message) from where it was raised to the student or the party."""

from __future__ import annotations

import grpc

from capc.round.errors import (
    DuplicateRoundError,
    LedgerRefusedError,
    LedgerValueError,
    LimitError,
    QuorumError,
    RoundRefusedError,
    RoundRequestError,
    TeacherCountError,
    UnknownPartyError,
    UnknownTaskError,
)
from capc.task_config import TaskError
from services.common.protocol import RequestError

#: First match wins (subclasses before their bases).
STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (RoundRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (RequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (LedgerValueError, grpc.StatusCode.INVALID_ARGUMENT),
    # A request naming a task the guardian does not hold is a bad argument (its message
    # lists the tasks there are), not a missing resource the caller could create.
    (UnknownTaskError, grpc.StatusCode.INVALID_ARGUMENT),
    (UnknownPartyError, grpc.StatusCode.NOT_FOUND),
    (QuorumError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (LimitError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DuplicateRoundError, grpc.StatusCode.ALREADY_EXISTS),
    (TeacherCountError, grpc.StatusCode.PERMISSION_DENIED),
    (TaskError, grpc.StatusCode.FAILED_PRECONDITION),
    (RoundRefusedError, grpc.StatusCode.FAILED_PRECONDITION),
    (LedgerRefusedError, grpc.StatusCode.FAILED_PRECONDITION),
)
#: Every class :func:`status_of` maps: what an RPC handler catches.
REFUSALS: tuple[type[Exception], ...] = tuple(cls for cls, _ in STATUS)


def status_of(err: Exception) -> grpc.StatusCode:
    """The status a refusal is answered with; UNKNOWN for anything not in :data:`STATUS`
    (a defect, not a refusal)."""
    for cls, code in STATUS:
        if isinstance(err, cls):
            return code
    return grpc.StatusCode.UNKNOWN


__all__ = ["REFUSALS", "STATUS", "status_of"]
