"""The ledger port of the guardian's round, and an in-memory ledger with its rules.

A round needs exactly this of a ledger (:class:`RoundLedger`): reserve every
party's worst case in one step before anything is spent (leaving out parties
it would take past their cap, refusing below quorum with nothing written),
mark the round released before any output leaves, settle it to the actual
charge or at its reservation, abort a never-released round (its reservations
go back), read caps and what is left, and audit what the guardian saw.

:class:`MemoryLedger` keeps those rules in memory, for tests and simulations;
the guardian's SQL ledger (``services.common.ledger``) keeps them in one
transaction each. Both may over-count after a crash (:meth:`MemoryLedger.recover`
charges a released round its reservation), never under-count: float error in
a settlement is rounded up, and a reservation is returned only for a round
whose output never left.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from capc.privacy.accountants import Accounting
from capc.privacy.events import DpEvent

FloatArray = NDArray[np.float64]


class RoundState(enum.StrEnum):
    """Where a round stands in the ledger: reserved -> released -> committed, or aborted
    from reserved only."""

    RESERVED = "reserved"
    RELEASED = "released"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Reservation:
    """A reserved round: its id, the parties reserved for, and per party left out the
    epsilon it has left (at the ledger's delta)."""

    round_id: int
    included: tuple[str, ...]
    excluded: Mapping[str, float]


@dataclass(frozen=True)
class Held:
    """What a ledger holds for one party of a round: ``settled``: the reservation was
    replaced by a charge; ``charged``: that charge is an event (not nothing)."""

    settled: bool
    charged: bool


@dataclass(frozen=True)
class RoundRecord:
    """A round as a settlement needs it: state, what it released (``outcome``: JSON with
    the packed ``answered`` mask, None when unknown), and what is held per party."""

    round_id: int
    state: RoundState
    outcome: Mapping[str, object] | None
    held: Mapping[str, Held]


class RoundLedger(Protocol):
    """What the guardian's round needs from its ledger. Every method is one atomic step."""

    @property
    def accounting(self) -> Accounting:
        """The accountant loss vectors are kept in."""
        ...

    @property
    def delta(self) -> float:
        """The delta every epsilon is stated at."""
        ...

    def caps(self) -> Mapping[str, float]:
        """Every answering party's enforced epsilon cap."""
        ...

    def remaining(self, party: str) -> float:
        """Epsilon ``party`` has left, open reservations counted as spent."""
        ...

    def reserve(
        self,
        round_key: str,
        task: str,
        querier: str,
        queries: int,
        worst_case: Mapping[str, DpEvent],
        *,
        mechanism: str,
        quorum: int,
        disclosure: Mapping[str, object] | None = None,
    ) -> Reservation:
        """Reserve every party's worst case at once, leaving out parties it would take past
        their cap; QuorumError, with nothing written, when fewer than ``quorum`` remain."""
        ...

    def release(self, round_id: int) -> None:
        """Mark a reserved round released; call before any output leaves.
        RoundStateError unless it is reserved."""
        ...

    def commit(
        self,
        round_id: int,
        actual: Mapping[str, DpEvent],
        *,
        outcome: Mapping[str, object] | None = None,
    ) -> None:
        """Replace a released round's reservations by ``actual`` (parties left out of it:
        nothing). RoundStateError unless it is released."""
        ...

    def commit_at_reservation(self, round_id: int) -> None:
        """Charge every party of a released round its reservation (what it released is
        unknown). RoundStateError unless it is released."""
        ...

    def abort(self, round_id: int, *, reason: str) -> None:
        """Return a never-released round's reservations. RoundStateError unless reserved."""
        ...

    def round_state(self, round_id: int) -> RoundState:
        """RoundStateError when there is no such round."""
        ...

    def round_record(self, round_id: int) -> RoundRecord | None: ...

    def record(
        self, actor: str, action: str, detail: Mapping[str, object], note: str | None = None
    ) -> None:
        """Append to the audit log (``note``: untrusted free text)."""
        ...


__all__ = ["Held", "Reservation", "RoundLedger", "RoundRecord", "RoundState"]
