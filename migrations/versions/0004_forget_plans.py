"""forget plans

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

A deletion request made in plain words inside a session ("Forget that I live in Paris") is answered with a plan the
client must confirm: the plan is a forget job in status `planned`, which no worker claims until it is confirmed.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "status IN ('queued', 'running', 'succeeded', 'failed', 'needs_input')"
NEW = "status IN ('planned', 'queued', 'running', 'succeeded', 'failed', 'needs_input')"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", type_="check")
    op.create_check_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", NEW)


def downgrade() -> None:
    op.execute("DELETE FROM forget_jobs WHERE status = 'planned'")
    op.drop_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", type_="check")
    op.create_check_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", OLD)
