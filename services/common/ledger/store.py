"""The persistent privacy ledger: budgets checked before anything is spent.

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

Every change appends to a hash-chained audit log in the same transaction;
with a signing key (the guardian's), every head of the chain is signed
(:mod:`services.common.ledger.audit`).

The same store is an answering party's own ledger: one party (itself), its
own cap, rounds keyed by the guardian's round ids, each charged from the
round's mechanism by the same accountant (:mod:`services.answerer.budget`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from numpy.typing import ArrayLike, NDArray
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from capc.audit import bounds
from capc.mpc.validity import conversion_delta
from capc.privacy import accountants
from capc.privacy.accountants import Accounting, RenyiDp, UnsupportedEventError
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.privacy.events import DpEvent
from services.common.db import iso_utc, make_engine, normalise_url
from services.common.ledger import audit
from services.common.ledger import disputes as dispute_log
from services.common.ledger.audit import AuditHead, ChainProblem
from services.common.ledger.models import (
    AllowanceRow,
    AuditResultRow,
    AuditRow,
    ChargeKind,
    ChargeRow,
    PartyRow,
    QuerierSpendRow,
    RoundRow,
    RoundState,
    Setting,
    SpendRow,
    TaskRow,
    utcnow,
)
from services.common.limits import MAX_TEACHERS_PER_PARTY
from services.common.task import config_hash

FloatArray = NDArray[np.float64]
_MIGRATIONS = Path(__file__).with_name("migrations")
_GENESIS = audit.GENESIS
#: Settings only the ledger itself writes.
_OWN_SETTINGS = frozenset({"accountant", "delta", "audit_head", "audit_key"})
HEAD_REVISION = "0007"
#: Characters of a cap change's reason kept in the audit log.
MAX_CAP_REASON = 512
_MIGRATION_LOCK = threading.Lock()


class LedgerError(Exception):
    """A ledger operation was refused; the message says why and what to do."""


class UnknownPartyError(LedgerError):
    pass


class UnknownTaskError(LedgerError):
    """No task of that name is registered; the message lists the known ones."""


def _unknown_task(s: Session, name: str) -> UnknownTaskError:
    """The error for a task ``name`` the ledger lacks, naming the tasks it has."""
    known = list(s.scalars(select(TaskRow.name).order_by(TaskRow.name)))
    listed = f"known tasks: {', '.join(known)}" if known else "no task is registered"
    return UnknownTaskError(f"no task named {name!r}; {listed}")


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


@dataclass(frozen=True)
class KeptSetting:
    """A value for :meth:`Ledger.keep_setting`, kept in the same transaction as a round's
    settlement when passed to :meth:`Ledger.commit` or :meth:`Ledger.abort`."""

    key: str
    value: str
    actor: str
    action: str = "setting"
    detail: Mapping[str, object] | None = None


@dataclass(frozen=True)
class Reservation:
    round_id: int
    included: tuple[str, ...]
    #: excluded party -> epsilon it has left (at the ledger's delta)
    excluded: Mapping[str, float]


@dataclass(frozen=True)
class LedgerEntry:
    """One reservation or charge; ``epsilon_alone`` is that entry's epsilon on its own."""

    round_id: int
    party: str
    kind: str
    mechanism: str
    round_state: str
    task: str
    queries: int
    epsilon_alone: float
    at: str


@dataclass(frozen=True)
class AuditEntry:
    """One audit entry: ``actor`` is an authenticated identity, ``note`` untrusted free text."""

    seq: int
    at: str
    actor: str
    action: str
    detail: dict[str, object]
    hash: str
    note: str | None = None
    signature: str | None = None


@dataclass(frozen=True)
class PartyBudget:
    """A party's position, epsilon at the ledger's delta by the ledger's accountant
    (``best_order``: the Renyi order for the ``rdp`` accountant, None otherwise)."""

    name: str
    role: str
    status: str
    cap: float
    spent: float
    remaining: float
    best_order: float | None
    rounds: int
    last_seen: dt.datetime | None
    #: The cap this ledger's operator registered, and the one the party declared itself.
    registered_cap: float = math.inf
    declared_cap: float | None = None
    #: The party's latest report of its own ledger (see :meth:`Ledger.store_report`).
    report: Mapping[str, object] | None = None
    #: The most teachers the operator lets the party vote with; None: none pinned.
    registered_teachers: int | None = None
    #: Rounds the party was asked to vote in, aborted ones included (R in the
    #: guarantee (eps, delta + R 2^-40): :meth:`full_delta`).
    rounds_asked: int = 0

    def full_delta(self, delta: float) -> float:
        """The delta this party's guarantee holds at for the ledger's ``delta``: delta plus
        the validity proofs' ring-conversion failure, at most 2^-40 per round it was
        asked to vote in (docs/privacy.md, offset robustness)."""
        return delta + conversion_delta(self.rounds_asked)


@dataclass(frozen=True)
class RoundRecord:
    """A round as a settlement needs it: its state, what it released (``outcome``,
    guardian side) or asked of the party (``terms``, party side), and per party the
    kind of row held and its event (None: charged nothing)."""

    round_id: int
    state: RoundState
    terms: Mapping[str, object] | None
    outcome: Mapping[str, object] | None
    charges: Mapping[str, tuple[ChargeKind, dict[str, object] | None]]


@dataclass(frozen=True)
class PrivacyAudit:
    """An empirical privacy audit of ``party``: a canary attack's ``correct`` right guesses
    out of ``guesses`` on ``canaries`` canaries, the empirical epsilon the ledger computed
    from them (nats, at its ``delta``, two-sided ``confidence`` Clopper-Pearson interval;
    ``empirical_upper`` None when unbounded), and ``claimed_epsilon``, the party's epsilon
    by the ledger when the result was recorded. ``refuted``: the lower end of the 99.9%
    interval exceeds it (:data:`capc.audit.bounds.REFUTE_CONFIDENCE`)."""

    id: int
    party: str
    at: str
    actor: str
    attack: str
    canaries: int
    guesses: int
    correct: int
    confidence: float
    delta: float
    accountant: str
    claimed_epsilon: float
    empirical_lower: float
    empirical_point: float | None
    empirical_upper: float | None
    refuted: bool


#: Most canaries one audit may report (a bound on what the ledger is asked to store).
MAX_CANARIES = 1_000_000


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _lock_spends(s: Session, names: Sequence[str]) -> dict[str, SpendRow]:
    """Spend rows of ``names``, locked for this transaction in a fixed order (no deadlocks)."""
    rows = s.scalars(
        select(SpendRow).where(SpendRow.party.in_(names)).order_by(SpendRow.party).with_for_update()
    )
    return {r.party: r for r in rows}


def _lock_querier_spends(
    s: Session, querier: str, names: Sequence[str]
) -> dict[str, QuerierSpendRow]:
    """A querier's per-party spend rows, locked in a fixed order."""
    rows = s.scalars(
        select(QuerierSpendRow)
        .where(QuerierSpendRow.querier == querier, QuerierSpendRow.party.in_(names))
        .order_by(QuerierSpendRow.party)
        .with_for_update()
    )
    return {r.party: r for r in rows}


def _check_setting(kept: KeptSetting | None) -> None:
    if kept is not None and (kept.key in _OWN_SETTINGS or not 0 < len(kept.key) <= 64):
        raise LedgerError(f"{kept.key!r} is not a setting that can be kept")


def _positive_cap(epsilon_cap: float) -> float:
    if not (
        isinstance(epsilon_cap, int | float) and math.isfinite(epsilon_cap) and epsilon_cap > 0
    ):
        raise LedgerError(f"epsilon cap must be a positive number, got {epsilon_cap}")
    return float(epsilon_cap)


def _teacher_count(teachers: int) -> int:
    if isinstance(teachers, bool) or not isinstance(teachers, int):
        raise LedgerError(f"a teacher count is a whole number, got {teachers!r}")
    if not 1 <= teachers <= MAX_TEACHERS_PER_PARTY:
        raise LedgerError(
            f"a party votes with 1 to {MAX_TEACHERS_PER_PARTY} teachers, got {teachers}"
        )
    return teachers


def _enforced(registered: float, declared: float | None) -> float:
    """The cap a ledger enforces: never above what the party itself declared."""
    return registered if declared is None else min(registered, declared)


def _registered(row: PartyRow) -> float:
    # Every row has one since revision 0004 filled them; the column stays nullable.
    return row.epsilon_cap if row.registered_cap is None else row.registered_cap


def _round_up(x: FloatArray, *terms: FloatArray) -> FloatArray:
    """``x``, computed from ``terms`` by adds and subtracts, moved up by two ulps of the largest
    term, so float error never shrinks a total (it is of the order of an ulp of the largest
    operand, not of the result); exact zeros stay zero."""
    scale = np.max(np.abs(np.stack([x, *terms])), axis=0)
    return np.where(x > 0, x + 2.0 * np.spacing(scale), 0.0)


class Ledger:
    """The guardian's ledger at ``url`` (SQLite path/URL or PostgreSQL URL).

    ``accountant`` (a name of :data:`capc.privacy.accountants.ACCOUNTANTS`;
    default the tightest sound one, exact Gaussian DP), ``orders`` (Renyi
    orders, ``rdp`` only) and ``delta`` are fixed when the ledger is created;
    opening it later with other values is refused, because stored loss
    vectors only mean something to the accountant that wrote them
    (``delta=None`` takes the stored one). ``signer``: the Ed25519 key that
    signs every audit head (the guardian's), never stored in the database.
    """

    def __init__(
        self,
        url: str,
        *,
        accountant: str | None = None,
        orders: ArrayLike | None = None,
        delta: float | None = 1e-5,
        migrate: bool = True,
        signer: Ed25519PrivateKey | None = None,
    ) -> None:
        self.url = normalise_url(url)
        self.engine = make_engine(self.url)
        if migrate:
            self.migrate()
        self._check_revision()
        self._signer: Ed25519PrivateKey | None = None
        self.accounting, self.delta = self._settings(accountant, orders, delta)
        if signer is not None:
            self._adopt_key(signer)

    # -- schema ---------------------------------------------------------------
    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision."""
        with _MIGRATION_LOCK:  # Alembic's op/context proxies are process-global
            self._migrate()

    def _migrate(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        with self.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()

    def _check_revision(self) -> None:
        with self.engine.connect() as conn:
            rev = MigrationContext.configure(conn).get_current_revision()
        if rev != HEAD_REVISION:
            raise LedgerError(
                f"ledger schema is at revision {rev}, this guardian needs {HEAD_REVISION}; run `capc guardian --migrate`"
            )

    def _settings(
        self, kind: str | None, orders: ArrayLike | None, given: float | None
    ) -> tuple[Accounting, float]:
        # None: whatever delta the ledger was created with (readers such as `capc audit`).
        delta = 1e-5 if given is None else given
        if not (0 < delta < 1):
            raise LedgerError(f"delta must lie in (0, 1), got {delta}")
        if kind is not None and kind not in accountants.ACCOUNTANTS:
            raise LedgerError(
                f"unknown accountant {kind!r}; choose one of {', '.join(accountants.ACCOUNTANTS)}"
            )
        with self._tx() as s:
            stored = {row.key: row.value for row in s.scalars(select(Setting))}
            if "accountant" not in stored:
                name = kind or (
                    RenyiDp.name if orders is not None else accountants.DEFAULT_ACCOUNTANT
                )
                if name == RenyiDp.name:
                    fresh: Accounting = RenyiDp(DEFAULT_ORDERS if orders is None else orders)
                elif orders is not None:
                    raise LedgerError(f"the {name} accountant takes no Renyi orders")
                else:
                    fresh = accountants.make(name)
                saved = {"name": fresh.name, **fresh.settings()}
                s.add(Setting(key="accountant", value=json.dumps(saved)))
                s.add(Setting(key="delta", value=repr(float(delta))))
                s.add(Setting(key="audit_head", value=json.dumps([0, _GENESIS])))
                return fresh, float(delta)
        saved = json.loads(stored["accountant"])
        have = accountants.make(str(saved.pop("name")), saved)
        have_delta = float(stored["delta"])
        if kind is not None and kind != have.name:
            raise LedgerError(
                f"this ledger was created with the {have.name} accountant, not {kind}; "
                "open it without choosing one"
            )
        if orders is not None and not (
            isinstance(have, RenyiDp) and np.array_equal(have.orders, np.asarray(orders))
        ):
            raise LedgerError(
                "this ledger was created with another order grid; open it without `orders`"
            )
        if given is not None and have_delta != delta:
            raise LedgerError(f"this ledger accounts at delta={have_delta}, not {delta}")
        return have, have_delta

    @property
    def accountant(self) -> str:
        """The name of the ledger's accountant."""
        return self.accounting.name

    def accounting_json(self) -> str:
        """What two ledgers must share for their loss vectors to be compared, as canonical
        JSON: the accountant with its settings, and delta."""
        ident = {
            "accountant": {"name": self.accounting.name, **self.accounting.settings()},
            "delta": self.delta,
        }
        return json.dumps(ident, sort_keys=True, separators=(",", ":"))

    def _adopt_key(self, signer: Ed25519PrivateKey) -> None:
        """Record which key signs this ledger's audit heads, from which entry on; refuse
        another key later (its signatures would not verify the earlier heads)."""
        mine = audit.public_hex(signer)
        with self._tx() as s:
            row = s.get(Setting, "audit_key", with_for_update=True)
            if row is None:
                head = s.scalars(select(Setting).where(Setting.key == "audit_head")).one()
                seq = int(json.loads(head.value)[0])
                s.add(Setting(key="audit_key", value=json.dumps({"key": mine, "from": seq})))
                self._signer = signer
                self._audit(s, "ledger", "audit_key", {"public_key": mine, "signed_after": seq})
                return
        have = str(json.loads(row.value)["key"])
        if have != mine:
            raise LedgerError(
                f"this ledger's audit log is signed by key {have[:16]}..., the key given is "
                f"{mine[:16]}...; start with the key file that signed it (a new key would leave "
                "every stored head unverifiable)"
            )
        self._signer = signer

    def setting(self, key: str) -> str | None:
        """A value kept with :meth:`keep_setting`, or None."""
        with Session(self.engine) as s:
            row = s.get(Setting, key)
            return None if row is None else row.value

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
        _check_setting(kept)
        with self._tx() as s:
            self._keep(s, kept)

    def _keep(self, s: Session, kept: KeptSetting) -> None:
        row = s.get(Setting, kept.key, with_for_update=True)
        if row is None:
            s.add(Setting(key=kept.key, value=kept.value))
        elif row.value == kept.value:
            return
        else:
            row.value = kept.value
        self._audit(s, kept.actor, kept.action, {"key": kept.key, **(kept.detail or {})})

    def audit_key(self) -> tuple[str, int] | None:
        """(public key hex, last entry written before it signed), or None: no key yet."""
        with Session(self.engine) as s:
            row = s.get(Setting, "audit_key")
            if row is None:
                return None
            saved = json.loads(row.value)
        return str(saved["key"]), int(saved["from"])

    def audit_head(self) -> AuditHead:
        """The audit chain's current head, signed (the signature is empty without a key)."""
        with Session(self.engine) as s:
            value = json.loads(
                s.scalars(select(Setting).where(Setting.key == "audit_head")).one().value
            )
        return AuditHead(int(value[0]), str(value[1]), str(value[2]) if len(value) > 2 else "")

    def _loss(self, event: DpEvent, what: str) -> FloatArray:
        """An event's loss vector as a budget charge; LedgerError if the filter cannot take it."""
        try:
            loss = self.accounting.filter_cost(event)
        except (UnsupportedEventError, ValueError, ArithmeticError) as err:
            raise LedgerError(f"{what}: {err}") from err
        if not np.isfinite(loss).all():
            raise LedgerError(f"{what}: its privacy loss is not finite (noise too small?)")
        return loss

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    # -- audit ----------------------------------------------------------------
    def _audit(
        self,
        s: Session,
        actor: str,
        action: str,
        detail: Mapping[str, object],
        note: str | None = None,
    ) -> None:
        head = s.scalars(select(Setting).where(Setting.key == "audit_head").with_for_update()).one()
        seq, prev = json.loads(head.value)[:2]
        seq += 1
        at = utcnow()
        digest = audit.digest(prev, seq, at, actor, action, dict(detail), note)
        signature = None if self._signer is None else audit.sign_head(self._signer, seq, digest)
        s.add(
            AuditRow(
                seq=seq,
                at=at,
                actor=actor,
                action=action,
                detail=dict(detail),
                prev_hash=prev,
                hash=digest,
                note=note,
                signature=signature,
            )
        )
        head.value = json.dumps([seq, digest, signature or ""])

    def record(
        self, actor: str, action: str, detail: Mapping[str, object], note: str | None = None
    ) -> None:
        """Append an event a service observed (not a ledger change) to the audit log.

        ``actor`` must be an authenticated identity; anything a caller wrote
        itself goes in ``note`` (kept, never trusted; at most 1000 characters).
        """
        if not actor or len(actor) > 128 or not action or len(action) > 64:
            raise LedgerError(
                f"an audit entry needs an actor of 1-128 and an action of 1-64 characters, "
                f"got {actor!r} and {action!r}"
            )
        with self._tx() as s:
            self._audit(s, actor, action, detail, None if note is None else note[:1000])

    def check_audit(self, public_key: str | None = None) -> tuple[int, ChainProblem | None]:
        """Walk the whole chain: (entries, first problem or None). Signatures are checked
        against ``public_key`` (hex), by default the key this ledger records."""
        key = self.audit_key()
        if public_key is None and key is not None:
            public_key = key[0]
        signed_from = key[1] if key is not None else 0
        with Session(self.engine) as s:
            rows = s.scalars(select(AuditRow).order_by(AuditRow.seq))
            return audit.check_chain(rows, public_key, signed_from)

    def verify_audit(self) -> int:
        """Check the whole chain (and every head's signature where the ledger has a key);
        returns its length, raises LedgerError naming the first bad entry."""
        n, problem = self.check_audit()
        if problem is not None:
            raise LedgerError(f"audit log broken at entry {problem.seq}: {problem.reason}")
        return n

    def audit_entries(self, limit: int = 100, offset: int = 0) -> list[AuditEntry]:
        """Newest first."""
        with Session(self.engine) as s:
            rows = s.scalars(
                select(AuditRow).order_by(AuditRow.seq.desc()).limit(limit).offset(offset)
            )
            return [
                AuditEntry(
                    r.seq,
                    r.at.isoformat(),
                    r.actor,
                    r.action,
                    dict(r.detail),
                    r.hash,
                    r.note,
                    r.signature,
                )
                for r in rows
            ]

    def disputes(self) -> list[dispute_log.Dispute]:
        """Failed checks per (querier, party) pair over the whole audit log, with where
        each pair's pattern points (:mod:`services.common.ledger.disputes`)."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(AuditRow.action, AuditRow.actor, AuditRow.detail).where(
                    AuditRow.action.in_((dispute_log.DISPUTE, dispute_log.LEGACY_INVALID_VOTE))
                )
            )
            pairs = [dispute_log.dispute_pair(a, who, dict(d)) for a, who, d in rows]
        return dispute_log.attribute(p for p in pairs if p is not None)

    def audit_rows(self, after: int = 0, limit: int = 1000) -> list[AuditRow]:
        """Raw entries with seq > ``after``, oldest first (for verification)."""
        with Session(self.engine, expire_on_commit=False) as s:
            return list(
                s.scalars(
                    select(AuditRow).where(AuditRow.seq > after).order_by(AuditRow.seq).limit(limit)
                )
            )

    # -- registry -------------------------------------------------------------
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
            raise LedgerError("party names are 1 to 128 characters")
        cap = _positive_cap(epsilon_cap)
        pinned = None if teachers is None else _teacher_count(teachers)
        with self._tx() as s:
            row = s.get(PartyRow, name, with_for_update=True)
            if row is not None:
                if row.role != role:
                    raise LedgerError(
                        f"{name} is registered as {row.role}, not {role}; a party keeps its role"
                    )
                if fingerprint and row.certificate_fingerprint != fingerprint:
                    row.certificate_fingerprint = fingerprint
                if row.registered_cap != cap:
                    old, old_registered = row.epsilon_cap, _registered(row)
                    row.registered_cap = cap
                    row.epsilon_cap = _enforced(cap, row.declared_cap)
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
        cap = _positive_cap(epsilon_cap)
        with self._tx() as s:
            row = s.get(PartyRow, name, with_for_update=True)
            if row is None:
                raise UnknownPartyError(f"no party named {name!r}; register it first")
            if row.declared_cap == cap:
                return row.epsilon_cap
            old, before = row.epsilon_cap, row.declared_cap
            row.declared_cap = cap
            row.epsilon_cap = _enforced(_registered(row), cap)
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
            raise LedgerError(
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

    def querier_spent(self, querier: str, party: str) -> float:
        """Epsilon ``querier``'s rounds have charged or reserved on ``party``."""
        with Session(self.engine) as s:
            row = s.get(QuerierSpendRow, (querier, party))
            return 0.0 if row is None else self._eps(row.loss)[0]

    def touch(self, name: str) -> None:
        """Record that a party was seen now."""
        with self._tx() as s:
            row = s.get(PartyRow, name)
            if row is None:
                raise UnknownPartyError(f"no party named {name!r}")
            row.last_seen = utcnow()

    def create_task(self, name: str, config: Mapping[str, object], *, actor: str = "admin") -> str:
        """Register a task's configuration; returns its hash. Re-registering must not change it."""
        digest = config_hash(dict(config))
        with self._tx() as s:
            row = s.get(TaskRow, name)
            if row is not None:
                if row.config_hash != digest:
                    raise LedgerError(
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
                raise _unknown_task(s, name)
            return dict(row.config), row.config_hash

    # -- budgets --------------------------------------------------------------
    def _eps(self, loss: Sequence[float] | FloatArray) -> tuple[float, float | None]:
        """(epsilon at the ledger's delta, best Renyi order or None) of a loss vector."""
        spent = self.accounting.spent(np.asarray(loss, dtype=np.float64), self.delta)
        return spent.epsilon, spent.order

    def _fits(self, loss: FloatArray, cap: float) -> bool:
        return self.accounting.fits(loss, cap, self.delta)

    def queries_fit(self, per_query: DpEvent, epsilon: float, party: str | None = None) -> int:
        """How many more queries costing ``per_query`` each fit ``epsilon`` at the ledger's delta,
        after what ``party`` (if given) has spent and reserved; what this ledger admits."""
        self._loss(per_query, "per-query cost")
        spent = None if party is None else self.spent_loss(party)
        return self.accounting.max_count(per_query, epsilon, self.delta, spent)

    def budgets(self) -> list[PartyBudget]:
        """Every party's cap, spend and remaining epsilon (reservations count as spent)."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(PartyRow, SpendRow)
                .join(SpendRow, SpendRow.party == PartyRow.name)
                .order_by(PartyRow.name)
            )
            out = []
            for party, spend in rows:
                eps, order = self._eps(spend.loss)
                out.append(
                    PartyBudget(
                        party.name,
                        party.role,
                        party.status,
                        party.epsilon_cap,
                        eps,
                        max(0.0, party.epsilon_cap - eps),
                        order,
                        spend.rounds,
                        party.last_seen,
                        _registered(party),
                        party.declared_cap,
                        party.report,
                        party.registered_teachers,
                        spend.rounds_asked,
                    )
                )
            return out

    def store_report(self, name: str, report: Mapping[str, object]) -> None:
        """Keep a party's latest report of its own ledger (JSON: at least ``through``, the
        round id up to which it has settled everything, and ``settled``, its loss vector
        through that round; see :meth:`settled_loss`). Not a ledger change: not audited."""
        with self._tx() as s:
            row = s.get(PartyRow, name, with_for_update=True)
            if row is None:
                raise UnknownPartyError(f"no party named {name!r}")
            row.report = {**dict(report), "received_at": iso_utc(utcnow())}

    def settled_loss(self, name: str, through: int) -> FloatArray:
        """What the ledger counts for ``name`` from every round up to ``through`` that is
        settled: its running total less every open reservation and every charge of a later
        round. Two ledgers that saw the same rounds agree on it to float rounding, and a
        running total altered in the database shows up here."""
        with Session(self.engine) as s:
            spend = s.get(SpendRow, name)
            if spend is None:
                raise UnknownPartyError(f"no party named {name!r}")
            total = np.asarray(spend.loss, dtype=np.float64)
            rows = s.scalars(
                select(ChargeRow.loss).where(
                    ChargeRow.party == name,
                    (ChargeRow.kind == ChargeKind.RESERVATION) | (ChargeRow.round_id > through),
                )
            )
            for loss in rows:
                total = total - np.asarray(loss, dtype=np.float64)
        return np.maximum(total, 0.0)

    def _refusal(
        self,
        included: int,
        names: Sequence[str],
        quorum: int,
        queries: int,
        excluded: Mapping[str, float],
        costs: Mapping[str, FloatArray],
        room: Mapping[str, tuple[float, FloatArray]],
    ) -> str:
        """Why a round of ``queries`` queries is refused: per excluded party, the epsilon
        it has left, what this round alone costs it (epsilon at the ledger's delta) and how
        many more queries its cap covers (``room``: its cap and loss so far); and where to
        see more."""
        fits: dict[str, int] = {}
        parts = []
        for p, left in excluded.items():
            alone = self._eps(costs[p])[0]
            cap, spent = room.get(p, (0.0, self.accounting.zero()))
            # Loss vectors add up over queries (Gaussian DP's mu**2, Renyi curves), so a
            # round's worst case over its size is one query's.
            unit = costs[p] / queries
            fits[p] = (
                self.accounting.max_count_of(unit, cap, self.delta, spent)
                if left > 0 and unit.any()
                else 0
            )
            parts.append(
                f"{p}: {left:.4g} eps left, this round of {queries} queries costs it "
                f"{alone:.4g} eps, {fits[p]} more queries fit"
            )
        best = max(fits, key=lambda p: fits[p]) if fits else None
        if best is None or fits[best] == 0:
            hint = ". No excluded party's cap covers another query"
        else:
            hint = (
                f"; at most {fits[best]} more queries fit ({best}): ask for at most that "
                "many per round (--batch-size)"
            )
        return (
            f"only {included} of {len(names)} parties can afford this round, quorum is "
            f"{quorum}; excluded: {'; '.join(parts)}{hint}. `capcctl budget` shows every "
            "party's epsilon and queries left"
        )

    def budget(self, name: str) -> PartyBudget:
        for b in self.budgets():
            if b.name == name:
                return b
        raise UnknownPartyError(f"no party named {name!r}")

    def spent_loss(self, name: str) -> FloatArray:
        """A party's loss vector (charges and open reservations) in the ledger's accountant."""
        with Session(self.engine) as s:
            row = s.get(SpendRow, name)
            if row is None:
                raise UnknownPartyError(f"no party named {name!r}")
            return np.asarray(row.loss, dtype=np.float64)

    # -- rounds ---------------------------------------------------------------
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
        if queries < 1:
            raise LedgerError(f"a round has at least one query, got {queries}")
        if quorum < 1:
            raise LedgerError(f"quorum must be >= 1, got {quorum}")
        costs = {p: self._loss(e, f"worst case of {p}") for p, e in worst_case.items()}
        stored_events = {p: e.to_dict() for p, e in worst_case.items()}
        names = sorted(costs)
        try:
            with self._tx() as s:
                if s.scalar(
                    select(RoundRow.id).where(RoundRow.round_key == round_key)
                ) is not None or (round_id is not None and s.get(RoundRow, round_id) is not None):
                    raise DuplicateRoundError(
                        f"round {round_key!r} was opened before; a round key is used once"
                    )
                if s.get(TaskRow, task) is None:
                    raise _unknown_task(s, task)
                spends = _lock_spends(s, names)
                parties = {
                    r.name: r for r in s.scalars(select(PartyRow).where(PartyRow.name.in_(names)))
                }
                unknown = [p for p in names if p not in parties]
                if unknown:
                    raise UnknownPartyError(f"unknown parties {unknown}; register them first")
                allowance = s.get(AllowanceRow, querier)
                shares = _lock_querier_spends(s, querier, names)
                included: list[str] = []
                excluded: dict[str, float] = {}
                # Each excluded party's (cap, loss so far): what the refusal reports.
                room: dict[str, tuple[float, FloatArray]] = {}
                for p in names:
                    current = np.asarray(spends[p].loss, dtype=np.float64)
                    cap = parties[p].epsilon_cap
                    if parties[p].status != "active":
                        excluded[p] = 0.0
                        continue
                    left = cap - self._eps(current)[0]
                    fits = self._fits(current + costs[p], cap)
                    if allowance is not None:
                        mine = np.asarray(shares[p].loss if p in shares else self.accounting.zero())
                        left = min(left, allowance.epsilon_cap - self._eps(mine)[0])
                        fits = fits and self._fits(mine + costs[p], allowance.epsilon_cap)
                    if fits:
                        included.append(p)
                    else:
                        excluded[p] = max(0.0, left)
                        room[p] = (cap, current)
                if len(included) < quorum:
                    raise QuorumError(
                        self._refusal(len(included), names, quorum, queries, excluded, costs, room),
                        excluded,
                    )
                rnd = RoundRow(
                    round_key=round_key,
                    task=task,
                    querier=querier,
                    queries=queries,
                    state=RoundState.RESERVED,
                    terms=None if terms is None else dict(terms),
                )
                if round_id is not None:
                    rnd.id = round_id
                s.add(rnd)
                s.flush()
                for p in included:
                    s.add(
                        ChargeRow(
                            round_id=rnd.id,
                            party=p,
                            kind=ChargeKind.RESERVATION,
                            mechanism=mechanism,
                            loss=costs[p].tolist(),
                            event=stored_events[p],
                        )
                    )
                    spends[p].loss = (np.asarray(spends[p].loss) + costs[p]).tolist()
                    spends[p].rounds += 1
                    spends[p].rounds_asked += 1
                    # Kept whether or not an allowance exists, so one set later counts what
                    # the querier spent before, and commits and aborts subtract what was added.
                    if p not in shares:
                        shares[p] = QuerierSpendRow(
                            querier=querier, party=p, loss=self.accounting.zero().tolist()
                        )
                        s.add(shares[p])
                    shares[p].loss = (np.asarray(shares[p].loss) + costs[p]).tolist()
                self._audit(
                    s,
                    querier,
                    "reserve",
                    {
                        "round": rnd.id,
                        "key": round_key,
                        "task": task,
                        "queries": queries,
                        "included": included,
                        "excluded": sorted(excluded),
                    },
                )
                if disclosure is not None:
                    self._audit(s, querier, "clear_records", {"round": rnd.id, **disclosure})
                return Reservation(rnd.id, tuple(included), excluded)
        except IntegrityError as err:
            raise DuplicateRoundError(
                f"round {round_key!r} was opened before; a round key is used once"
            ) from err

    def _round(self, s: Session, round_id: int) -> RoundRow:
        rnd = s.get(RoundRow, round_id, with_for_update=True)
        if rnd is None:
            raise RoundStateError(f"no round {round_id}")
        return rnd

    def release(self, round_id: int, *, actor: str = "guardian") -> None:
        """Mark a reserved round released, durably: call before any noisy output leaves."""
        with self._tx() as s:
            rnd = self._round(s, round_id)
            if rnd.state != RoundState.RESERVED:
                raise RoundStateError(
                    f"round {round_id} is {rnd.state.value}; only a reserved round can be released"
                )
            rnd.state = RoundState.RELEASED
            rnd.updated_at = utcnow()
            self._audit(s, actor, "release", {"round": round_id})

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
        with Session(self.engine) as s:
            held = list(s.scalars(select(ChargeRow).where(ChargeRow.round_id == round_id)))
            res = {c.party: np.asarray(c.loss, dtype=np.float64) for c in held}
            events = {c.party: c.event for c in held}
        self._commit(round_id, res, events, actor, release=release, keep=keep)

    def _commit(
        self,
        round_id: int,
        costs: Mapping[str, FloatArray],
        charged: Mapping[str, dict[str, object] | None],
        actor: str,
        outcome: Mapping[str, object] | None = None,
        *,
        release: bool = False,
        keep: KeptSetting | None = None,
    ) -> None:
        _check_setting(keep)
        with self._tx() as s:
            rnd = self._round(s, round_id)
            if release and rnd.state == RoundState.RESERVED:
                rnd.state = RoundState.RELEASED
                self._audit(s, actor, "release", {"round": round_id})
            if rnd.state != RoundState.RELEASED:
                raise RoundStateError(
                    f"round {round_id} is {rnd.state.value}; only a released round can be committed"
                )
            if keep is not None:
                self._keep(s, keep)
            reservations = {
                c.party: c
                for c in s.scalars(select(ChargeRow).where(ChargeRow.round_id == round_id))
            }
            extra = sorted(set(costs) - set(reservations))
            if extra:
                raise LedgerError(
                    f"round {round_id} reserved nothing for {extra}; they cannot be charged in it"
                )
            names = sorted(reservations)
            spends = _lock_spends(s, names)
            shares = _lock_querier_spends(s, rnd.querier, names)
            over = []
            for p in names:
                reserved = np.asarray(reservations[p].loss, dtype=np.float64)
                charge = costs.get(p, self.accounting.zero())
                if (charge > reserved * (1 + 1e-12)).any():
                    over.append(p)
                total = np.asarray(spends[p].loss)
                spends[p].loss = _round_up(total - reserved + charge, total, reserved).tolist()
                if p in shares:
                    mine = np.asarray(shares[p].loss)
                    shares[p].loss = _round_up(mine - reserved + charge, mine, reserved).tolist()
                if p not in costs:
                    spends[p].rounds -= 1
                reservations[p].kind = ChargeKind.CHARGE
                reservations[p].loss = charge.tolist()
                reservations[p].event = charged.get(p)
            rnd.state = RoundState.COMMITTED
            rnd.updated_at = utcnow()
            if outcome is not None:
                rnd.outcome = dict(outcome)
            self._audit(
                s,
                actor,
                "commit",
                {"round": round_id, "charged": sorted(costs), "above_reservation": over},
            )

    def abort(
        self,
        round_id: int,
        *,
        actor: str = "guardian",
        reason: str = "",
        keep: KeptSetting | None = None,
    ) -> None:
        """Cancel a reserved (never released) round and return its reservations; ``keep``:
        a setting kept in the same transaction."""
        _check_setting(keep)
        with self._tx() as s:
            rnd = self._round(s, round_id)
            if rnd.state != RoundState.RESERVED:
                raise RoundStateError(
                    f"round {round_id} is {rnd.state.value}; only a round that was never released can be aborted"
                )
            if keep is not None:
                self._keep(s, keep)
            reservations = list(s.scalars(select(ChargeRow).where(ChargeRow.round_id == round_id)))
            names = sorted(c.party for c in reservations)
            spends = _lock_spends(s, names)
            shares = _lock_querier_spends(s, rnd.querier, names)
            for c in reservations:
                total, held = np.asarray(spends[c.party].loss), np.asarray(c.loss)
                spends[c.party].loss = _round_up(total - held, total, held).tolist()
                spends[c.party].rounds -= 1
                if c.party in shares:
                    mine = np.asarray(shares[c.party].loss)
                    shares[c.party].loss = _round_up(mine - held, mine, held).tolist()
            s.execute(delete(ChargeRow).where(ChargeRow.round_id == round_id))
            rnd.state = RoundState.ABORTED
            rnd.updated_at = utcnow()
            self._audit(s, actor, "abort", {"round": round_id, "reason": reason})

    def recover(self) -> tuple[int, int]:
        """After a restart: abort never-released rounds, commit released ones at their reservation.

        Returns (aborted, committed).
        """
        with Session(self.engine) as s:
            pending = list(
                s.execute(
                    select(RoundRow.id, RoundRow.state).where(
                        RoundRow.state.in_([RoundState.RESERVED, RoundState.RELEASED])
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

    def round_record(self, round_id: int) -> RoundRecord | None:
        """A round with its terms, outcome and per-party rows; None if there is none."""
        with Session(self.engine) as s:
            rnd = s.get(RoundRow, round_id)
            if rnd is None:
                return None
            rows = s.scalars(select(ChargeRow).where(ChargeRow.round_id == round_id))
            return RoundRecord(
                rnd.id,
                rnd.state,
                rnd.terms,
                rnd.outcome,
                {c.party: (c.kind, c.event) for c in rows},
            )

    def open_rounds(self) -> list[int]:
        """Ids of rounds reserved or released but not yet committed or aborted, oldest first."""
        with Session(self.engine) as s:
            return list(
                s.scalars(
                    select(RoundRow.id)
                    .where(RoundRow.state.in_([RoundState.RESERVED, RoundState.RELEASED]))
                    .order_by(RoundRow.id)
                )
            )

    def last_round(self) -> int:
        """The highest round id, 0 when there is none."""
        with Session(self.engine) as s:
            return int(s.scalar(select(func.max(RoundRow.id))) or 0)

    def round_state(self, round_id: int) -> RoundState:
        with Session(self.engine) as s:
            rnd = s.get(RoundRow, round_id)
            if rnd is None:
                raise RoundStateError(f"no round {round_id}")
            return rnd.state

    def entries(
        self,
        *,
        party: str | None = None,
        round_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[LedgerEntry]:
        """Charges and reservations, newest first, with epsilon of each entry alone."""
        q = select(ChargeRow, RoundRow).join(RoundRow, RoundRow.id == ChargeRow.round_id)
        if party is not None:
            q = q.where(ChargeRow.party == party)
        if round_id is not None:
            q = q.where(ChargeRow.round_id == round_id)
        q = q.order_by(ChargeRow.id.desc()).limit(limit).offset(offset)
        with Session(self.engine) as s:
            return [
                LedgerEntry(
                    round_id=c.round_id,
                    party=c.party,
                    kind=c.kind.value,
                    mechanism=c.mechanism,
                    round_state=r.state.value,
                    task=r.task,
                    queries=r.queries,
                    epsilon_alone=self._eps(c.loss)[0],
                    at=iso_utc(c.created_at),
                )
                for c, r in s.execute(q)
            ]

    def history(
        self, party: str | None = None, max_points: int = 500
    ) -> dict[str, list[tuple[str, float, int]]]:
        """Per party: (time, epsilon at the ledger's delta, round id) after each entry that
        still counts, oldest first. Reservations count until their round commits or aborts,
        as they do in :meth:`budgets`, so the curve never lies below the true spend.

        At most ``max_points`` per party: earlier points are thinned evenly, the newest kept.
        """
        q = select(ChargeRow.party, ChargeRow.loss, ChargeRow.created_at, ChargeRow.round_id)
        if party is not None:
            q = q.where(ChargeRow.party == party)
        with Session(self.engine) as s:
            rows = list(s.execute(q.order_by(ChargeRow.id)))
        by_party: dict[str, list[tuple[list[float], dt.datetime, int]]] = {}
        for name, loss, at, round_id in rows:
            by_party.setdefault(name, []).append((loss, at, round_id))
        out: dict[str, list[tuple[str, float, int]]] = {}
        for name, items in by_party.items():
            # The accountants are additive: composition is a running sum of loss vectors.
            total = np.cumsum(np.asarray([r for r, _, _ in items], dtype=np.float64), axis=0)
            keep = np.unique(
                np.linspace(0, len(items) - 1, min(len(items), max(1, max_points))).round()
            ).astype(int)
            out[name] = [
                (iso_utc(items[i][1]), self._eps(np.maximum(total[i], 0.0))[0], items[i][2])
                for i in keep
            ]
        return out

    # -- empirical audits -----------------------------------------------------
    def record_privacy_audit(
        self,
        party: str,
        *,
        canaries: int,
        guesses: int,
        correct: int,
        attack: str,
        confidence: float = 0.95,
        actor: str,
        note: str | None = None,
    ) -> PrivacyAudit:
        """Record a canary attack's counts on ``party`` beside the epsilon its ledger claims
        now. The empirical epsilon is computed here from the counts (the caller's own
        arithmetic is not taken), at the ledger's delta; the record is audited."""
        for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LedgerError(f"{name} must be a whole number >= 0, got {value!r}")
        if not 1 <= canaries <= MAX_CANARIES or not correct <= guesses <= canaries:
            raise LedgerError(
                f"need 1 <= canaries <= {MAX_CANARIES} and correct <= guesses <= canaries, got "
                f"{correct} right of {guesses} guesses on {canaries} canaries"
            )
        if not 0.5 <= confidence < 1.0:
            raise LedgerError(f"confidence must lie in [0.5, 1), got {confidence}")
        if not attack or len(attack) > 256:
            raise LedgerError("describe the attack in 1 to 256 characters")
        empirical = bounds.empirical_epsilon(
            correct, guesses, canaries, delta=self.delta, confidence=confidence
        )
        with self._tx() as s:
            spend = s.get(SpendRow, party)
            if spend is None:
                raise UnknownPartyError(f"no party named {party!r}")
            claimed = self._eps(spend.loss)[0]
            row = AuditResultRow(
                party=party,
                actor=actor,
                attack=attack,
                canaries=canaries,
                guesses=guesses,
                correct=correct,
                confidence=float(confidence),
                delta=self.delta,
                accountant=self.accountant,
                claimed_epsilon=claimed,
                empirical_lower=empirical.lower,
                empirical_point=_finite(empirical.point),
                empirical_upper=_finite(empirical.upper),
                refuted=empirical.exceeds(claimed),
            )
            s.add(row)
            s.flush()
            self._audit(
                s,
                actor,
                "privacy_audit",
                {
                    "id": row.id,
                    "party": party,
                    "claimed_epsilon": claimed,
                    "empirical_lower": empirical.lower,
                    "canaries": canaries,
                    "guesses": guesses,
                    "correct": correct,
                    "refuted": row.refuted,
                },
                None if note is None else note[:1000],
            )
            return self._privacy_audit(row)

    @staticmethod
    def _privacy_audit(r: AuditResultRow) -> PrivacyAudit:
        return PrivacyAudit(
            id=r.id,
            party=r.party,
            at=iso_utc(r.at),
            actor=r.actor,
            attack=r.attack,
            canaries=r.canaries,
            guesses=r.guesses,
            correct=r.correct,
            confidence=r.confidence,
            delta=r.delta,
            accountant=r.accountant,
            claimed_epsilon=r.claimed_epsilon,
            empirical_lower=r.empirical_lower,
            empirical_point=r.empirical_point,
            empirical_upper=r.empirical_upper,
            refuted=r.refuted,
        )

    def privacy_audits(self, party: str | None = None, limit: int = 100) -> list[PrivacyAudit]:
        """Recorded audits, newest first (of ``party`` only, when given)."""
        q = select(AuditResultRow)
        if party is not None:
            q = q.where(AuditResultRow.party == party)
        with Session(self.engine) as s:
            rows = s.scalars(q.order_by(AuditResultRow.id.desc()).limit(limit))
            return [self._privacy_audit(r) for r in rows]

    def count_rounds(self, state: RoundState | None = None) -> int:
        with Session(self.engine) as s:
            q = select(func.count(RoundRow.id))
            if state is not None:
                q = q.where(RoundRow.state == state)
            return int(s.scalar(q) or 0)

    def close(self) -> None:
        self.engine.dispose()
