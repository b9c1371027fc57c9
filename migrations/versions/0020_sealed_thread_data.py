"""LangGraph thread data sealed at rest

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07

Erasure at rest, the threads slice (docs/erasure-at-rest.md, issue 42; issue 44's "thread data encrypted"). A
checkpoint's bytes and metadata, a channel value (`thread_blobs.blob`) and a pending write (`thread_writes.blob`)
are stored only as ciphertext, each row under a leaf of its own (`leaf`, in the clear, so a delete collects the
leaves of what it removes with `DELETE ... RETURNING leaf`, never opening a ciphertext).

The bytes are sealed **in place**: `checkpoint` and `blob` stay `bytea NOT NULL` and hold the envelope when `leaf` is
set, the saver's plaintext when it is NULL (a row from before this version, read as before until the online
migration seals it, step 6). The artifacts slice added `*_sealed` columns instead; here that would change every
statement that moves these columns (the put, the page's aggregates, copy, rewrite) for nothing: a bytea holds a
ciphertext as well as a plaintext, and `leaf` already says which one a row holds. So it cannot be wrong silently, a
check ties the two: a row with a leaf starts with that leaf's envelope header (format 1, the leaf big-endian,
app/keys/envelope.py), so a plaintext stored beside a leaf, or a ciphertext under another row's leaf number, is
refused by PostgreSQL.

The metadata is jsonb and cannot hold a ciphertext: `metadata_sealed` (bytea) takes it for new rows and `metadata`
becomes nullable (exactly one of the two is set). LangGraph filters checkpoints by metadata (`list(filter=...)`):
that filter moves into the process, over opened rows, a page at a time (app/threads/repositories/checkpoints.py).
What the database itself must find by metadata is a run's checkpoints (delete_for_runs): `run_id` is copied into a
clear column of its own (an identifier LangGraph makes, like the ids beside it) with its index; legacy rows keep being
found through 0012's expression index on `metadata ->> 'run_id'`.

`versions` (channel names and version strings), the writes' `channel`, `task_id`, `task_path` and every id stay in
the clear: identifiers the statements join and order on.

`thread_pending_shreds`: the leaves a delete, a prune, a rewrite or a replacing put removed, recorded in its
transaction and deleted once shredded (right after the commit, before the answer); a row left there (the key
provider was down) is retried by the forget worker's shred sweep (app/forget/shredding.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The column sealed in place, per table; a row's envelope header must name its leaf.
SEALED_IN_PLACE = {"thread_checkpoints": "checkpoint", "thread_blobs": "blob", "thread_writes": "blob"}


def _header_check(column: str) -> str:
    return f"leaf IS NULL OR substring({column} FROM 1 FOR 9) = (CAST('\\x01' AS bytea) || int8send(leaf))"


def upgrade() -> None:
    for table, column in SEALED_IN_PLACE.items():
        op.add_column(table, sa.Column("leaf", sa.BigInteger(), nullable=True))
        op.create_check_constraint(op.f(f"ck_{table}_sealed_under_leaf"), table, _header_check(column))
    op.add_column("thread_checkpoints", sa.Column("metadata_sealed", sa.LargeBinary(), nullable=True))
    # Migration 0006's rule: no planner statistics on a column holding (sealed) user content.
    op.execute("ALTER TABLE thread_checkpoints ALTER COLUMN metadata_sealed SET STATISTICS 0")
    op.alter_column("thread_checkpoints", "metadata", nullable=True)
    op.create_check_constraint(
        op.f("ck_thread_checkpoints_one_metadata"), "thread_checkpoints",
        "(metadata IS NULL) <> (metadata_sealed IS NULL) AND (metadata_sealed IS NULL) = (leaf IS NULL)",
    )
    op.add_column("thread_checkpoints", sa.Column("run_id", sa.String(length=200), nullable=True))
    op.create_index("ix_thread_checkpoints_run", "thread_checkpoints", ["tenant_id", "run_id"])
    op.create_table(
        "thread_pending_shreds",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("leaves", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_thread_pending_shreds_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_thread_pending_shreds")),
    )
    # Leaf numbers only, but an array column: 0006's rule keeps arrays without statistics unless listed as ids.
    op.execute("ALTER TABLE thread_pending_shreds ALTER COLUMN leaves SET STATISTICS 0")


def downgrade() -> None:
    op.drop_table("thread_pending_shreds")
    # Sealed thread data cannot go back to plaintext without its keys: a downgrade drops the threads holding it.
    op.execute(
        "DELETE FROM threads t WHERE EXISTS (SELECT 1 FROM thread_checkpoints c WHERE c.tenant_id = t.tenant_id"
        " AND c.thread_id = t.thread_id AND c.leaf IS NOT NULL)"
        " OR EXISTS (SELECT 1 FROM thread_blobs b WHERE b.tenant_id = t.tenant_id AND b.thread_id = t.thread_id"
        " AND b.leaf IS NOT NULL)"
        " OR EXISTS (SELECT 1 FROM thread_writes w WHERE w.tenant_id = t.tenant_id AND w.thread_id = t.thread_id"
        " AND w.leaf IS NOT NULL)"
    )
    op.drop_index("ix_thread_checkpoints_run", table_name="thread_checkpoints")
    op.drop_column("thread_checkpoints", "run_id")
    op.drop_constraint(op.f("ck_thread_checkpoints_one_metadata"), "thread_checkpoints", type_="check")
    op.alter_column("thread_checkpoints", "metadata", nullable=False)
    op.drop_column("thread_checkpoints", "metadata_sealed")
    for table in SEALED_IN_PLACE:
        op.drop_constraint(op.f(f"ck_{table}_sealed_under_leaf"), table, type_="check")
        op.drop_column(table, "leaf")
