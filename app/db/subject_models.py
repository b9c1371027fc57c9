"""Data subjects (app/subjects/, migration 0022): the people data is about, per tenant, beside app/db/models.py on
the same `Base`. A subject row holds ids only: the caller's id for the person, the memory namespaces linked to them,
and, once erased, when and by which forget job. Sessions name their subject (`sessions.subject_id`); what a subject
owns is found from there, never copied here.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Index, Integer, String, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, created_now


class Subject(Base):
    __tablename__ = "subjects"
    # Migration 0023: which subjects link a namespace (`memory_namespaces @> ARRAY[ns]`), a probe, not a scan.
    __table_args__ = (Index("ix_subjects_namespaces", "memory_namespaces", postgresql_using="gin"),)

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    memory_namespaces: Mapped[list[str]] = mapped_column(
        ARRAY(String(200)), nullable=False, default=list, server_default="{}"
    )
    created_at: Mapped[datetime] = created_now()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now(), onupdate=func.now()
    )
    erased_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    erase_forget_id: Mapped[str | None] = mapped_column(String(40))


class RetentionPolicy(Base):
    """A tenant's retention limits (`subject_id` ''), or one subject's override (migration 0024). NULL: no limit
    (an override's NULL defers to the tenant's)."""

    __tablename__ = "retention_policies"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    subject_id: Mapped[str] = mapped_column(String(200), primary_key=True, server_default="")
    sessions_max_idle_days: Mapped[int | None] = mapped_column(Integer)
    memory_max_age_days: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class RetentionNamespace(Base):
    """One memory namespace's own `memory_max_age_days` (migration 0026): for its keys it wins over the overrides of
    the subjects it is linked to, and over the tenant's. NULL defers to those."""

    __tablename__ = "retention_namespaces"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(200), primary_key=True)
    memory_max_age_days: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class RetentionSweep(Base):
    """When a tenant's next retention sweep is due, and the process holding it (a lease)."""

    __tablename__ = "retention_sweeps"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    next_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    lease_owner: Mapped[str | None] = mapped_column(String(80))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_forget_id: Mapped[str | None] = mapped_column(String(40))
