"""The relational model. Alembic migrations in `migrations/` create exactly this; a test fails when they drift.

Every row that a client can name belongs to one tenant, and every lookup filters on it: another tenant's id is
indistinguishable from an unknown one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

EMBEDDING_DIM = 384

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def created_now() -> Mapped[datetime]:
    """A creation time the database stamps (`now()` at insert)."""
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False, unique=True)
    # Needed in the clear to verify HMAC signatures; never logged, never returned by the API.
    webhook_secret: Mapped[str | None] = mapped_column(Text)
    # The first leaf of its key tree no process has reserved (migration 0015, app/keys/leaves.py).
    next_leaf: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    created_at: Mapped[datetime] = created_now()

    __table_args__ = (CheckConstraint("next_leaf >= 0", name="next_leaf_not_negative"),)


class KeyStore(Base):
    """The key store this database's content is sealed with (migration 0018, app/keys/identity.py): one row."""

    __tablename__ = "key_store"

    one: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    identity: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (CheckConstraint("one", name="one_row"),)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True)
    # SHA-256 of the key: keys are 32 random bytes, so a fast hash is enough and lookups stay one index probe.
    key_sha256: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    label: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = created_now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AgentSession(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        CheckConstraint("context_policy IN ('full', 'retrieval')", name="context_policy"),
        CheckConstraint("status IN ('idle', 'running', 'forgetting')", name="status"),
        CheckConstraint(
            "checkpoint_policy IN ('every_turn', 'before_injections', 'session_start')", name="checkpoint_policy"
        ),
        UniqueConstraint("tenant_id", "id"),
        Index("ix_sessions_subject", "tenant_id", "subject_id", postgresql_where=text("subject_id IS NOT NULL")),
        # Migration 0021: the settings in at most one form, a sealed row names its leaf.
        CheckConstraint("settings_sealed IS NULL OR (system_prompt IS NULL AND tools IS NULL)", name="one_form"),
        CheckConstraint("(settings_sealed IS NULL) = (leaf IS NULL)", name="sealed_with_leaf"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True)
    epoch: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # The generation of the session's engine cache salt (app/runtime/salts.py): bumped by a forget whose rebuilt log
    # an extension could take back to the forgotten blocks, so no request reaches them again.
    cache_generation: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    # What holds the session's lease (app/sessions/locking.py): `running` (a turn, a compaction, a delete) or
    # `forgetting`; it reads `idle` once the lease is released or expired (sessions_repo.live_status).
    status: Mapped[str] = mapped_column(String(20), nullable=False, default="idle")
    lease_owner: Mapped[str | None] = mapped_column(String(80))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Plaintext of rows written before migration 0021; new rows hold the system prompt and the tool specs only in
    # `settings_sealed`, under `leaf`, the session's own (app/sessions/repositories/settings_sealing.py). The
    # repositories open them into `system_prompt` and `tools` of the objects they return (never flushed back).
    system_prompt: Mapped[str | None] = mapped_column(Text)
    memory_namespace: Mapped[str | None] = mapped_column(String(200))
    # The data subject the session is about (app/subjects/): what their erasure erases and their export exports.
    subject_id: Mapped[str | None] = mapped_column(String(200))
    context_policy: Mapped[str] = mapped_column(String(20), nullable=False, default="full")
    checkpoint_policy: Mapped[str] = mapped_column(String(30), nullable=False, default="every_turn")
    retrieval: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    tools: Mapped[list[Any]] = mapped_column(JSONB(none_as_null=True), nullable=True)
    sampling: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    # Automatic compaction: {"max_tokens", "keep_last_turns", "write_back"} ({}: only on request).
    compaction: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict, server_default="{}")
    # Sources whose derivations a sink policy keeps out of tool arguments (information-flow control, B8/B9).
    flagged_sources: Mapped[list[str]] = mapped_column(
        ARRAY(String(40)), nullable=False, default=list, server_default="{}"
    )
    turns: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    token_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    settings_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)  # {"system_prompt", "tools"} as JSON
    leaf: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = created_now()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), onupdate=func.now()
    )


class Artifact(Base):
    """One block of a session's prompt: its tokens tile the prompt, so a checkpoint is just a token offset."""

    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint("session_id", "position"),
        CheckConstraint("token_start >= 0 AND token_end >= token_start", name="token_span"),
        # Migration 0017: text in exactly one form, tokens and embedding in at most one, a sealed row names its leaf.
        CheckConstraint("(content IS NULL) <> (content_sealed IS NULL)", name="one_content"),
        CheckConstraint("token_ids IS NULL OR token_ids_sealed IS NULL", name="one_token_ids"),
        CheckConstraint("embedding IS NULL OR embedding_sealed IS NULL", name="one_embedding"),
        CheckConstraint("(content_sealed IS NULL) = (leaf IS NULL)", name="sealed_with_leaf"),
        CheckConstraint("meta_sealed IS NULL OR leaf IS NOT NULL", name="meta_with_leaf"),  # migration 0021
        Index("ix_artifacts_session_id_turn", "session_id", "turn"),
        Index("ix_artifacts_source_ids", "source_ids", postgresql_using="gin"),
        # which sessions a memory record reached: asked by every memory forget (app/forget/cascade.py)
        Index(
            "ix_artifacts_memory_record", "tenant_id", text("(meta ->> 'namespace')"), text("(meta ->> 'key')"),
            postgresql_where=text("kind = 'memory'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    position: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(20), nullable=False)
    turn: Mapped[int] = mapped_column(Integer, nullable=False)
    # Plaintext of rows written before migration 0017 (the online migration seals them); new rows hold their text,
    # tokens and embedding only in the `*_sealed` columns, under `leaf`, the artifact's own
    # (app/sessions/repositories/sealing.py). The repositories open them into `content` and `token_ids` of the
    # objects they return (never flushed back): everything above them sees plaintext, hence the non-optional types.
    content: Mapped[str] = mapped_column(Text, nullable=True)
    token_start: Mapped[int] = mapped_column(Integer, nullable=False)
    token_end: Mapped[int] = mapped_column(Integer, nullable=False)
    token_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer), nullable=True)
    source_ids: Mapped[list[str]] = mapped_column(ARRAY(String(40)), nullable=False, default=list)
    committed: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    meta: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    # The compaction transition that took this artifact out of the live prompt (kept: a forget may replay it).
    archived_by: Mapped[int | None] = mapped_column(Integer)
    embedding: Mapped[list[float] | None] = mapped_column(Vector(EMBEDDING_DIM))
    content_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    token_ids_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)  # little-endian int32
    embedding_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)  # little-endian float32
    # Migration 0021: the members of `meta` a client wrote (a document's `source`), sealed under `leaf`; opened back
    # into `meta` by the repositories.
    meta_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = created_now()
    # Not a column: set by the repository that opened the row when its leaf was shredded (no text, no tokens).
    erased = False


class ProvenanceEdge(Base):
    """`parent` was in the context of the model call that produced `child`."""

    __tablename__ = "provenance_edges"
    __table_args__ = (Index("ix_provenance_edges_session_id_child_id", "session_id", "child_id"),)

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    parent_id: Mapped[str] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True)
    child_id: Mapped[str] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True)
    turn: Mapped[int] = mapped_column(Integer, nullable=False)


class Checkpoint(Base):
    """Metadata only: restoring one is a crop of the cache to `token_offset`, never a tensor copy."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("session_id", "turn"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    turn: Mapped[int] = mapped_column(Integer, nullable=False)
    token_offset: Mapped[int] = mapped_column(Integer, nullable=False)
    env_snapshot_id: Mapped[str | None] = mapped_column(String(40))
    manifest_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    created_at: Mapped[datetime] = created_now()


class EnvSnapshot(Base):
    """The built-in tool environment's state at the end of a transition that changed it."""

    __tablename__ = "env_snapshots"
    __table_args__ = (
        UniqueConstraint("session_id", "turn"),
        # Migration 0021: the state in at most one form, a sealed row names its leaf.
        CheckConstraint("state_sealed IS NULL OR (state IS NULL)", name="one_form"),
        CheckConstraint("(state_sealed IS NULL) = (leaf IS NULL)", name="sealed_with_leaf"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False)
    turn: Mapped[int] = mapped_column(Integer, nullable=False)
    # Plaintext of snapshots from before migration 0021; a new one is sealed under its own leaf in `state_sealed`,
    # bound to its tenant (app/sessions/repositories/settings_sealing.py), and opened by the repository that reads it.
    state: Mapped[dict[str, Any]] = mapped_column(JSONB(none_as_null=True), nullable=True)
    tenant_id: Mapped[str | None] = mapped_column(String(40))  # NULL on snapshots from before migration 0021
    state_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = created_now()


class ToolExecution(Base):
    """A consequential tool call that fired. Never deleted by a forget: it happened; a replay reuses its result
    instead of firing it again. A digest of the arguments only, so no forgotten text can hide here."""

    __tablename__ = "tool_executions"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    arguments_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    executed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class ForgetJob(Base):
    __tablename__ = "forget_jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('planned', 'queued', 'running', 'succeeded', 'failed', 'needs_input', 'held')", name="status"
        ),
        CheckConstraint("priority IN (1, 2)", name="priority"),
        # Migration 0019: the reason in at most one form, a sealed row names its leaf.
        CheckConstraint("reason IS NULL OR reason_sealed IS NULL", name="one_reason"),
        CheckConstraint(
            "(target_sealed IS NULL AND reason_sealed IS NULL AND receipt_sealed IS NULL) OR leaf IS NOT NULL",
            name="sealed_with_leaf",
        ),
        Index("ix_forget_jobs_status_created_at", "status", "created_at"),
        Index(
            "ix_forget_jobs_pending_shred", "created_at",
            postgresql_where=text("shred_leaves IS NOT NULL AND shredded_at IS NULL"),
        ),
        Index("ix_forget_jobs_held_by", "tenant_id", "held_by", postgresql_where=text("held_by IS NOT NULL")),
        UniqueConstraint("tenant_id", "idempotency_key"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True)
    status: Mapped[str] = mapped_column(String(20), nullable=False, default="queued")
    strategy: Mapped[str] = mapped_column(String(40), nullable=False)
    # The target as submitted, scrubbed of the forgotten words once the job ends (rows before migration 0019); since
    # 0019 only its id-only form (app/forget/repositories/sealing.py), the whole target sealed in `target_sealed`.
    target: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)  # rows before 0019; then `reason_sealed`
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    receipt: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A job sent back (its session was busy) is not claimed again before this: it waits here, not in a worker.
    run_after: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # How urgent its engine work is (app/engine/priority.py): 1 a forget, 2 a detector webhook's (a suspected
    # injection). Its replay runs above live turns, and workers claim the most urgent job first.
    priority: Mapped[int] = mapped_column(SmallInteger, nullable=False, default=1, server_default=text("1"))
    # Erasure at rest (migration 0016): the leaves the job's forget erased (None: it erased no sealed content), and
    # when they were punctured in the key provider (None: pending, the forget worker retries).
    shred_leaves: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    shredded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Migration 0019: the target and reason sealed under the job's own leaf (None: nothing of them is content, or a
    # row from before), which joins `shred_leaves` when the job ends; the ciphertexts are dropped then too.
    target_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    reason_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    # The receipt's content while the job waits on its client (the tool results given, the call waited on).
    receipt_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)
    held_by: Mapped[str | None] = mapped_column(String(40))  # 0025: the legal hold a `held` job waits on
    shred_now: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=text("false"))
    created_at: Mapped[datetime] = created_now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Not a column: set by the repository that opened the row when its sealed target and reason are gone (the job
    # ended, or its leaf was shredded): `target` then holds the id-only form and `reason` None.
    target_erased = False


class WebhookDelivery(Base):
    """Standard Webhooks redelivery dedup: the same `webhook-id` answers the forget job it started first."""

    __tablename__ = "webhook_deliveries"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    forget_id: Mapped[str | None] = mapped_column(ForeignKey("forget_jobs.id", ondelete="SET NULL"))
    received_at: Mapped[datetime] = created_now()
