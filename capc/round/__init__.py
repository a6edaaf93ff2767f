"""One labelling round as pure protocol state (docs/architecture.md, "The round as a
library core, the services as adapters").

No transport, no threads, no clock: services drive it, passing "now".
:mod:`~capc.round.messages`: the frozen messages of a round;
:mod:`~capc.round.ledger`: the ledger port the guardian's round needs, with
:mod:`~capc.round.memory_ledger`, an in-memory ledger with the SQL ledger's rules;
:mod:`~capc.round.guardian`: the guardian's state machine, over
:mod:`~capc.round.state` (a round in flight), :mod:`~capc.round.admission` (checks
before anything is reserved), :mod:`~capc.round.personalization` (weights and
participation), :mod:`~capc.round.circuit` (the guardian's circuit inputs) and
:mod:`~capc.round.settlement` (how a round ended for a party);
:mod:`~capc.round.party`: an answering party's state machine, over its own ledger
(:class:`~capc.round.ledger.PartyLedger`, in memory:
:mod:`~capc.round.memory_party_ledger`); :mod:`~capc.round.student`: the student's;
:mod:`~capc.round.central`: the three roles driven in one process (central mode), the
only central labelling path, and :mod:`~capc.round.central_budget` its one budget filter.
"""

from capc.round.errors import (
    DuplicateRoundError,
    LedgerRefusedError,
    LimitError,
    QuorumError,
    RoundError,
    RoundInputError,
    RoundRefusedError,
    RoundRequestError,
    RoundStateError,
    VoteRefusedError,
)
from capc.round.guardian import GuardianCore, RoundView
from capc.round.ledger import KeptSetting, PartyLedger, Reservation, RoundLedger, RoundState
from capc.round.memory_ledger import MemoryLedger
from capc.round.memory_party_ledger import MemoryPartyLedger
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
from capc.round.party import PartyCore
from capc.round.student import StudentCore, StudentRound
from capc.round.task import MechanismTask

__all__ = [
    "DuplicateRoundError",
    "GuardianCore",
    "KeptSetting",
    "LedgerRefusedError",
    "LimitError",
    "MechanismTask",
    "MemoryLedger",
    "MemoryPartyLedger",
    "Opened",
    "PartyCore",
    "PartyLedger",
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
    "RoundView",
    "RoundWork",
    "Settlement",
    "ShareLayout",
    "StudentCore",
    "StudentRound",
    "VoteRefusedError",
    "VoteVerdict",
]
