"""An index on ``rounds.state``.

Every spend report and heartbeat asks a ledger for its open rounds (reserved or
released): a handful among every round it ever held. Without the index that read
scans the whole table, and grows with the ledger's age.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_rounds_state", "rounds", ["state"])


def downgrade() -> None:
    op.drop_index("ix_rounds_state", table_name="rounds")
