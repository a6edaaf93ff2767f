"""Ledgers keep an accountant kind and store each charge's privacy event.

Loss vectors (``rdp`` columns) become ``loss``: what they hold depends on the
ledger's accountant. A ledger that existed before this revision accounted
in Renyi DP on its stored order grid, so it keeps exactly that accountant and
every stored vector as it is: nothing it reports can drop. New ledgers
choose their accountant when created.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TABLES = ("party_spend", "charges", "querier_spend")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("rdp", new_column_name="loss", existing_type=sa.JSON())
    with op.batch_alter_table("charges") as batch:
        batch.add_column(sa.Column("event", sa.JSON(), nullable=True))
    settings = sa.table("ledger_settings", sa.column("key", sa.String), sa.column("value", sa.Text))
    conn = op.get_bind()
    orders = conn.execute(sa.select(settings.c.value).where(settings.c.key == "orders")).scalar()
    if orders is not None:
        kind = {"name": "rdp", "orders": json.loads(orders), "conversion": "improved"}
        op.bulk_insert(settings, [{"key": "accountant", "value": json.dumps(kind)}])
        conn.execute(sa.delete(settings).where(settings.c.key == "orders"))


def downgrade() -> None:
    settings = sa.table("ledger_settings", sa.column("key", sa.String), sa.column("value", sa.Text))
    conn = op.get_bind()
    raw = conn.execute(sa.select(settings.c.value).where(settings.c.key == "accountant")).scalar()
    if raw is not None:
        kind = json.loads(raw)
        if kind.get("name") != "rdp":
            raise RuntimeError(
                "this ledger accounts in Gaussian DP; revision 0002 knows only Renyi DP vectors"
            )
        op.bulk_insert(settings, [{"key": "orders", "value": json.dumps(kind["orders"])}])
        conn.execute(sa.delete(settings).where(settings.c.key == "accountant"))
    with op.batch_alter_table("charges") as batch:
        batch.drop_column("event")
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("loss", new_column_name="rdp", existing_type=sa.JSON())
