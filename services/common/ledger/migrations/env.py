"""Alembic environment: run on the connection the ledger hands over."""

from __future__ import annotations

from alembic import context

from services.common.ledger.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
