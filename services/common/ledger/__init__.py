"""The guardian's persistent privacy ledger (SQLAlchemy 2 + Alembic; SQLite or PostgreSQL)."""

from services.common.ledger.store import (
    DuplicateRoundError,
    KeptSetting,
    Ledger,
    LedgerError,
    PartyBudget,
    PrivacyAudit,
    QuorumError,
    Reservation,
    RoundStateError,
    TeacherCountError,
    UnknownPartyError,
    UnknownTaskError,
)

__all__ = [
    "DuplicateRoundError",
    "KeptSetting",
    "Ledger",
    "LedgerError",
    "PartyBudget",
    "PrivacyAudit",
    "QuorumError",
    "Reservation",
    "RoundStateError",
    "TeacherCountError",
    "UnknownPartyError",
    "UnknownTaskError",
]
