"""no planner statistics on user text

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

ANALYZE (which autovacuum runs by itself) copies a sample of every column's values into `pg_statistic`: the most
common values and histogram bounds. For columns holding what users said (artifact text, their token ids and
embeddings, memory values, forget targets, system prompts, tool specs) that is a copy a forget cannot reach: the
markers of forgotten text were read back from `pg_stats` after `VACUUM FULL`. None of these columns is filtered on
in a way their statistics would help (lookups go through ids), so they carry none: `SET STATISTICS 0` makes ANALYZE
skip them. It does not remove statistics already gathered; changing a column's type does (PostgreSQL drops a
column's `pg_statistic` rows whenever its type is altered), so each column is also "altered" to the type it has,
which rewrites nothing (no table rewrite, no index rebuild for an unindexed column) and needs only the table
owner, not the superuser a `DELETE FROM pg_statistic` would. tests/foundation/test_statistics.py checks every
text, jsonb, array and vector column is listed here or deliberately kept (id arrays).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

USER_TEXT = {
    "tenants": ("webhook_secret",),
    "sessions": ("system_prompt", "retrieval", "tools", "sampling", "compaction"),
    "artifacts": ("content", "token_ids", "meta", "embedding"),
    "env_snapshots": ("state",),
    "memory_records": ("value", "provenance"),
    "memory_versions": ("value",),
    "forget_jobs": ("target", "reason", "receipt", "error"),
    "openai_conversations": ("meta",),
    "openai_responses": ("params", "usage"),
}


def _alter(table: str, columns: Sequence[str], target: int, drop_existing: bool) -> None:
    # The types come from the catalog, so the statement re-declares exactly what each column is.
    names = ", ".join(f"'{c}'" for c in columns)
    op.execute(f"""
        DO $$
        DECLARE r record;
        BEGIN
            FOR r IN SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type
                     FROM pg_attribute a
                     WHERE a.attrelid = '{table}'::regclass AND a.attname IN ({names}) AND NOT a.attisdropped
            LOOP
                EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET STATISTICS {target}', '{table}', r.attname);
                IF {str(drop_existing).lower()} THEN
                    EXECUTE format('ALTER TABLE %I ALTER COLUMN %I TYPE %s', '{table}', r.attname, r.type);
                END IF;
            END LOOP;
        END $$;
    """)


def upgrade() -> None:
    for table, columns in USER_TEXT.items():
        _alter(table, columns, 0, drop_existing=True)


def downgrade() -> None:
    for table, columns in USER_TEXT.items():
        _alter(table, columns, -1, drop_existing=False)
