"""openai compat

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

The OpenAI-compatible front door (app/openai_compat/): conversations (a session and the client's metadata),
responses (a session transition and the request's parameters; input and output are read from the transition's
artifacts), and Chat Completions heads (the digest of a message list → the session that holds it, deleted with the
reply artifact it ends on).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "openai_conversations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("meta", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], name=op.f("fk_openai_conversations_session_id_sessions"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_openai_conversations_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_openai_conversations")),
        sa.UniqueConstraint("session_id", name=op.f("uq_openai_conversations_session_id")),
    )
    op.create_index(op.f("ix_openai_conversations_tenant_id"), "openai_conversations", ["tenant_id"])
    op.create_table(
        "openai_responses",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("conversation_id", sa.String(length=40), nullable=True),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("previous_response_id", sa.String(length=40), nullable=True),
        sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("usage", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["openai_conversations.id"],
                                name=op.f("fk_openai_responses_conversation_id_openai_conversations"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], name=op.f("fk_openai_responses_session_id_sessions"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_openai_responses_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_openai_responses")),
    )
    op.create_index(op.f("ix_openai_responses_tenant_id"), "openai_responses", ["tenant_id"])
    op.create_index("ix_openai_responses_session_id_turn", "openai_responses", ["session_id", "turn"])
    op.create_table(
        "openai_chat_heads",
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("reply_artifact_id", sa.String(length=40), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["reply_artifact_id"], ["artifacts.id"],
                                name=op.f("fk_openai_chat_heads_reply_artifact_id_artifacts"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], name=op.f("fk_openai_chat_heads_session_id_sessions"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_openai_chat_heads_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_openai_chat_heads")),
        sa.UniqueConstraint("tenant_id", "digest", name=op.f("uq_openai_chat_heads_tenant_id_digest")),
    )
    op.create_index(op.f("ix_openai_chat_heads_reply_artifact_id"), "openai_chat_heads", ["reply_artifact_id"])


def downgrade() -> None:
    op.drop_table("openai_chat_heads")
    op.drop_table("openai_responses")
    op.drop_table("openai_conversations")
