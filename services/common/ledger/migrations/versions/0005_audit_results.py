"""Empirical privacy audits: a canary attack's result per party beside its claimed epsilon.

Revision ID: 0005
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_results",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("party", sa.String(128), sa.ForeignKey("parties.name"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("attack", sa.String(256), nullable=False),
        sa.Column("canaries", sa.Integer(), nullable=False),
        sa.Column("guesses", sa.Integer(), nullable=False),
        sa.Column("correct", sa.Integer(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("delta", sa.Float(), nullable=False),
        sa.Column("accountant", sa.String(32), nullable=False),
        sa.Column("claimed_epsilon", sa.Float(), nullable=False),
        sa.Column("empirical_lower", sa.Float(), nullable=False),
        sa.Column("empirical_point", sa.Float(), nullable=True),
        sa.Column("empirical_upper", sa.Float(), nullable=True),
        sa.Column("refuted", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_audit_results_party", "audit_results", ["party"])


def downgrade() -> None:
    op.drop_index("ix_audit_results_party", table_name="audit_results")
    op.drop_table("audit_results")
