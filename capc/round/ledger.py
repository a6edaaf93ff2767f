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
from capc.round.training import Attestation, TrainingCharge

FloatArray = NDArray[np.float64]


def round_up(x: FloatArray, *terms: FloatArray) -> FloatArray:
    """``x``, computed from ``terms`` by adds and subtracts, moved up by two ulps of the
    largest term: float error never shrinks a total. Exact zeros stay zero."""
    scale = np.max(np.abs(np.stack([x, *terms])), axis=0)
    return np.where(x > 0, x + 2.0 * np.spacing(scale), 0.0)


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
    the packed ``answered`` mask, None when unknown), what is held per party, and (a
    party's own ledger) what the round asked of the party (``terms``, JSON)."""

    round_id: int
    state: RoundState
    outcome: Mapping[str, object] | None
    held: Mapping[str, Held]
    terms: Mapping[str, object] | None = None


@dataclass(frozen=True)
class KeptSetting:
    """A setting a ledger keeps in the same step as a round's settlement (a party's own
    ledger keeps the guardian's audit head that way): one durable write a round."""

    key: str
    value: str
    actor: str
    action: str = "setting"
    detail: Mapping[str, object] | None = None


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


class PartyLedger(Protocol):
    """What an answering party's role needs from its own ledger, which holds one party,
    itself. Every method is one atomic step; rounds carry the guardian's round ids."""

    @property
    def accounting(self) -> Accounting:
        """The accountant loss vectors are kept in (the guardian's, or the two ledgers
        could not be compared)."""
        ...

    @property
    def delta(self) -> float: ...

    @property
    def cap(self) -> float:
        """The party's own epsilon cap, at :attr:`delta`."""
        ...

    def reserve_vote(
        self,
        round_id: int,
        task: str,
        config: Mapping[str, object],
        queries: int,
        worst_case: DpEvent,
        *,
        mechanism: str,
        terms: Mapping[str, object],
    ) -> None:
        """Reserve the party's ``worst_case`` for the guardian's round ``round_id`` of task
        ``task`` (registered with ``config`` first; a task's configuration never changes
        under its name: LedgerRefusedError), keeping ``terms`` (JSON) with it.
        QuorumError, nothing written, when it would take the party past its cap
        (``remaining`` names the party); DuplicateRoundError when the round was reserved
        before."""
        ...

    def charge_training(self, attestation: Attestation) -> TrainingCharge:
        """Charge the party its DP-trained teachers' training once per attested digest
        (:mod:`capc.round.training`): TrainingRefusedError, nothing written, past its cap;
        the same digest again charges nothing (``charged`` False)."""
        ...

    def round_record(self, round_id: int) -> RoundRecord | None:
        """The round with its terms; None when this ledger never reserved it."""
        ...

    def open_rounds(self) -> list[int]:
        """Rounds reserved or released and not yet settled, oldest first."""
        ...

    def abort(self, round_id: int, *, reason: str, keep: KeptSetting | None = None) -> None:
        """Return a never-released round's reservation; ``keep`` kept in the same step."""
        ...

    def commit(
        self, round_id: int, charge: DpEvent | None, *, keep: KeptSetting | None = None
    ) -> None:
        """Replace the round's reservation by ``charge`` (None: nothing), releasing it
        first if it is still reserved; ``keep`` kept in the same step."""
        ...

    def commit_at_reservation(self, round_id: int, *, keep: KeptSetting | None = None) -> None:
        """Charge the round its reservation (what it released is unknown), releasing it
        first if it is still reserved; ``keep`` kept in the same step."""
        ...


__all__ = [
    "Held",
    "KeptSetting",
    "PartyLedger",
    "Reservation",
    "RoundLedger",
    "RoundRecord",
    "RoundState",
    "round_up",
]
