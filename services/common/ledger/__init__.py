"""The guardian's persistent privacy ledger (SQLAlchemy 2 + Alembic; SQLite or PostgreSQL).

Its refusals and round records are the round core's (:mod:`capc.round.errors`,
:mod:`capc.round.ledger`): one vocabulary from the ledger to the gRPC edge."""

from services.common.ledger.store import KeptSetting, Ledger, PartyBudget, PrivacyAudit

__all__ = ["KeptSetting", "Ledger", "PartyBudget", "PrivacyAudit"]
