"""forget jobs a legal hold parks, and forgets that ask for their shred at once

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07

A forget job that reaches a session a standing legal hold covers (a memory key's cascade into it, or a job queued
before the hold was placed) no longer erases it: the job parks in status `held`, `held_by` naming the hold, and the
hold's release queues it again (app/holds/). `shred_now` records a forget that asked for `"shred": "now"`: it reads
as ended only once every key of what it erased is destroyed (docs/erasure-at-rest.md). Ids and flags only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "status IN ('planned', 'queued', 'running', 'succeeded', 'failed', 'needs_input')"
NEW = "status IN ('planned', 'queued', 'running', 'succeeded', 'failed', 'needs_input', 'held')"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", type_="check")
    op.create_check_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", NEW)
    op.add_column("forget_jobs", sa.Column("held_by", sa.String(length=40), nullable=True))
    op.add_column("forget_jobs", sa.Column("shred_now", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_index("ix_forget_jobs_held_by", "forget_jobs", ["tenant_id", "held_by"],
                    postgresql_where=sa.text("held_by IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_forget_jobs_held_by", table_name="forget_jobs")
    op.execute("UPDATE forget_jobs SET status = 'queued' WHERE status = 'held'")
    op.drop_column("forget_jobs", "shred_now")
    op.drop_column("forget_jobs", "held_by")
    op.drop_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", type_="check")
    op.create_check_constraint(op.f("ck_forget_jobs_status"), "forget_jobs", OLD)
