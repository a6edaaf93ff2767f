"""Who and what a ledger knows: parties with their caps and teacher counts, tasks,
queriers' allowances, parties' reports, and settings kept for its owner.

Every change here is audited in its own transaction.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping

import numpy as np
from sqlalchemy.orm import Session

from capc.round.errors import LedgerRefusedError, TeacherCountError, UnknownPartyError
from capc.task_config import config_hash
from services.common.db import iso_utc
from services.common.ledger.base import (
    MAX_CAP_REASON,
    FloatArray,
    LedgerBase,
    check_setting,
    enforced,
    positive_cap,
    registered_cap,
    teacher_count,
    unknown_task,
)
from services.common.ledger.models import (
    AllowanceRow,
    PartyRow,
    QuerierSpendRow,
    SpendRow,
    TaskRow,
    utcnow,
)
from services.common.ledger.records import KeptSetting
from services.common.ledger.tables import SET_PARTY_REPORT, SETTING, TOUCH_PARTY


class Registry(LedgerBase):
    """Parties, tasks, allowances, reports and kept settings."""

    def setting(self, key: str) -> str | None:
        """A value kept with :meth:`keep_setting`, or None."""
        with self.engine.connect() as conn:
            value = SETTING.scalar(conn, {"key": key})
        return None if value is None else str(value)

    def keep_setting(
        self,
        key: str,
        value: str,
        *,
        actor: str,
        action: str = "setting",
        detail: Mapping[str, object] | None = None,
    ) -> None:
        """Keep ``value`` under ``key``, audited as ``action`` with ``detail`` (an unchanged
        value writes nothing); the ledger's own settings (accountant, delta, audit head
        and key) cannot be changed this way."""
        kept = KeptSetting(key, value, actor, action, detail)
        check_setting(kept)
        with self._write() as conn:
            entry = self._keep(conn, kept)
            if entry is not None:
                self._audit(conn, *entry)

    def register_party(
        self,
        name: str,
        epsilon_cap: float,
        *,
        teachers: int | None = None,
        role: str = "answerer",
        fingerprint: str | None = None,
        actor: str = "admin",
        reason: str | None = None,
    ) -> None:
        """Add a party with the cap this ledger's operator gives it (epsilon at the ledger's
        delta), or change that cap (audited, with ``reason`` when given). The enforced cap
        is the smaller of this one and the cap the party declares itself (:meth:`declare_cap`).

        ``teachers`` pins the most teachers the party may vote with, 1 to
        MAX_TEACHERS_PER_PARTY (its vote weight: :meth:`admit_teachers`); setting or
        changing it is audited. None leaves the pinned count as it is (none for a new
        party, which the guardian then refuses at Register); a party's own ledger pins none.
        """
        if not name or len(name) > 128:
            raise LedgerRefusedError("party names are 1 to 128 characters")
        cap = positive_cap(epsilon_cap)
        pinned = None if teachers is None else teacher_count(teachers)
        with self._tx() as s:
            row = s.get(PartyRow, name, with_for_update=True)
            if row is not None:
                if row.role != role:
                    raise LedgerRefusedError(
                        f"{name} is registered as {row.role}, not {role}; a party keeps its role"
                    )
                if fingerprint and row.certificate_fingerprint != fingerprint:
                    row.certificate_fingerprint = fingerprint
                if row.registered_cap != cap:
                    old, old_registered = (
                        row.epsilon_cap,
                        registered_cap(row.epsilon_cap, row.registered_cap),
                    )
                    row.registered_cap = cap
                    row.epsilon_cap = enforced(cap, row.declared_cap)
                    detail: dict[str, object] = {
                        "party": name,
                        "registered": cap,
                        "old": old,
                        "new": row.epsilon_cap,
                        "raised": cap > old_registered,
                    }
                    if reason:
                        detail["reason"] = reason[:MAX_CAP_REASON]
                    self._audit(s, actor, "set_cap", detail)
                if pinned is not None and row.registered_teachers != pinned:
                    self._audit(
                        s,
                        actor,
                        "set_teachers",
                        {"party": name, "old": row.registered_teachers, "new": pinned},
                    )
                    row.registered_teachers = pinned
                return
            s.add(
                PartyRow(
                    name=name,
                    role=role,
                    epsilon_cap=cap,
                    registered_cap=cap,
                    registered_teachers=pinned,
                    certificate_fingerprint=fingerprint,
                    status="active",
                )
            )
            s.add(SpendRow(party=name, loss=self.accounting.zero().tolist(), rounds=0))
            self._audit(
                s,
                actor,
                "register_party",
                {"party": name, "epsilon_cap": cap, "teachers": pinned, "role": role},
            )

    def admit_teachers(
        self, name: str, declared: int, *, actor: str, audit: bool = True, unrecorded: int = 0
    ) -> int:
        """Check the teacher count party ``name`` declares on connecting against the count
        its operator pinned; returns ``declared``, the count its votes are proven against.

        A party may vote with fewer teachers than pinned, never more: the validity
        proofs prove a vote of ``declared`` teachers, so the pin is what bounds a party's
        weight. TeacherCountError (audited under ``actor``, the party's authenticated
        identity) when it declares more, or when no count is pinned. ``audit=False``: the
        refusal is not written (a party refused again within the caller's audit interval,
        which passes the number it left unrecorded with the next written one).
        """
        with self._tx() as s:
            row = s.get(PartyRow, name)
            if row is None:
                raise UnknownPartyError(f"no party named {name!r}; register it first")
            pinned = row.registered_teachers
            if pinned is not None and 1 <= declared <= pinned:
                return declared
            if audit:
                self._audit(
                    s,
                    actor,
                    "refuse_teachers",
                    {
                        "party": name,
                        "declared": declared,
                        "pinned": pinned,
                        "refused_unrecorded_before": unrecorded,
                    },
                )
        fix = f"the guardian's operator pins it with `capc guardian --register {name}=EPS:TEACHERS`"
        if pinned is None:
            raise TeacherCountError(
                f"{name} declared {declared} teachers but the guardian's operator has pinned "
                f"no teacher count for it, so it cannot vote; {fix}"
            )
        raise TeacherCountError(
            f"{name} declared {declared} teachers, more than the {pinned} the guardian's "
            f"operator pinned for it: run it with at most {pinned} teachers or, if the "
            f"consortium agreed on more, {fix}"
        )

    def declare_cap(
        self, name: str, epsilon_cap: float, *, actor: str, reason: str | None = None
    ) -> float:
        """The party ``name`` declares its own cap (at its connection); returns the cap
        enforced from now on: never above what the party declared. Audited when it changes,
        with the party's ``reason`` and whether it is a raise.

        ``actor`` is the party's authenticated identity.
        """
        cap = positive_cap(epsilon_cap)
        with self._tx() as s:
            row = s.get(PartyRow, name, with_for_update=True)
            if row is None:
                raise UnknownPartyError(f"no party named {name!r}; register it first")
            if row.declared_cap == cap:
                return row.epsilon_cap
            old, before = row.epsilon_cap, row.declared_cap
            row.declared_cap = cap
            row.epsilon_cap = enforced(registered_cap(row.epsilon_cap, row.registered_cap), cap)
            self._audit(
                s,
                actor,
                "declare_cap",
                {
                    "party": name,
                    "declared": cap,
                    "declared_before": before,
                    "old": old,
                    "new": row.epsilon_cap,
                    "raised": before is not None and cap > before,
                    **({"reason": reason[:MAX_CAP_REASON]} if reason else {}),
                },
            )
            return row.epsilon_cap

    def set_allowance(self, querier: str, epsilon_cap: float | None, *, actor: str) -> None:
        """Cap what ``querier``'s rounds may charge any one party (epsilon); None removes the cap. Audited."""
        if epsilon_cap is not None and not (math.isfinite(epsilon_cap) and epsilon_cap > 0):
            raise LedgerRefusedError(
                f"an allowance must be a positive number of epsilon, got {epsilon_cap}"
            )
        with self._tx() as s:
            row = s.get(AllowanceRow, querier, with_for_update=True)
            old = None if row is None else row.epsilon_cap
            if epsilon_cap is None:
                if row is not None:
                    s.delete(row)
            elif row is None:
                s.add(AllowanceRow(querier=querier, epsilon_cap=float(epsilon_cap)))
            else:
                row.epsilon_cap = float(epsilon_cap)
            self._audit(
                s, actor, "set_allowance", {"querier": querier, "old": old, "new": epsilon_cap}
            )

    def allowance_left(self, querier: str) -> tuple[float | None, dict[str, FloatArray]]:
        """``querier``'s allowance (epsilon each party may spend on its rounds; None: no
        allowance) and the loss vector its rounds hold of each party they charged."""
        with Session(self.engine) as s:
            row = s.get(AllowanceRow, querier)
            held = {
                r.party: np.asarray(r.loss, dtype=np.float64)
                for r in s.query(QuerierSpendRow).filter(QuerierSpendRow.querier == querier)
            }
        return (None if row is None else float(row.epsilon_cap)), held

    def querier_spent(self, querier: str, party: str) -> float:
        """Epsilon ``querier``'s rounds have charged or reserved on ``party``."""
        with Session(self.engine) as s:
            row = s.get(QuerierSpendRow, (querier, party))
            return 0.0 if row is None else self._eps(row.loss)[0]

    def touch(self, name: str) -> None:
        """Record that a party was seen now (every heartbeat of every party: one statement)."""
        with self._write() as conn:
            seen = TOUCH_PARTY.run(conn, {"b_name": name, "b_at": utcnow()})
        if not seen:
            raise UnknownPartyError(f"no party named {name!r}")

    def create_task(self, name: str, config: Mapping[str, object], *, actor: str = "admin") -> str:
        """Register a task's configuration; returns its hash. Re-registering must not change it."""
        digest = config_hash(dict(config))
        with self._tx() as s:
            row = s.get(TaskRow, name)
            if row is not None:
                if row.config_hash != digest:
                    raise LedgerRefusedError(
                        f"task {name!r} exists with another configuration; use a new task name"
                    )
                return digest
            s.add(TaskRow(name=name, config=dict(config), config_hash=digest))
            self._audit(s, actor, "create_task", {"task": name, "config_hash": digest})
        return digest

    def task(self, name: str) -> tuple[dict[str, object], str]:
        """(configuration, config hash) of a task."""
        with Session(self.engine) as s:
            row = s.get(TaskRow, name)
            if row is None:
                raise unknown_task(s, name)
            return dict(row.config), row.config_hash

    def store_report(self, name: str, report: Mapping[str, object]) -> None:
        """Keep a party's latest report of its own ledger (JSON: at least ``through``, the
        round id up to which it has settled everything, and ``settled``, its loss vector
        through that round; see :meth:`settled_loss`). Not a ledger change: not audited."""
        kept = {**dict(report), "received_at": iso_utc(utcnow())}
        # One statement (every party reports every few seconds while rounds run).
        with self._write() as conn:
            found = SET_PARTY_REPORT.run(conn, {"b_name": name, "b_report": kept})
        if not found:
            raise UnknownPartyError(f"no party named {name!r}")

    def note_parties(
        self,
        reports: Mapping[str, tuple[Mapping[str, object], dt.datetime]],
        seen: Mapping[str, dt.datetime],
    ) -> None:
        """Keep parties' latest reports (``reports``: each with the time it was received,
        as :meth:`store_report` keeps one) and when each of ``seen`` was last heard from
        (as :meth:`touch`), in one transaction: what a guardian's parties send every few
        seconds, kept with one durable commit for all of them. A name that is no party
        here is skipped."""
        if not reports and not seen:
            return
        with self._write() as conn:
            SET_PARTY_REPORT.run_many(
                conn,
                [
                    {"b_name": name, "b_report": {**dict(report), "received_at": iso_utc(at)}}
                    for name, (report, at) in reports.items()
                ],
            )
            TOUCH_PARTY.run_many(conn, [{"b_name": n, "b_at": at} for n, at in seen.items()])
