"""forget job priority

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

A forget goes first (issue 33): a job's engine work runs at its priority, above every live turn, and a job a detector
webhook submitted (a suspected injection) at least as high as any other forget. The column holds
app/engine/priority.py's level (1: a forget, 2: a detector's); workers claim the most urgent job first.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "forget_jobs", sa.Column("priority", sa.SmallInteger(), server_default=sa.text("1"), nullable=False)
    )
    op.create_check_constraint(op.f("ck_forget_jobs_priority"), "forget_jobs", "priority IN (1, 2)")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_forget_jobs_priority"), "forget_jobs", type_="check")
    op.drop_column("forget_jobs", "priority")
