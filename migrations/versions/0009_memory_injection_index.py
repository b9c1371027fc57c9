"""memory injection index

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Which sessions a memory record reached (its `memory` artifacts, by namespace and key) is asked by every memory
forget, in the tombstone's transaction (app/forget/cascade.py); without an index it scanned the tenant's artifacts.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_artifacts_memory_record", "artifacts",
        ["tenant_id", sa.text("(meta ->> 'namespace')"), sa.text("(meta ->> 'key')")],
        postgresql_where=sa.text("kind = 'memory'"),
    )


def downgrade() -> None:
    op.drop_index("ix_artifacts_memory_record", table_name="artifacts")
