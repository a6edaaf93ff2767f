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
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from capc.privacy import accountants
from capc.privacy.accountants import Accounting, UnsupportedEventError
from capc.privacy.events import DpEvent
from capc.round.errors import QuorumError, RoundError, RoundStateError

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


class LedgerRefusedError(RoundError):
    """The in-memory ledger refused an operation (unknown party, reused key, bad event)."""


def round_up(x: FloatArray, *terms: FloatArray) -> FloatArray:
    """``x``, computed from ``terms`` by adds and subtracts, moved up by two ulps of the
    largest term: float error never shrinks a total. Exact zeros stay zero."""
    scale = np.max(np.abs(np.stack([x, *terms])), axis=0)
    return np.where(x > 0, x + 2.0 * np.spacing(scale), 0.0)


@dataclass
class _Party:
    cap: float
    role: str
    active: bool
    loss: FloatArray


@dataclass
class _Round:
    key: str
    task: str
    querier: str
    queries: int
    state: RoundState
    # party -> loss vector held: the reservation, then the charge.
    held: dict[str, FloatArray]
    events: dict[str, DpEvent | None]
    settled: bool = False
    outcome: Mapping[str, object] | None = None


@dataclass(frozen=True)
class AuditEntry:
    actor: str
    action: str
    detail: Mapping[str, object]
    note: str | None = None


@dataclass
class MemoryLedger:
    """A :class:`RoundLedger` in memory, with the SQL ledger's rules (see the module).

    ``accounting`` defaults to the tightest sound accountant (Gaussian DP).
    """

    accounting: Accounting = field(
        default_factory=lambda: accountants.make(accountants.DEFAULT_ACCOUNTANT)
    )
    delta: float = 1e-5
    audit: list[AuditEntry] = field(default_factory=list)
    _parties: dict[str, _Party] = field(default_factory=dict)
    _rounds: dict[int, _Round] = field(default_factory=dict)
    # querier -> party -> loss its rounds hold; querier -> its allowance per party.
    _querier_loss: dict[str, dict[str, FloatArray]] = field(default_factory=dict)
    _allowances: dict[str, float] = field(default_factory=dict)

    # -- parties ----------------------------------------------------------------
    def register(
        self, name: str, cap: float, *, role: str = "answerer", active: bool = True
    ) -> None:
        if not (math.isfinite(cap) and cap > 0):
            raise LedgerRefusedError(f"epsilon cap must be a positive number, got {cap}")
        self._parties[name] = _Party(float(cap), role, active, self.accounting.zero())

    def set_allowance(self, querier: str, cap: float | None) -> None:
        """Cap what ``querier``'s rounds may spend of each party (None: no cap)."""
        if cap is None:
            self._allowances.pop(querier, None)
        else:
            self._allowances[querier] = float(cap)

    def _eps(self, loss: FloatArray) -> float:
        return self.accounting.spent(loss, self.delta).epsilon

    def spent(self, party: str) -> float:
        """Epsilon of ``party``'s charges and open reservations."""
        return self._eps(self._party(party).loss)

    def spent_loss(self, party: str) -> FloatArray:
        return self._party(party).loss.copy()

    def remaining(self, party: str) -> float:
        p = self._party(party)
        return max(0.0, p.cap - self._eps(p.loss))

    def caps(self) -> Mapping[str, float]:
        return {n: p.cap for n, p in sorted(self._parties.items()) if p.role == "answerer"}

    def _party(self, name: str) -> _Party:
        p = self._parties.get(name)
        if p is None:
            raise LedgerRefusedError(f"no party named {name!r}")
        return p

    def _loss(self, event: DpEvent, what: str) -> FloatArray:
        try:
            loss = self.accounting.filter_cost(event)
        except (UnsupportedEventError, ValueError, ArithmeticError) as err:
            raise LedgerRefusedError(f"{what}: {err}") from err
        if not np.isfinite(loss).all():
            raise LedgerRefusedError(f"{what}: its privacy loss is not finite")
        return loss

    # -- rounds -----------------------------------------------------------------
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
        if queries < 1 or quorum < 1:
            raise LedgerRefusedError(
                f"a round has >= 1 query and quorum >= 1, got {queries}, {quorum}"
            )
        if any(r.key == round_key for r in self._rounds.values()):
            raise LedgerRefusedError(
                f"round {round_key!r} was opened before; a round key is used once"
            )
        costs = {p: self._loss(e, f"worst case of {p}") for p, e in worst_case.items()}
        names = sorted(costs)
        for p in names:
            self._party(p)
        allowance = self._allowances.get(querier)
        mine = self._querier_loss.get(querier, {})
        included: list[str] = []
        excluded: dict[str, float] = {}
        for p in names:
            party = self._parties[p]
            if not party.active:
                excluded[p] = 0.0
                continue
            left = party.cap - self._eps(party.loss)
            fits = self.accounting.fits(party.loss + costs[p], party.cap, self.delta)
            if allowance is not None:
                held = mine.get(p, self.accounting.zero())
                left = min(left, allowance - self._eps(held))
                fits = fits and self.accounting.fits(held + costs[p], allowance, self.delta)
            if fits:
                included.append(p)
            else:
                excluded[p] = max(0.0, left)
        if len(included) < quorum:
            raise QuorumError(
                f"only {len(included)} of {len(names)} parties can afford this round, quorum "
                f"is {quorum}; excluded: {', '.join(sorted(excluded))}",
                excluded,
            )
        round_id = max(self._rounds, default=0) + 1
        self._rounds[round_id] = _Round(
            round_key,
            task,
            querier,
            queries,
            RoundState.RESERVED,
            {p: costs[p] for p in included},
            {p: worst_case[p] for p in included},
        )
        spends = self._querier_loss.setdefault(querier, {})
        for p in included:
            self._parties[p].loss = self._parties[p].loss + costs[p]
            spends[p] = spends.get(p, self.accounting.zero()) + costs[p]
        detail = {"round": round_id, "included": included, "excluded": sorted(excluded)}
        self.record(querier, "reserve", detail)
        if disclosure is not None:
            self.record(querier, "clear_records", {"round": round_id, **disclosure})
        return Reservation(round_id, tuple(included), excluded)

    def _round(self, round_id: int) -> _Round:
        rnd = self._rounds.get(round_id)
        if rnd is None:
            raise RoundStateError(f"no round {round_id}")
        return rnd

    def release(self, round_id: int) -> None:
        rnd = self._round(round_id)
        if rnd.state != RoundState.RESERVED:
            raise RoundStateError(
                f"round {round_id} is {rnd.state.value}; only a reserved round can be released"
            )
        rnd.state = RoundState.RELEASED
        self.record("guardian", "release", {"round": round_id})

    def commit(
        self,
        round_id: int,
        actual: Mapping[str, DpEvent],
        *,
        outcome: Mapping[str, object] | None = None,
    ) -> None:
        costs = {p: self._loss(e, f"charge of {p}") for p, e in actual.items()}
        self._commit(round_id, costs, dict(actual), outcome)

    def commit_at_reservation(self, round_id: int) -> None:
        rnd = self._round(round_id)
        self._commit(round_id, dict(rnd.held), dict(rnd.events), None)

    def _commit(
        self,
        round_id: int,
        costs: Mapping[str, FloatArray],
        events: Mapping[str, DpEvent | None],
        outcome: Mapping[str, object] | None,
    ) -> None:
        rnd = self._round(round_id)
        if rnd.state != RoundState.RELEASED:
            raise RoundStateError(
                f"round {round_id} is {rnd.state.value}; only a released round can be committed"
            )
        extra = sorted(set(costs) - set(rnd.held))
        if extra:
            raise LedgerRefusedError(f"round {round_id} reserved nothing for {extra}")
        spends = self._querier_loss.get(rnd.querier, {})
        for p, reserved in rnd.held.items():
            # A charge above the reservation is still charged in full.
            charge = costs.get(p, self.accounting.zero())
            total = self._parties[p].loss
            self._parties[p].loss = round_up(total - reserved + charge, total, reserved)
            if p in spends:
                spends[p] = round_up(spends[p] - reserved + charge, spends[p], reserved)
            rnd.held[p] = charge
            rnd.events[p] = events.get(p)
        rnd.state, rnd.settled, rnd.outcome = RoundState.COMMITTED, True, outcome
        self.record("guardian", "commit", {"round": round_id, "charged": sorted(costs)})

    def abort(self, round_id: int, *, reason: str) -> None:
        rnd = self._round(round_id)
        if rnd.state != RoundState.RESERVED:
            raise RoundStateError(
                f"round {round_id} is {rnd.state.value}; only a round that was never "
                "released can be aborted"
            )
        spends = self._querier_loss.get(rnd.querier, {})
        for p, held in rnd.held.items():
            total = self._parties[p].loss
            self._parties[p].loss = round_up(total - held, total, held)
            if p in spends:
                spends[p] = round_up(spends[p] - held, spends[p], held)
        rnd.held.clear()
        rnd.events.clear()
        rnd.state = RoundState.ABORTED
        self.record("guardian", "abort", {"round": round_id, "reason": reason})

    def recover(self) -> tuple[int, int]:
        """After a crash of whoever drove the rounds: abort never-released rounds, charge
        released ones their reservation (over-count, never under-count). (aborted,
        committed)."""
        aborted = committed = 0
        for rid, rnd in sorted(self._rounds.items()):
            if rnd.state == RoundState.RESERVED:
                self.abort(rid, reason="restarted before release")
                aborted += 1
            elif rnd.state == RoundState.RELEASED:
                self.commit_at_reservation(rid)
                committed += 1
        return aborted, committed

    def round_state(self, round_id: int) -> RoundState:
        return self._round(round_id).state

    def round_record(self, round_id: int) -> RoundRecord | None:
        rnd = self._rounds.get(round_id)
        if rnd is None:
            return None
        held = {p: Held(rnd.settled, rnd.events.get(p) is not None) for p in rnd.held}
        return RoundRecord(round_id, rnd.state, rnd.outcome, held)

    def open_rounds(self) -> list[int]:
        return sorted(
            rid
            for rid, r in self._rounds.items()
            if r.state in (RoundState.RESERVED, RoundState.RELEASED)
        )

    def record(
        self, actor: str, action: str, detail: Mapping[str, object], note: str | None = None
    ) -> None:
        self.audit.append(AuditEntry(actor, action, dict(detail), note))


__all__ = [
    "AuditEntry",
    "Held",
    "LedgerRefusedError",
    "MemoryLedger",
    "Reservation",
    "RoundLedger",
    "RoundRecord",
    "RoundState",
    "round_up",
]
