"""Ledger tables (SQLAlchemy 2). The Alembic migrations create exactly these.

Loss vectors are the ledger accountant's additive representation of privacy
loss (Gaussian DP: [sum mu**2]; Renyi DP: the curve over its order grid),
stored as JSON arrays of floats (Python's float repr round-trips exactly).
``party_spend`` keeps each party's running total of reservations and charges,
so a budget check locks one row per party instead of summing history. Each
charge also stores its privacy event, described by parameters.
"""

from __future__ import annotations

import datetime as dt
import enum

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from capc.round.ledger import RoundState


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    pass


class ChargeKind(enum.StrEnum):
    RESERVATION = "reservation"
    CHARGE = "charge"


class Setting(Base):
    __tablename__ = "ledger_settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class PartyRow(Base):
    """A party and its caps (epsilon at the ledger's delta).

    ``epsilon_cap`` is the cap the ledger enforces: the smaller of
    ``registered_cap`` (set by whoever runs this ledger) and ``declared_cap``
    (what the party itself declared when it connected; None until it has).
    ``registered_teachers`` is the most teachers the guardian's operator lets
    the party vote with (its vote weight); None until the operator pins it,
    and a party with none pinned is refused when it connects.
    ``report`` is the party's latest report of its own ledger (JSON; see
    :meth:`services.common.ledger.Ledger.store_report`).
    """

    __tablename__ = "parties"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    role: Mapped[str] = mapped_column(String(32), default="answerer")
    epsilon_cap: Mapped[float] = mapped_column(Float)
    registered_cap: Mapped[float | None] = mapped_column(Float, nullable=True)
    declared_cap: Mapped[float | None] = mapped_column(Float, nullable=True)
    registered_teachers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    report: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    certificate_fingerprint: Mapped[str | None] = mapped_column(String(128), nullable=True)
    status: Mapped[str] = mapped_column(String(32), default="active")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class SpendRow(Base):
    __tablename__ = "party_spend"
    party: Mapped[str] = mapped_column(ForeignKey("parties.name"), primary_key=True)
    loss: Mapped[list[float]] = mapped_column(JSON)
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    #: Rounds the party was asked to vote in (reserved for it), aborted ones included:
    #: R in the guarantee (eps, delta + R 2^-40). Only ever incremented, in the
    #: reservation's transaction, so it may over-count after a crash, never under-count.
    rounds_asked: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class TaskRow(Base):
    __tablename__ = "tasks"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    config: Mapped[dict[str, object]] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RoundRow(Base):
    __tablename__ = "rounds"
    __table_args__ = (
        UniqueConstraint("round_key", name="uq_rounds_round_key"),
        # Reports and heartbeats ask for the open rounds: a few among all ever held.
        Index("ix_rounds_state", "state"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_key: Mapped[str] = mapped_column(String(128))
    task: Mapped[str] = mapped_column(ForeignKey("tasks.name"))
    querier: Mapped[str] = mapped_column(String(128))
    queries: Mapped[int] = mapped_column(Integer)
    state: Mapped[RoundState] = mapped_column(
        Enum(RoundState, name="round_state", native_enum=False, length=16)
    )
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: An answering party's own ledger: what the round asked of it (mechanism, vote
    #: weight, participation), from which it computes the round's charge itself.
    terms: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    #: The guardian's ledger: what the round released (its answered mask), which
    #: each party is told so that it can charge itself the same.
    outcome: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)


class ChargeRow(Base):
    __tablename__ = "charges"
    __table_args__ = (UniqueConstraint("round_id", "party", name="uq_charges_round_party"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"), index=True)
    party: Mapped[str] = mapped_column(ForeignKey("parties.name"), index=True)
    kind: Mapped[ChargeKind] = mapped_column(
        Enum(ChargeKind, name="charge_kind", native_enum=False, length=16)
    )
    mechanism: Mapped[str] = mapped_column(String(64))
    loss: Mapped[list[float]] = mapped_column(JSON)
    #: The event charged (or reserved), JSON; None for charges made before revision 0003.
    event: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AuditRow(Base):
    """One entry of the hash-chained audit log.

    ``actor`` is an authenticated identity (a certificate's name, or the
    service itself); ``note`` is free text a caller supplied, recorded but
    never trusted. ``signature`` is the ledger key's Ed25519 signature of the
    chain head this entry makes (hex; None where the ledger has no key).
    """

    __tablename__ = "audit_log"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict[str, object]] = mapped_column(JSON)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    signature: Mapped[str | None] = mapped_column(String(128), nullable=True)


class AllowanceRow(Base):
    """Optional fair share: the most epsilon one querier may make any single party spend."""

    __tablename__ = "querier_allowances"
    querier: Mapped[str] = mapped_column(String(128), primary_key=True)
    epsilon_cap: Mapped[float] = mapped_column(Float)


class QuerierSpendRow(Base):
    """Loss a querier's rounds have charged (or reserved) on each party."""

    __tablename__ = "querier_spend"
    querier: Mapped[str] = mapped_column(String(128), primary_key=True)
    party: Mapped[str] = mapped_column(ForeignKey("parties.name"), primary_key=True)
    loss: Mapped[list[float]] = mapped_column(JSON)


class TrainingRow(Base):
    """A party's DP-SGD training, charged once per attested digest (SHA-256 of the
    teacher files and their records: :mod:`capc.round.training`). ``records``: the
    attested records (JSON list), ``event``: the charge, ``loss``: its loss vector,
    ``epsilon``: the training alone at the ledger's delta."""

    __tablename__ = "trainings"
    __table_args__ = (UniqueConstraint("party", "digest", name="uq_trainings_party_digest"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    party: Mapped[str] = mapped_column(ForeignKey("parties.name"), index=True)
    digest: Mapped[str] = mapped_column(String(64))
    records: Mapped[list[dict[str, object]]] = mapped_column(JSON)
    event: Mapped[dict[str, object]] = mapped_column(JSON)
    loss: Mapped[list[float]] = mapped_column(JSON)
    epsilon: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AuditResultRow(Base):
    """An empirical privacy audit of one party (a canary attack) beside the epsilon its
    ledger claimed when the result was recorded; ``refuted`` at 99.9% confidence."""

    __tablename__ = "audit_results"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    party: Mapped[str] = mapped_column(ForeignKey("parties.name"), index=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    attack: Mapped[str] = mapped_column(String(256))
    canaries: Mapped[int] = mapped_column(Integer)
    guesses: Mapped[int] = mapped_column(Integer)
    correct: Mapped[int] = mapped_column(Integer)
    confidence: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    accountant: Mapped[str] = mapped_column(String(32))
    claimed_epsilon: Mapped[float] = mapped_column(Float)
    empirical_lower: Mapped[float] = mapped_column(Float)
    empirical_point: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: None: the interval is unbounded above (every guess was right).
    empirical_upper: Mapped[float | None] = mapped_column(Float, nullable=True)
    refuted: Mapped[bool] = mapped_column(Boolean)
