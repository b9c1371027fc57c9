"""memory expiry and creation time

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

A memory record may carry a time to live (LangGraph's store items do, issue 44): `ttl_s` is the lifetime a write (or a
read that refreshes it) restarts, `expires_at` the moment it runs out. An expired record is never served and is
forgotten (tombstoned, its history erased) by the first read that meets it or by the expiry sweep, whichever comes
first. `created_at` is when the key's current life began (its first write, or the first write after a tombstone),
which a store item reports beside `updated_at`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memory_records", sa.Column("ttl_s", sa.Float(), nullable=True))
    op.add_column("memory_records", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    # Existing keys began their life at their last write at the latest.
    op.add_column(
        "memory_records",
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )
    op.execute("UPDATE memory_records SET created_at = updated_at")
    op.create_check_constraint(
        op.f("ck_memory_records_expiry_with_ttl"), "memory_records", "(ttl_s IS NULL) = (expires_at IS NULL)"
    )
    # The sweep's scan: only records that can expire are in it.
    op.create_index(
        "ix_memory_records_expires_at", "memory_records", ["expires_at"],
        postgresql_where=sa.text("expires_at IS NOT NULL AND NOT forgotten"),
    )


def downgrade() -> None:
    op.drop_index("ix_memory_records_expires_at", table_name="memory_records")
    op.drop_constraint(op.f("ck_memory_records_expiry_with_ttl"), "memory_records", type_="check")
    op.drop_column("memory_records", "created_at")
    op.drop_column("memory_records", "expires_at")
    op.drop_column("memory_records", "ttl_s")
