"""Budgets checked before anything is spent: a round's reservation, release, commit or abort.

Round life cycle (docs/architecture.md, "One labelling round", steps 3 and 11-13):

    reserve -> (release) -> commit      or      reserve -> abort

- ``reserve`` takes each answering party's worst-case privacy event for the
  round (every query answered) and has the ledger's accountant turn it into a
  loss vector; only events the accountant's budget filter is proven for are
  accepted (docs/privacy.md, "The budget filter"). In one transaction the ledger locks
  those parties' spend rows (``SELECT ... FOR UPDATE`` on PostgreSQL, an
  immediate write lock on SQLite), leaves out every party the charge would
  take past its cap, refuses the round below quorum, and otherwise records the
  reservation. Racing rounds therefore serialise on the party rows and can
  never overspend.
- ``release`` is written durably before the guardian sends anything that
  depends on its noise. From then on the round can only be committed.
- ``commit`` replaces the reservation with the actual charge.
- ``recover`` (at start-up) aborts rounds that were never released and
  commits released ones at their reservation: after a crash the ledger may
  over-count, never under-count.

Each step is one transaction of SQLAlchemy Core statements (a few per round,
one per table, whatever the number of parties), with its audit entries
appended together at its end (:mod:`services.common.ledger.chain`). A step
that fails part-way writes nothing. Inside :meth:`Ledger.batch` (a hospital's
settlement and next reservation, one commit a round) a step runs with no
savepoint: each raises its refusals before its first write, and any other
failure rolls the whole batch back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError

from capc.privacy.events import DpEvent
from capc.round.errors import (
    DuplicateRoundError,
    LedgerRefusedError,
    RoundStateError,
)
from capc.round.ledger import Reservation, RoundState, round_up
from capc.round.reservation import Standing, check_round, decide
from services.common.ledger import chain
from services.common.ledger.base import (
    FloatArray,
    LedgerBase,
    check_setting,
    unknown_task,
)
from services.common.ledger.models import ChargeKind, utcnow
from services.common.ledger.records import KeptSetting
from services.common.ledger.tables import (
    DELETE_CHARGES,
    INSERT_CHARGES,
    INSERT_NUMBERED_ROUND,
    INSERT_QUERIER_SPENDS,
    INSERT_ROUND,
    LIMITS,
    LIMITS_OF,
    OPENABLE,
    ROUND_CHARGES_LOCKED,
    ROUND_LOCKED,
    SET_ROUND_OUTCOME,
    SET_ROUND_STATE,
    UPDATE_CHARGES,
    lock_spends,
    rounds,
    write_querier_spends,
    write_spends,
)


def _locked_round(conn: Connection, round_id: int) -> tuple[RoundState, str]:
    """(state, querier) of a round, its row locked for this transaction."""
    row = ROUND_LOCKED.first(conn, {"rid": round_id})
    if row is None:
        raise RoundStateError(f"no round {round_id}")
    return RoundState(row[0]), str(row[1])


def _locked_round_rows(
    conn: Connection, round_id: int
) -> tuple[RoundState, str, dict[str, tuple[FloatArray, dict[str, object] | None]]]:
    """(state, querier, party -> (loss, event) of each of its rows) of a round, its row
    locked for this transaction: one statement."""
    found = ROUND_CHARGES_LOCKED.rows(conn, {"rid": round_id})
    if not found:
        raise RoundStateError(f"no round {round_id}")
    held = {
        p: (np.asarray(loss, dtype=np.float64), event)
        for _, _, p, loss, event in found
        if p is not None
    }
    return RoundState(found[0][0]), str(found[0][1]), held


class Reservations(LedgerBase):
    """A round's reservation, release, commit and abort."""

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
        round_id: int | None = None,
        terms: Mapping[str, object] | None = None,
        disclosure: Mapping[str, object] | None = None,
    ) -> Reservation:
        """Reserve each party's worst-case event for a round, leaving out parties it would take past their cap.

        Raises QuorumError (nothing written) if fewer than ``quorum`` remain,
        DuplicateRoundError if ``round_key`` (or ``round_id``) was used before.
        ``round_id``: a party's own ledger numbers its rounds as the guardian
        does; ``terms``: what the round asked of the party (JSON), kept with it;
        ``disclosure``: the querier's own records the round sends in the clear (the
        CaPC loop), audited as ``clear_records`` in the same transaction.
        """
        check_round(queries, quorum)
        costs = {p: self._loss(e, f"worst case of {p}") for p, e in worst_case.items()}
        stored_events = {p: e.to_dict() for p, e in worst_case.items()}
        names = sorted(costs)
        try:
            with self._write() as conn:
                # Every refusal comes before the first write (Ledger.batch runs this
                # step with no savepoint of its own). A round id of None matches no row.
                openable = OPENABLE.first(
                    conn, {"key": round_key, "rid": round_id, "task": task, "querier": querier}
                )
                if openable is None:
                    raise LedgerRefusedError("the ledger could not check the round's key and task")
                used, known_task, allowance = openable
                if used:
                    raise DuplicateRoundError(
                        f"round {round_key!r} was opened before; a round key is used once"
                    )
                if not known_task:
                    raise unknown_task(conn, task)
                spends, shares = lock_spends(conn, querier, names)
                if conn.dialect.name != "sqlite":
                    # READ COMMITTED: caps and allowance as they stand now that the spend
                    # rows are locked (a cut committed while the lock waited holds).
                    limits: Sequence[Sequence[Any]]
                    if len(names) == 1:
                        limits = LIMITS_OF.rows(conn, {"name": names[0], "querier": querier})
                    else:
                        limits = list(conn.execute(LIMITS, {"names": names, "querier": querier}))
                    for p, cap, status, _ in limits:
                        if p in spends:
                            spends[p].cap, spends[p].status = float(cap), str(status)
                    if limits:
                        allowance = limits[0][3]
                standing = {
                    p: Standing(sp.cap, sp.status == "active", sp.loss, shares.get(p))
                    for p, sp in spends.items()
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
                included, excluded = list(admitted.included), dict(admitted.excluded)
                now = utcnow()
                values: dict[str, object] = {
                    "round_key": round_key,
                    "task": task,
                    "querier": querier,
                    "queries": queries,
                    "state": RoundState.RESERVED,
                    "terms": None if terms is None else dict(terms),
                    "created_at": now,
                    "updated_at": now,
                }
                if round_id is not None:
                    INSERT_NUMBERED_ROUND.run(conn, {**values, "id": round_id})
                    rid = round_id
                else:
                    made_key = conn.execute(INSERT_ROUND, values).inserted_primary_key
                    if made_key is None:
                        raise LedgerRefusedError("the database gave the new round no id")
                    rid = int(made_key[0])
                INSERT_CHARGES.run_many(
                    conn,
                    [
                        {
                            "round_id": rid,
                            "party": p,
                            "kind": ChargeKind.RESERVATION,
                            "mechanism": mechanism,
                            "loss": costs[p].tolist(),
                            "event": stored_events[p],
                            "created_at": now,
                        }
                        for p in included
                    ],
                )
                fresh: list[str] = []
                for p in included:
                    spends[p].loss = spends[p].loss + costs[p]
                    spends[p].rounds += 1
                    spends[p].rounds_asked += 1
                    # Kept whether or not an allowance exists, so one set later counts what
                    # the querier spent before, and commits and aborts subtract what was added.
                    if p not in shares:
                        fresh.append(p)
                        shares[p] = self.accounting.zero()
                    shares[p] = shares[p] + costs[p]
                write_spends(conn, spends, included)
                if fresh:
                    INSERT_QUERIER_SPENDS.run_many(
                        conn,
                        [
                            {"querier": querier, "party": p, "loss": shares[p].tolist()}
                            for p in fresh
                        ],
                    )
                write_querier_spends(conn, querier, shares, [p for p in included if p not in fresh])
                entries = [
                    chain.Entry(
                        querier,
                        "reserve",
                        {
                            "round": rid,
                            "key": round_key,
                            "task": task,
                            "queries": queries,
                            "included": included,
                            "excluded": sorted(excluded),
                        },
                    )
                ]
                if disclosure is not None:
                    entries.append(
                        chain.Entry(querier, "clear_records", {"round": rid, **disclosure})
                    )
                self._append(conn, entries)
                return Reservation(rid, tuple(included), excluded)
        except IntegrityError as err:
            raise DuplicateRoundError(
                f"round {round_key!r} was opened before; a round key is used once"
            ) from err

    def release(self, round_id: int, *, actor: str = "guardian") -> None:
        """Mark a reserved round released, durably: call before any noisy output leaves."""
        with self._write() as conn:
            state, _ = _locked_round(conn, round_id)
            if state != RoundState.RESERVED:
                raise RoundStateError(
                    f"round {round_id} is {state.value}; only a reserved round can be released"
                )
            SET_ROUND_STATE.run(
                conn, {"b_rid": round_id, "b_state": RoundState.RELEASED, "b_at": utcnow()}
            )
            self._append(conn, [chain.Entry(actor, "release", {"round": round_id})])

    def commit(
        self,
        round_id: int,
        actual: Mapping[str, DpEvent],
        *,
        actor: str = "guardian",
        outcome: Mapping[str, object] | None = None,
        release: bool = False,
        keep: KeptSetting | None = None,
    ) -> None:
        """Replace a released round's reservations with the actual charges (events).

        Parties with a reservation but no entry in ``actual`` took no part in
        the result (they dropped out) and are charged nothing. An actual
        charge above the reservation is still charged in full and audited.
        ``outcome``: what the round released (JSON), kept with it. ``release``: a
        round still reserved is released first, in the same transaction (a party's
        own ledger, told of a round whose output has left already). ``keep``: a
        setting kept in that transaction too.
        """
        costs = {p: self._loss(e, f"charge of {p}") for p, e in actual.items()}
        events = {p: e.to_dict() for p, e in actual.items()}
        self._commit(round_id, costs, events, actor, outcome, release=release, keep=keep)

    def commit_at_reservation(
        self,
        round_id: int,
        *,
        actor: str,
        release: bool = False,
        keep: KeptSetting | None = None,
    ) -> None:
        """Commit a released round charging every party its reservation (the worst case):
        what is charged when what the round released is unknown. ``release`` and
        ``keep`` as for :meth:`commit`."""
        self._commit(round_id, None, {}, actor, release=release, keep=keep)

    def _commit(
        self,
        round_id: int,
        costs: Mapping[str, FloatArray] | None,
        charged: Mapping[str, dict[str, object] | None],
        actor: str,
        outcome: Mapping[str, object] | None = None,
        *,
        release: bool = False,
        keep: KeptSetting | None = None,
    ) -> None:
        """``costs`` None: every party is charged its reservation, with its event. Every
        refusal comes before the first write (:meth:`Ledger.batch`)."""
        check_setting(keep)
        with self._write() as conn:
            state, querier, held = _locked_round_rows(conn, round_id)
            entries: list[chain.Entry] = []
            if release and state == RoundState.RESERVED:
                state = RoundState.RELEASED
                entries.append(chain.Entry(actor, "release", {"round": round_id}))
            if state != RoundState.RELEASED:
                raise RoundStateError(
                    f"round {round_id} is {state.value}; only a released round can be committed"
                )
            if costs is None:
                costs = {p: loss for p, (loss, _) in held.items()}
                charged = {p: event for p, (_, event) in held.items()}
            extra = sorted(set(costs) - set(held))
            if extra:
                raise LedgerRefusedError(
                    f"round {round_id} reserved nothing for {extra}; they cannot be charged in it"
                )
            if keep is not None:
                kept = self._keep(conn, keep)
                if kept is not None:
                    entries.append(kept)
            names = sorted(held)
            spends, shares = lock_spends(conn, querier, names)
            over = []
            updates = []
            for p in names:
                reserved = held[p][0]
                charge = costs.get(p, self.accounting.zero())
                if (charge > reserved * (1 + 1e-12)).any():
                    over.append(p)
                total = spends[p].loss
                spends[p].loss = round_up(total - reserved + charge, total, reserved)
                if p in shares:
                    mine = shares[p]
                    shares[p] = round_up(mine - reserved + charge, mine, reserved)
                if p not in costs:
                    spends[p].rounds -= 1
                updates.append(
                    {
                        "b_rid": round_id,
                        "b_party": p,
                        "b_kind": ChargeKind.CHARGE,
                        "b_loss": charge.tolist(),
                        "b_event": charged.get(p),
                    }
                )
            write_spends(conn, spends, names)
            write_querier_spends(conn, querier, shares, [p for p in names if p in shares])
            UPDATE_CHARGES.run_many(conn, updates)
            done = {"b_rid": round_id, "b_state": RoundState.COMMITTED, "b_at": utcnow()}
            if outcome is None:
                SET_ROUND_STATE.run(conn, done)
            else:
                SET_ROUND_OUTCOME.run(conn, {**done, "b_outcome": dict(outcome)})
            entries.append(
                chain.Entry(
                    actor,
                    "commit",
                    {"round": round_id, "charged": sorted(costs), "above_reservation": over},
                )
            )
            self._append(conn, entries)

    def abort(
        self,
        round_id: int,
        *,
        actor: str = "guardian",
        reason: str = "",
        keep: KeptSetting | None = None,
    ) -> None:
        """Cancel a reserved (never released) round and return its reservations; ``keep``:
        a setting kept in the same transaction. Every refusal comes before the first write
        (:meth:`Ledger.batch`)."""
        check_setting(keep)
        with self._write() as conn:
            state, querier, rows = _locked_round_rows(conn, round_id)
            if state != RoundState.RESERVED:
                raise RoundStateError(
                    f"round {round_id} is {state.value}; only a round that was never released can be aborted"
                )
            entries: list[chain.Entry] = []
            if keep is not None:
                kept = self._keep(conn, keep)
                if kept is not None:
                    entries.append(kept)
            held = {p: loss for p, (loss, _) in rows.items()}
            names = sorted(held)
            spends, shares = lock_spends(conn, querier, names)
            for p in names:
                total, reserved = spends[p].loss, held[p]
                spends[p].loss = round_up(total - reserved, total, reserved)
                spends[p].rounds -= 1
                if p in shares:
                    mine = shares[p]
                    shares[p] = round_up(mine - reserved, mine, reserved)
            write_spends(conn, spends, names)
            write_querier_spends(conn, querier, shares, [p for p in names if p in shares])
            DELETE_CHARGES.run(conn, {"rid": round_id})
            SET_ROUND_STATE.run(
                conn, {"b_rid": round_id, "b_state": RoundState.ABORTED, "b_at": utcnow()}
            )
            entries.append(chain.Entry(actor, "abort", {"round": round_id, "reason": reason}))
            self._append(conn, entries)

    def recover(self) -> tuple[int, int]:
        """After a restart: abort never-released rounds, commit released ones at their reservation.

        Returns (aborted, committed).
        """
        with self.engine.connect() as conn:
            pending = list(
                conn.execute(
                    select(rounds.c.id, rounds.c.state).where(
                        rounds.c.state.in_([RoundState.RESERVED, RoundState.RELEASED])
                    )
                )
            )
        aborted = committed = 0
        for rid, state in pending:
            if state == RoundState.RESERVED:
                self.abort(rid, actor="recovery", reason="guardian restarted before release")
                aborted += 1
            else:
                self.commit_at_reservation(rid, actor="recovery")
                committed += 1
        return aborted, committed
