"""session lease

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

A session is taken by a lease (`lease_owner`, `lease_expires_at`) instead of a row lock held through the model call:
a turn or a forget takes it in a short transaction, works outside any transaction, and commits only while the lease is
still its own (app/sessions/locking.py). `status` says what holds it (`running`, `forgetting`) and reads `idle` once the
lease is released or has expired.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("lease_owner", sa.String(80), nullable=True))
    op.add_column("sessions", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE sessions SET status = 'idle' WHERE status NOT IN ('idle', 'running', 'forgetting')")
    op.create_check_constraint(op.f("ck_sessions_status"), "sessions", "status IN ('idle', 'running', 'forgetting')")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_sessions_status"), "sessions", type_="check")
    op.drop_column("sessions", "lease_expires_at")
    op.drop_column("sessions", "lease_owner")
