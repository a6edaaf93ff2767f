"""The teacher count the guardian's operator pins for each answering party.

- ``parties.registered_teachers``: the most teachers the party may vote with
  (its vote weight; the validity proofs hold a party to the count it declares
  and no further). None until the operator pins one: a party migrated from an
  earlier revision is refused at Register until then.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("parties") as batch:
        batch.add_column(sa.Column("registered_teachers", sa.Integer(), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+): rebuilding the table, as batch mode would,
    # is refused by the foreign keys to it once parties have charges.
    with op.batch_alter_table("parties", recreate="never") as batch:
        batch.drop_column("registered_teachers")
