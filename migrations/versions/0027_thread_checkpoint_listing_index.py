"""thread checkpoint listing index: a tenant's checkpoints by id, across threads

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07

LangGraph's `list(None)` (`GET /v1/threads:checkpoints`, app/threads/repositories/reads.py `tenant_listing`) pages
through every checkpoint of a tenant, newest first by checkpoint id, ties in (thread, namespace) order, from a cursor
(checkpoint_id, thread_id, checkpoint_ns). The primary key orders a tenant's rows by thread first, so each page was a
top-N sort of every row of the tenant older than its cursor. This index holds exactly that order per tenant: a page is
a backward scan from the cursor (and from `before`), stopped at its LIMIT.

Identifiers only (the ids beside the sealed columns, in the clear since 0012), so no statistics rule applies (0006's
is for user content). Created in the migration's transaction, as every index here is: `CREATE INDEX CONCURRENTLY`
cannot run inside it (the advisory-locked transaction of migrations/env.py), and the table is young (0012, this
week); a deployment with a large `thread_checkpoints` can create it beforehand with `CREATE INDEX CONCURRENTLY
ix_thread_checkpoints_listing ON thread_checkpoints (tenant_id, checkpoint_id, thread_id, checkpoint_ns)`, which
this migration then finds and keeps (`IF NOT EXISTS`; a concurrent build that failed leaves an invalid index of that
name: drop it first).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_thread_checkpoints_listing"
COLUMNS = ("tenant_id", "checkpoint_id", "thread_id", "checkpoint_ns")


def upgrade() -> None:
    op.create_index(INDEX, "thread_checkpoints", list(COLUMNS), if_not_exists=True)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="thread_checkpoints")
