"""The memory tables (app/memory/), beside app/db/models.py on the same `Base`: each key's head row and its history.

A record's value is sealed at rest since migration 0016 (app/memory/repositories/sealing.py): `value_sealed` under the
record incarnation's `leaf`; `value` holds only rows written before it, until the online migration seals them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    LargeBinary,
    String,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, created_now


class MemoryRecord(Base):
    """The head of one memory key: its newest version, which may be a tombstone (value NULL, forgotten true)."""

    __tablename__ = "memory_records"
    __table_args__ = (
        CheckConstraint("version > 0", name="version_positive"),
        CheckConstraint(
            "NOT forgotten OR (value IS NULL AND value_sealed IS NULL AND leaf IS NULL)", name="tombstone_has_no_value"
        ),
        CheckConstraint("value IS NULL OR value_sealed IS NULL", name="one_value"),
        CheckConstraint("(value_sealed IS NULL) = (leaf IS NULL)", name="sealed_with_leaf"),
        CheckConstraint("(ttl_s IS NULL) = (expires_at IS NULL)", name="expiry_with_ttl"),
        Index(
            "ix_memory_records_expires_at", "expires_at",
            postgresql_where=text("expires_at IS NOT NULL AND NOT forgotten"),
        ),
        # A tenant's live namespaces in byte order: a search under a prefix scans its range (migration 0028).
        Index(
            "ix_memory_records_live_namespaces", "tenant_id", text("namespace text_pattern_ops"),
            postgresql_where=text("NOT forgotten"),
        ),
    )

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(200), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    # Plaintext of rows written before migration 0016 (the online migration seals them); new rows: `value_sealed`,
    # the value's JSON sealed under `leaf`, its incarnation's (app/memory/repositories/sealing.py).
    value: Mapped[Any | None] = mapped_column(JSONB)
    value_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)
    forgotten: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    source: Mapped[str] = mapped_column(String(100), nullable=False)
    # Where a value written back by a session came from: {"session_id", "artifact_id"} (None: written by a client).
    provenance: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    updated_at: Mapped[datetime] = created_now()
    # Time to live (migration 0013): the lifetime a write or a refreshing read restarts, and when it runs out.
    ttl_s: Mapped[float | None] = mapped_column(Float)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_now()  # when the key's current life began (after its last tombstone)


class MemoryVersion(Base):
    """History: one row per version. A forget nulls the value of every earlier version (no value, no hash)."""

    __tablename__ = "memory_versions"
    __table_args__ = (
        CheckConstraint("op IN ('write', 'forget')", name="op"),
        CheckConstraint("value IS NULL OR value_sealed IS NULL", name="one_value"),
        CheckConstraint("value_sealed IS NULL OR leaf IS NOT NULL", name="sealed_with_leaf"),
        ForeignKeyConstraint(
            ["tenant_id", "namespace", "key"],
            ["memory_records.tenant_id", "memory_records.namespace", "memory_records.key"],
            ondelete="CASCADE",
        ),
    )

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(200), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    op: Mapped[str] = mapped_column(String(10), nullable=False)
    value: Mapped[Any | None] = mapped_column(JSONB)  # as in MemoryRecord
    value_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    leaf: Mapped[int | None] = mapped_column(BigInteger)  # kept after a forget erased the value: a number, no content
    source: Mapped[str] = mapped_column(String(100), nullable=False)
    at: Mapped[datetime] = created_now()
