"""DP-trained teachers: each party's DP-SGD training, charged once per attested digest.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "trainings",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("party", sa.String(128), sa.ForeignKey("parties.name"), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("records", sa.JSON(), nullable=False),
        sa.Column("event", sa.JSON(), nullable=False),
        sa.Column("loss", sa.JSON(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("party", "digest", name="uq_trainings_party_digest"),
    )
    op.create_index("ix_trainings_party", "trainings", ["party"])


def downgrade() -> None:
    op.drop_index("ix_trainings_party", table_name="trainings")
    op.drop_table("trainings")
