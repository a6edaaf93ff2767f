"""One labelling round as pure protocol state (docs/architecture.md, "capc.round").

No transport, no threads, no clock: services drive it. :mod:`capc.round.messages`
holds the frozen messages of a round, :mod:`capc.round.ledger` the ledger port the
guardian's round needs (and an in-memory ledger with the SQL ledger's rules),
:mod:`capc.round.guardian` the guardian's state machine.
"""

from capc.round.errors import (
    LimitError,
    QuorumError,
    RoundError,
    RoundInputError,
    RoundRefusedError,
    RoundRequestError,
    RoundStateError,
)
from capc.round.guardian import GuardianCore, GuardianRound
from capc.round.ledger import MemoryLedger, Reservation, RoundLedger, RoundState
from capc.round.messages import (
    Opened,
    PartyShares,
    QueryBatch,
    Retry,
    RoundRequest,
    RoundWork,
    Settlement,
    ShareLayout,
    VoteVerdict,
)

__all__ = [
    "GuardianCore",
    "GuardianRound",
    "LimitError",
    "MemoryLedger",
    "Opened",
    "PartyShares",
    "QueryBatch",
    "QuorumError",
    "Reservation",
    "Retry",
    "RoundError",
    "RoundInputError",
    "RoundLedger",
    "RoundRefusedError",
    "RoundRequest",
    "RoundRequestError",
    "RoundState",
    "RoundStateError",
    "RoundWork",
    "Settlement",
    "ShareLayout",
    "VoteVerdict",
]
