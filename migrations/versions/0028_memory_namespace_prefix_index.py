"""memory namespace prefix index: a search under a namespace prefix reads that prefix's live records only

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07

`POST /v1/memory:search` with a `namespace_prefix` (LangGraph's `store.search(prefix)`, app/memory/repositories/
search.py `under_statement`) selects a tenant's live records whose namespace is the prefix or below it. Its test,
`namespace = prefix OR starts_with(namespace, prefix || '.')`, bounded no index scan: a search read all of the
tenant's records through the primary key, or the whole table where PostgreSQL judged that cheaper. This index orders a tenant's live namespaces byte-wise (text_pattern_ops: whatever
the database's collation), and the statement bounds the scan to [prefix, prefix || '/'), which holds the prefix and
everything below it.

Identifiers only (the namespace is in the clear, as the primary key's), so no statistics rule applies (0006's is for
user content). Created in the migration's transaction, as every index here is (0027 says why); a deployment with a
large `memory_records` can create it beforehand with `CREATE INDEX CONCURRENTLY ix_memory_records_live_namespaces ON
memory_records (tenant_id, namespace text_pattern_ops) WHERE NOT forgotten`, which this migration then finds and
keeps (`IF NOT EXISTS`; a concurrent build that failed leaves an invalid index of that name: drop it first).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_memory_records_live_namespaces"


def upgrade() -> None:
    op.create_index(
        INDEX, "memory_records", ["tenant_id", sa.text("namespace text_pattern_ops")],
        postgresql_where=sa.text("NOT forgotten"), if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="memory_records")
