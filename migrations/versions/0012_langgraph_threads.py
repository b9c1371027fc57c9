"""langgraph threads

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

LangGraph threads, checkpoints and pending writes per tenant (issue 44; app/threads/). The server never reads a
checkpoint, a channel value or a write: they are the saver's serde bytes (`type` names the encoding). It reads only
what it needs to answer LangGraph's queries: the metadata (list filters, `run_id` for delete_for_runs) and each
checkpoint's channel versions (which blobs make up its channel values).

`threads` is one row per thread id a tenant ever wrote: the row every write of the thread locks first (the ordered
barrier between a delete and a late writer), its `revision` (bumped by every write: a rewrite of the blobs is refused
when it moved) and `generation` (bumped by every rewrite: a writer that read the blobs before it is refused). It
outlives a delete, as do `thread_deleted_checkpoints`, the ids a delete removed: nothing is ever again stored under
them, nor on top of them (langgraph#7206).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TENANT = sa.Column("tenant_id", sa.String(length=40), nullable=False)


def _tenant_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant_id"], ["tenants.id"], name=op.f(f"fk_{table}_tenant_id_tenants"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "threads",
        _TENANT.copy(),
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("revision", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("generation", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        _tenant_fk("threads"),
        sa.PrimaryKeyConstraint("tenant_id", "thread_id", name=op.f("pk_threads")),
    )
    op.create_table(
        "thread_checkpoints",
        _TENANT.copy(),
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("checkpoint_ns", sa.String(length=500), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=200), nullable=False),
        sa.Column("parent_id", sa.String(length=200), nullable=True),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column("checkpoint", sa.LargeBinary(), nullable=False),
        sa.Column("metadata", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("versions", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        _tenant_fk("thread_checkpoints"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "thread_id"], ["threads.tenant_id", "threads.thread_id"],
            name=op.f("fk_thread_checkpoints_tenant_id_thread_id_threads"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "thread_id", "checkpoint_ns", "checkpoint_id", name=op.f("pk_thread_checkpoints")
        ),
    )
    # delete_for_runs looks checkpoints up by run across the tenant's threads.
    op.create_index(
        "ix_thread_checkpoints_run_id", "thread_checkpoints", ["tenant_id", sa.text("(metadata ->> 'run_id')")],
    )
    op.create_table(
        "thread_blobs",
        _TENANT.copy(),
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("checkpoint_ns", sa.String(length=500), nullable=False),
        sa.Column("channel", sa.String(length=500), nullable=False),
        sa.Column("version", sa.String(length=200), nullable=False),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        _tenant_fk("thread_blobs"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "thread_id"], ["threads.tenant_id", "threads.thread_id"],
            name=op.f("fk_thread_blobs_tenant_id_thread_id_threads"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "thread_id", "checkpoint_ns", "channel", "version", name=op.f("pk_thread_blobs")
        ),
    )
    op.create_table(
        "thread_writes",
        _TENANT.copy(),
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("checkpoint_ns", sa.String(length=500), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(length=500), nullable=False),
        sa.Column("type", sa.String(length=50), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("task_path", sa.String(length=1000), server_default=sa.text("''"), nullable=False),
        _tenant_fk("thread_writes"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "thread_id"], ["threads.tenant_id", "threads.thread_id"],
            name=op.f("fk_thread_writes_tenant_id_thread_id_threads"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx",
            name=op.f("pk_thread_writes"),
        ),
    )
    op.create_table(
        "thread_deleted_checkpoints",
        _TENANT.copy(),
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("checkpoint_id", sa.String(length=200), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        _tenant_fk("thread_deleted_checkpoints"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "thread_id"], ["threads.tenant_id", "threads.thread_id"],
            name=op.f("fk_thread_deleted_checkpoints_tenant_id_thread_id_threads"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "thread_id", "checkpoint_id", name=op.f("pk_thread_deleted_checkpoints")
        ),
    )


def downgrade() -> None:
    for table in ("thread_deleted_checkpoints", "thread_writes", "thread_blobs", "thread_checkpoints", "threads"):
        op.drop_table(table)
