"""Caps declared by the parties, their own ledgers' reports, signed audit heads.

- ``parties.registered_cap``: the cap this ledger's operator registered (the
  old ``epsilon_cap``); ``declared_cap``: the cap the party declares itself;
  ``epsilon_cap`` stays the enforced cap, the smaller of the two.
- ``parties.report``: the party's latest report of its own ledger.
- ``rounds.terms`` (a party's own ledger: what a round asked of it) and
  ``rounds.outcome`` (the guardian's: what the round released).
- ``audit_log.note`` (untrusted free text, out of the actor) and
  ``audit_log.signature`` (Ed25519 over the chain head the entry makes).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("parties") as batch:
        batch.add_column(sa.Column("registered_cap", sa.Float(), nullable=True))
        batch.add_column(sa.Column("declared_cap", sa.Float(), nullable=True))
        batch.add_column(sa.Column("report", sa.JSON(), nullable=True))
    parties = sa.table(
        "parties", sa.column("epsilon_cap", sa.Float), sa.column("registered_cap", sa.Float)
    )
    # Left nullable: making it NOT NULL would rebuild the table on SQLite, which the
    # foreign keys to it forbid once parties have charges. Every row has a value.
    op.get_bind().execute(sa.update(parties).values(registered_cap=parties.c.epsilon_cap))
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("terms", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("outcome", sa.JSON(), nullable=True))
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))
        batch.add_column(sa.Column("signature", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("signature")
        batch.drop_column("note")
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("outcome")
        batch.drop_column("terms")
    with op.batch_alter_table("parties") as batch:
        batch.drop_column("report")
        batch.drop_column("declared_cap")
        batch.drop_column("registered_cap")
