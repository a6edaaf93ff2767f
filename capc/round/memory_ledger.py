"""A :class:`~capc.round.ledger.RoundLedger` in memory, with the SQL ledger's rules:
reservation of every party at once (nothing written below quorum), release before
any output, commit to the actual charge or at the reservation, abort only before
the release, per-querier allowances, float error rounded up, and crash recovery that
over-counts (a released round is charged its reservation), never under-counts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from capc.privacy import accountants
from capc.privacy.accountants import Accounting, UnsupportedEventError
from capc.privacy.events import DpEvent
from capc.round.errors import (
    DuplicateRoundError,
    LedgerRefusedError,
    RoundStateError,
    UnknownPartyError,
)
from capc.round.ledger import Held, Reservation, RoundRecord, RoundState, round_up
from capc.round.reservation import Standing, check_round, decide
from capc.round.training import Attestation, TrainingCharge, refusal

FloatArray = NDArray[np.float64]


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
    terms: Mapping[str, object] | None = None


@dataclass(frozen=True)
class AuditNote:
    """One entry of the memory ledger's audit list (the SQL ledger chains and signs its own)."""

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
    audit: list[AuditNote] = field(default_factory=list)
    _parties: dict[str, _Party] = field(default_factory=dict)
    _rounds: dict[int, _Round] = field(default_factory=dict)
    # querier -> party -> loss its rounds hold; querier -> its allowance per party.
    _querier_loss: dict[str, dict[str, FloatArray]] = field(default_factory=dict)
    _allowances: dict[str, float] = field(default_factory=dict)
    # (party, attestation digest) -> the training charged for it.
    _trainings: dict[tuple[str, str], TrainingCharge] = field(default_factory=dict)

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
            raise UnknownPartyError(f"no party named {name!r}")
        return p

    def _loss(self, event: DpEvent, what: str) -> FloatArray:
        try:
            loss = self.accounting.filter_cost(event)
        except (UnsupportedEventError, ValueError, ArithmeticError) as err:
            raise LedgerRefusedError(f"{what}: {err}") from err
        if not np.isfinite(loss).all():
            raise LedgerRefusedError(f"{what}: its privacy loss is not finite")
        return loss

    # -- DP-trained teachers -----------------------------------------------------
    def charge_training(
        self, party: str, attestation: Attestation, *, actor: str, fix: str = ""
    ) -> TrainingCharge:
        """Charge ``party`` its teachers' DP-SGD training once per attested digest
        (:mod:`capc.round.training`): checked against its cap first (TrainingRefusedError,
        nothing charged); the same digest again charges nothing (``charged`` False)."""
        p = self._party(party)
        known = self._trainings.get((party, attestation.digest))
        if known is not None:
            return TrainingCharge(party, known.attestation, known.epsilon, False)
        loss = self._loss(attestation.event(), f"DP-SGD training of {party}")
        epsilon = self._eps(loss)
        if not self.accounting.fits(p.loss + loss, p.cap, self.delta):
            raise refusal(party, epsilon, self._eps(p.loss), p.cap, self.delta, fix)
        p.loss = p.loss + loss
        charge = TrainingCharge(party, attestation, epsilon, True)
        self._trainings[(party, attestation.digest)] = charge
        self.record(actor, "dp_training", charge.to_dict())
        return charge

    def trainings(self, party: str | None = None) -> list[TrainingCharge]:
        """The trainings charged (of ``party``, when given), oldest first."""
        return [
            TrainingCharge(t.party, t.attestation, t.epsilon, False)
            for t in self._trainings.values()
            if party is None or t.party == party
        ]

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
        round_id: int | None = None,
        terms: Mapping[str, object] | None = None,
    ) -> Reservation:
        """See :meth:`RoundLedger.reserve`. ``round_id``: a party's own ledger numbers its
        rounds as the guardian does; ``terms``: what the round asked of the party, kept
        with it. DuplicateRoundError when the key or the id was used before."""
        check_round(queries, quorum)
        if round_id in self._rounds or any(r.key == round_key for r in self._rounds.values()):
            raise DuplicateRoundError(
                f"round {round_key!r} was opened before; a round key is used once"
            )
        if round_id is not None and round_id < 1:
            raise LedgerRefusedError(f"a round id is positive, got {round_id}")
        costs = {p: self._loss(e, f"worst case of {p}") for p, e in worst_case.items()}
        allowance = self._allowances.get(querier)
        mine = self._querier_loss.get(querier, {})
        standing = {
            p: Standing(party.cap, party.active, party.loss, mine.get(p))
            for p, party in self._parties.items()
            if p in costs
        }
        admitted = decide(
            self.accounting,
            self.delta,
            costs,
            standing,
            allowance=allowance,
            quorum=quorum,
            queries=queries,
        )
        included, excluded = admitted.included, admitted.excluded
        if round_id is None:
            round_id = max(self._rounds, default=0) + 1
        self._rounds[round_id] = _Round(
            round_key,
            task,
            querier,
            queries,
            RoundState.RESERVED,
            {p: costs[p] for p in included},
            {p: worst_case[p] for p in included},
            terms=None if terms is None else dict(terms),
        )
        spends = self._querier_loss.setdefault(querier, {})
        for p in included:
            self._parties[p].loss = self._parties[p].loss + costs[p]
            spends[p] = spends.get(p, self.accounting.zero()) + costs[p]
        detail = {"round": round_id, "included": list(included), "excluded": sorted(excluded)}
        self.record(querier, "reserve", detail)
        if disclosure is not None:
            self.record(querier, "clear_records", {"round": round_id, **disclosure})
        return Reservation(round_id, included, dict(excluded))

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
        release: bool = False,
    ) -> None:
        """See :meth:`RoundLedger.commit`; ``release``: a round still reserved is released
        first (a party's own ledger, told of a round whose output has left already)."""
        costs = {p: self._loss(e, f"charge of {p}") for p, e in actual.items()}
        self._commit(round_id, costs, dict(actual), outcome, release)

    def commit_at_reservation(self, round_id: int, *, release: bool = False) -> None:
        """See :meth:`RoundLedger.commit_at_reservation`; ``release`` as for :meth:`commit`."""
        rnd = self._round(round_id)
        self._commit(round_id, dict(rnd.held), dict(rnd.events), None, release)

    def _commit(
        self,
        round_id: int,
        costs: Mapping[str, FloatArray],
        events: Mapping[str, DpEvent | None],
        outcome: Mapping[str, object] | None,
        release: bool = False,
    ) -> None:
        rnd = self._round(round_id)
        if release and rnd.state == RoundState.RESERVED:
            self.release(round_id)
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
        return RoundRecord(round_id, rnd.state, rnd.outcome, held, rnd.terms)

    def open_rounds(self) -> list[int]:
        return sorted(
            rid
            for rid, r in self._rounds.items()
            if r.state in (RoundState.RESERVED, RoundState.RELEASED)
        )

    def record(
        self, actor: str, action: str, detail: Mapping[str, object], note: str | None = None
    ) -> None:
        self.audit.append(AuditNote(actor, action, dict(detail), note))


__all__ = ["AuditNote", "LedgerRefusedError", "MemoryLedger"]
