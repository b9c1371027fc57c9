"""The LangGraph thread tables (app/threads/, migration 0012), beside app/db/models.py on the same `Base`.

The server stores what a LangGraph saver serializes without reading it: checkpoints, channel values (`blob`) and
pending writes are the saver's serde bytes, `type` naming their encoding. It reads only the metadata (list filters,
`run_id`) and each checkpoint's channel versions (which blobs make its channel values). Every row belongs to one
tenant; thread ids are the tenant's own names.

Since migration 0020 the content is sealed at rest (app/threads/repositories/sealing.py): `checkpoint` and `blob`
hold the envelope when `leaf` is set (the saver's bytes when NULL: a row from before 0020), the metadata is in
`metadata_sealed` (`metadata` only on such older rows), and `run_id` is the metadata's, in the clear.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    String,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base


def _thread_fk() -> ForeignKeyConstraint:
    return ForeignKeyConstraint(["tenant_id", "thread_id"], ["threads.tenant_id", "threads.thread_id"],
                                ondelete="CASCADE")


def _sealed_under_leaf(column: str) -> CheckConstraint:
    """Migration 0020: a row with a leaf holds that leaf's envelope (format 1, the leaf big-endian) in `column`."""
    return CheckConstraint(
        f"leaf IS NULL OR substring({column} FROM 1 FOR 9) = (CAST('\\x01' AS bytea) || int8send(leaf))",
        name="sealed_under_leaf",
    )


def _tenant() -> Mapped[str]:
    return mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)


class Thread(Base):
    """One row per thread id a tenant ever wrote, kept after a delete: every write of the thread locks it first."""

    __tablename__ = "threads"

    tenant_id: Mapped[str] = _tenant()
    thread_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    # Bumped by every write: a rewrite (forget_message) based on an older revision is refused.
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    # Bumped by every rewrite: a writer whose base was read before it is refused.
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=text("now()"))


class ThreadCheckpoint(Base):
    __tablename__ = "thread_checkpoints"
    __table_args__ = (
        _thread_fk(), Index("ix_thread_checkpoints_run_id", "tenant_id", text("(metadata ->> 'run_id')")),
        Index("ix_thread_checkpoints_run", "tenant_id", "run_id"),
        # The tenant's checkpoints newest first across threads (LangGraph's list(None)), migration 0027.
        Index("ix_thread_checkpoints_listing", "tenant_id", "checkpoint_id", "thread_id", "checkpoint_ns"),
        _sealed_under_leaf("checkpoint"),
        CheckConstraint(
            "(metadata IS NULL) <> (metadata_sealed IS NULL) AND (metadata_sealed IS NULL) = (leaf IS NULL)",
            name="one_metadata",
        ),
    )

    tenant_id: Mapped[str] = _tenant()
    thread_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(500), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    parent_id: Mapped[str | None] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(50), nullable=False)
    checkpoint: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB)  # rows from before 0020 only
    versions: Mapped[dict[str, str]] = mapped_column(JSONB, nullable=False)
    # The thread's generation when stored: a writer building on it without naming a generation read it then.
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False)
    metadata_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)  # the checkpoint's and its metadata's
    run_id: Mapped[str | None] = mapped_column(String(200))  # the metadata's, for delete_for_runs


class ThreadBlob(Base):
    """One channel's value at one version, shared by every checkpoint of the namespace at that version."""

    __tablename__ = "thread_blobs"
    __table_args__ = (_thread_fk(), _sealed_under_leaf("blob"))

    tenant_id: Mapped[str] = _tenant()
    thread_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(500), primary_key=True)
    channel: Mapped[str] = mapped_column(String(500), primary_key=True)
    version: Mapped[str] = mapped_column(String(200), primary_key=True)
    type: Mapped[str] = mapped_column(String(50), nullable=False)
    blob: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    leaf: Mapped[int | None] = mapped_column(BigInteger)


class ThreadWrite(Base):
    __tablename__ = "thread_writes"
    __table_args__ = (_thread_fk(), _sealed_under_leaf("blob"))

    tenant_id: Mapped[str] = _tenant()
    thread_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(500), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    channel: Mapped[str] = mapped_column(String(500), nullable=False)
    type: Mapped[str] = mapped_column(String(50), nullable=False)
    blob: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    task_path: Mapped[str] = mapped_column(String(1000), nullable=False, server_default=text("''"))
    leaf: Mapped[int | None] = mapped_column(BigInteger)


class ThreadDeletedCheckpoint(Base):
    """A checkpoint id a delete removed: nothing is stored under it or on top of it again (langgraph#7206)."""

    __tablename__ = "thread_deleted_checkpoints"
    __table_args__ = (_thread_fk(),)

    tenant_id: Mapped[str] = _tenant()
    thread_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    deleted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=text("now()"))


class ThreadPendingShred(Base):
    """Leaves a thread route removed, waiting to be shredded (migration 0020): written in the removal's transaction,
    deleted once the key provider punctured them; the forget worker's sweep retries what is left."""

    __tablename__ = "thread_pending_shreds"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    leaves: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
