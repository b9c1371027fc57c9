"""tools and environments

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Session tools: per-transition snapshots of the built-in tool environment (so a replay restores the state a tool saw),
the ledger of consequential tool calls that fired (at most once, ever: a replay never fires one again; the ledger
keeps a digest of the arguments, never their text), the sources a session's sink policy flags (information-flow
control), and a GIN index on artifacts.source_ids for the first-entry lookup of a forget.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "env_snapshots",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("state", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_env_snapshots_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_env_snapshots")),
        sa.UniqueConstraint("session_id", "turn", name=op.f("uq_env_snapshots_session_id_turn")),
    )
    op.create_table(
        "tool_executions",
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("call_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("arguments_sha256", sa.String(length=64), nullable=False),
        sa.Column("executed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_tool_executions_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("session_id", "call_id", name=op.f("pk_tool_executions")),
    )
    op.add_column(
        "sessions",
        sa.Column(
            "flagged_sources", postgresql.ARRAY(sa.String(length=40)), server_default="{}", nullable=False
        ),
    )
    op.create_index(
        "ix_artifacts_source_ids", "artifacts", ["source_ids"], unique=False, postgresql_using="gin"
    )


def downgrade() -> None:
    op.drop_index("ix_artifacts_source_ids", table_name="artifacts", postgresql_using="gin")
    op.drop_column("sessions", "flagged_sources")
    op.drop_table("tool_executions")
    op.drop_table("env_snapshots")
