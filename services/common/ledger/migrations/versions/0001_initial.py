"""Initial ledger schema: settings, parties, spend, tasks, rounds, charges, audit log.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ledger_settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    op.create_table(
        "parties",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("epsilon_cap", sa.Float(), nullable=False),
        sa.Column("certificate_fingerprint", sa.String(128), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("last_seen", _TS, nullable=True),
    )
    op.create_table(
        "party_spend",
        sa.Column("party", sa.String(128), sa.ForeignKey("parties.name"), primary_key=True),
        sa.Column("rdp", sa.JSON(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
    )
    op.create_table(
        "tasks",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
    )
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("round_key", sa.String(128), nullable=False),
        sa.Column("task", sa.String(128), sa.ForeignKey("tasks.name"), nullable=False),
        sa.Column("querier", sa.String(128), nullable=False),
        sa.Column("queries", sa.Integer(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "reserved",
                "released",
                "committed",
                "aborted",
                name="round_state",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.UniqueConstraint("round_key", name="uq_rounds_round_key"),
    )
    op.create_table(
        "charges",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("round_id", sa.Integer(), sa.ForeignKey("rounds.id"), nullable=False),
        sa.Column("party", sa.String(128), sa.ForeignKey("parties.name"), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("reservation", "charge", name="charge_kind", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("mechanism", sa.String(64), nullable=False),
        sa.Column("rdp", sa.JSON(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.UniqueConstraint("round_id", "party", name="uq_charges_round_party"),
    )
    op.create_index("ix_charges_round_id", "charges", ["round_id"])
    op.create_index("ix_charges_party", "charges", ["party"])
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("at", _TS, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    for table in (
        "audit_log",
        "charges",
        "rounds",
        "tasks",
        "party_spend",
        "parties",
        "ledger_settings",
    ):
        op.drop_table(table)
