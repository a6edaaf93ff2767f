"""Alembic migrations of the guardian's ledger."""
