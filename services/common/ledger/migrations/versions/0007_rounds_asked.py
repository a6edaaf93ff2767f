"""Rounds each party was asked to vote in, aborted ones included.

- ``party_spend.rounds_asked``: R in the guarantee (eps, delta + R 2^-40) that
  docs/privacy.md states for the validity proofs' ring conversion. ``rounds``
  counts charged rounds and drops a round that is aborted or charges the party
  nothing; this one is only ever incremented, at the reservation.

Filled from the audit log: every ``reserve`` entry lists the parties it
included, and entries are never deleted.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import json
from collections import Counter

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("party_spend") as batch:
        batch.add_column(
            sa.Column("rounds_asked", sa.Integer(), nullable=False, server_default="0")
        )
    bind = op.get_bind()
    asked: Counter[str] = Counter()
    rows = bind.execute(sa.text("SELECT detail FROM audit_log WHERE action = 'reserve'"))
    for (detail,) in rows:
        value = json.loads(detail) if isinstance(detail, str) else detail
        for party in (value or {}).get("included", []):
            asked[str(party)] += 1
    for party, count in asked.items():
        bind.execute(
            sa.text("UPDATE party_spend SET rounds_asked = :n WHERE party = :p"),
            {"n": count, "p": party},
        )


def downgrade() -> None:
    with op.batch_alter_table("party_spend", recreate="never") as batch:
        batch.drop_column("rounds_asked")
