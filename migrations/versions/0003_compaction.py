"""compaction

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

Compaction archives the artifacts it summarizes instead of deleting them (a forget may have to replay the
transitions they came from): `artifacts.archived_by` is the compaction transition that took an artifact out of the
live prompt. A memory record written back from a session's summary carries its provenance (session and artifact),
so forgetting what the summary was derived from can tombstone the record too. `sessions.compaction` holds a session's
automatic compaction policy (a token budget).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("artifacts", sa.Column("archived_by", sa.Integer(), nullable=True))
    op.add_column(
        "sessions",
        sa.Column("compaction", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
    )
    op.add_column(
        "memory_records", sa.Column("provenance", postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("memory_records", "provenance")
    op.drop_column("sessions", "compaction")
    op.drop_column("artifacts", "archived_by")
