"""the key store this database's content was sealed with

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

Erasure at rest (docs/erasure-at-rest.md, "keys are never lost by accident"). A wiped or swapped key store reads as
"never written": a process would start fresh covers, and every ciphertext sealed before would fail as tampered. So
the database records the identity of the key store (`KeyProvider.identity()`) the first process started with, and a
process whose provider answers another one refuses to start (app/keys/identity.py). One row, made by the first start.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "key_store",
        # One row: the primary key can only be true.
        sa.Column("one", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("identity", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("one", name=op.f("pk_key_store")),
        sa.CheckConstraint("one", name=op.f("ck_key_store_one_row")),
    )
    # Migration 0006's rule for text columns (tests/foundation/test_statistics.py); an id and a name, and one row.
    for column in ("identity", "provider"):
        op.execute(f"ALTER TABLE key_store ALTER COLUMN {column} SET STATISTICS 0")


def downgrade() -> None:
    op.drop_table("key_store")
