"""forget job events

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

Every change of a forget job's status is announced on the channel `lethe_forget_jobs` (payload: the job id and its
new status), by a trigger, so no code path can forget to: a waiter (`POST /v1/forget` with `wait`) learns at once
that its job ended, and every process's forget worker that a job was queued, whichever process wrote it. A job sent
back because its session was busy waits in the queue (`run_after`) instead of in the worker that tried it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("forget_jobs", sa.Column("run_after", sa.DateTime(timezone=True), nullable=True))
    op.execute("""
        CREATE FUNCTION lethe_forget_job_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('lethe_forget_jobs', NEW.id || ' ' || NEW.status);
            RETURN NULL;
        END
        $$
    """)
    op.execute("""
        CREATE TRIGGER forget_job_event AFTER INSERT OR UPDATE OF status ON forget_jobs
        FOR EACH ROW EXECUTE FUNCTION lethe_forget_job_event()
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER forget_job_event ON forget_jobs")
    op.execute("DROP FUNCTION lethe_forget_job_event()")
    op.drop_column("forget_jobs", "run_after")
