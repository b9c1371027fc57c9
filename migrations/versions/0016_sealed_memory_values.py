"""memory values sealed at rest, and the leaves a forget job shreds

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

Erasure at rest, the memory slice (docs/erasure-at-rest.md). A memory value is stored only as ciphertext
(`value_sealed`, app/keys/envelope.py) under one leaf per record incarnation; `leaf` names it in the clear (it is in
the ciphertext's header too) so that a listing can leave out records whose leaf is punctured and a forget can collect
the leaves it erases without reading a ciphertext. The JSONB `value` columns stay, nullable, for rows written before
this version: reads use `value_sealed` when present, else the legacy plaintext, until the online migration seals
them (issue 42, step 6). A row never holds both, and a tombstone holds neither.

`forget_jobs.shred_leaves` are the leaves a job's forget erased (NULL: it erased no sealed content);
`shredded_at` is when they were punctured in the key provider, the job's erasure at rest being complete.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TOMBSTONE = op.f("ck_memory_records_tombstone_has_no_value")
# Migration 0006's rule for the new columns: no planner statistics (no plan filters on a ciphertext or a job's leaf
# list, and a sample in pg_statistic would be one more copy to reason about). They are new: nothing to drop.
_NO_STATISTICS = (("memory_records", "value_sealed"), ("memory_versions", "value_sealed"), ("forget_jobs", "shred_leaves"))


def upgrade() -> None:
    for table in ("memory_records", "memory_versions"):
        op.add_column(table, sa.Column("value_sealed", sa.LargeBinary(), nullable=True))
        op.add_column(table, sa.Column("leaf", sa.BigInteger(), nullable=True))
        op.create_check_constraint(op.f(f"ck_{table}_one_value"), table, "value IS NULL OR value_sealed IS NULL")
    op.drop_constraint(_TOMBSTONE, "memory_records", type_="check")
    op.create_check_constraint(
        _TOMBSTONE, "memory_records", "NOT forgotten OR (value IS NULL AND value_sealed IS NULL AND leaf IS NULL)"
    )
    # A record's leaf is its live incarnation's; a history row keeps its leaf after a forget erased its value.
    op.create_check_constraint(
        op.f("ck_memory_records_sealed_with_leaf"), "memory_records", "(value_sealed IS NULL) = (leaf IS NULL)"
    )
    op.create_check_constraint(
        op.f("ck_memory_versions_sealed_with_leaf"), "memory_versions", "value_sealed IS NULL OR leaf IS NOT NULL"
    )
    op.add_column("forget_jobs", sa.Column("shred_leaves", postgresql.ARRAY(sa.BigInteger()), nullable=True))
    op.add_column("forget_jobs", sa.Column("shredded_at", sa.DateTime(timezone=True), nullable=True))
    for table, column in _NO_STATISTICS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STATISTICS 0")
    # The forget worker's retry scan: only jobs whose shred is still pending are in it.
    op.create_index(
        "ix_forget_jobs_pending_shred", "forget_jobs", ["created_at"],
        postgresql_where=sa.text("shred_leaves IS NOT NULL AND shredded_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_forget_jobs_pending_shred", table_name="forget_jobs")
    op.drop_column("forget_jobs", "shredded_at")
    op.drop_column("forget_jobs", "shred_leaves")
    op.drop_constraint(op.f("ck_memory_versions_sealed_with_leaf"), "memory_versions", type_="check")
    op.drop_constraint(op.f("ck_memory_records_sealed_with_leaf"), "memory_records", type_="check")
    op.drop_constraint(_TOMBSTONE, "memory_records", type_="check")
    # Sealed values cannot go back to plaintext without their keys: a downgrade drops the records holding them
    # (their history goes with them; a tombstoned record's history holds no value).
    op.execute("DELETE FROM memory_records WHERE value_sealed IS NOT NULL")
    op.create_check_constraint(_TOMBSTONE, "memory_records", "NOT forgotten OR value IS NULL")
    for table in ("memory_records", "memory_versions"):
        op.drop_constraint(op.f(f"ck_{table}_one_value"), table, type_="check")
        op.drop_column(table, "leaf")
        op.drop_column(table, "value_sealed")
