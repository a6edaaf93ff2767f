"""Per-querier allowances: a fair share of every party's budget per querying party.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "querier_allowances",
        sa.Column("querier", sa.String(128), primary_key=True),
        sa.Column("epsilon_cap", sa.Float(), nullable=False),
    )
    op.create_table(
        "querier_spend",
        sa.Column("querier", sa.String(128), primary_key=True),
        sa.Column("party", sa.String(128), sa.ForeignKey("parties.name"), primary_key=True),
        sa.Column("rdp", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("querier_spend")
    op.drop_table("querier_allowances")
