"""The OpenAI-compatible objects' tables (app/openai_compat/, migration 0005), beside app/db/models.py on the same
`Base`. They hold ids, the client's parameters and usage; the items themselves are the sessions' artifacts, read by
reference, so what a forget erases there leaves nothing here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, Integer, LargeBinary, String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, created_now


class OpenAIConversation(Base):
    """An OpenAI-compatible conversation (app/openai_compat/): one session, plus the client's metadata. Its items
    are the session's artifacts, read by reference, so a forget leaves nothing of an item here."""

    __tablename__ = "openai_conversations"
    __table_args__ = (
        # Migration 0021: the metadata in at most one form, a sealed row names its leaf.
        CheckConstraint("meta_sealed IS NULL OR (meta IS NULL)", name="one_form"),
        CheckConstraint("(meta_sealed IS NULL) = (leaf IS NULL)", name="sealed_with_leaf"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True)
    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False, unique=True
    )
    # Plaintext of rows from before migration 0021; a new row holds the client's metadata only in `meta_sealed`, under
    # its own leaf (app/openai_compat/repository.py opens it into `meta`, never flushed back).
    meta: Mapped[dict[str, Any]] = mapped_column(JSONB(none_as_null=True), nullable=True)
    meta_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = created_now()


class OpenAIResponse(Base):
    """An OpenAI-compatible response: which session transition it was, and the request's parameters. Its input and
    output are that transition's artifacts, read by reference (ids only here), so a forget rewrites them too."""

    __tablename__ = "openai_responses"
    __table_args__ = (
        Index("ix_openai_responses_session_id_turn", "session_id", "turn"),
        # Migration 0021: the parameters in at most one form, a sealed row names its leaf.
        CheckConstraint("params_sealed IS NULL OR (params IS NULL)", name="one_form"),
        CheckConstraint("(params_sealed IS NULL) = (leaf IS NULL)", name="sealed_with_leaf"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    conversation_id: Mapped[str | None] = mapped_column(
        ForeignKey("openai_conversations.id", ondelete="CASCADE")
    )
    turn: Mapped[int] = mapped_column(Integer, nullable=False)
    previous_response_id: Mapped[str | None] = mapped_column(String(40))
    # model, temperature, top_p, max_output_tokens, tools, metadata (what the client sent; no item text).
    # Plaintext of rows from before migration 0021; a new row holds them only in `params_sealed`, under its own leaf
    # (tools and metadata are the client's strings; opened into `params` by the repository, never flushed back).
    params: Mapped[dict[str, Any]] = mapped_column(JSONB(none_as_null=True), nullable=True)
    params_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)
    usage: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    created_at: Mapped[datetime] = created_now()


class OpenAIChatHead(Base):
    """Chat Completions reuse: the digest of the message list a client will resend (its history plus the answer it
    got) → the session holding that history. The row dies with the reply artifact it ends on (a forget that rewrites
    the history deletes that artifact), so no digest of a forgotten message outlives the forget."""

    __tablename__ = "openai_chat_heads"
    __table_args__ = (UniqueConstraint("tenant_id", "digest"),)

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    digest: Mapped[str] = mapped_column(String(64), nullable=False)
    reply_artifact_id: Mapped[str] = mapped_column(
        ForeignKey("artifacts.id", ondelete="CASCADE"), nullable=False, index=True
    )
    turn: Mapped[int] = mapped_column(Integer, nullable=False)
    epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = created_now()
