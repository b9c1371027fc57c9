"""Legal holds (app/holds/, migration 0023), beside app/db/models.py on the same `Base`: the holds, their audit trail
and the subject erasures a hold deferred."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKeyConstraint, Identity, Index, String, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, created_now


class Hold(Base):
    __tablename__ = "holds"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        Index("ix_holds_standing", "tenant_id", postgresql_where=text("released_at IS NULL")),
    )

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # Exactly one of the three (a check constraint in the migration).
    subject_id: Mapped[str | None] = mapped_column(String(200))
    session_id: Mapped[str | None] = mapped_column(String(40))
    namespace: Mapped[str | None] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = created_now()
    created_by: Mapped[str | None] = mapped_column(String(40))  # the API key's id
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    released_by: Mapped[str | None] = mapped_column(String(40))


class HoldEvent(Base):
    __tablename__ = "hold_events"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "hold_id"], ["holds.tenant_id", "holds.id"], ondelete="CASCADE"),
        Index("ix_hold_events_hold", "tenant_id", "hold_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(40), nullable=False)
    hold_id: Mapped[str] = mapped_column(String(40), nullable=False)
    action: Mapped[str] = mapped_column(String(20), nullable=False)  # placed | released | deferred
    key_id: Mapped[str | None] = mapped_column(String(40))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")  # ids only


class HoldDeferral(Base):
    __tablename__ = "hold_deferrals"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "hold_id"], ["holds.tenant_id", "holds.id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    hold_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    subject_id: Mapped[str] = mapped_column(String(200), primary_key=True)
