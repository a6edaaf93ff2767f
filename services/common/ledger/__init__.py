"""The guardian's persistent privacy ledger (SQLAlchemy 2 + Alembic; SQLite or PostgreSQL)."""

from services.common.ledger.store import (
    BatchBrokenError,
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
    "BatchBrokenError",
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
