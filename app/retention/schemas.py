"""The retention routes' shapes (docs/API.md, "Data subjects")."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from app.request_model import RequestModel

MAX_DAYS = 36_500  # a hundred years: past that, say null (keep forever)
MAX_LISTED = 100


class RetentionPut(RequestModel):
    sessions_max_idle_days: int | None = Field(
        default=None, ge=1, le=MAX_DAYS,
        description="A session idle (no turn, forget or change) this many days is erased whole; null: kept "
        "(a subject's null defers to the tenant's)")
    memory_max_age_days: int | None = Field(
        default=None, ge=1, le=MAX_DAYS,
        description="A memory key last written this many days ago is forgotten (tombstone and cascade); null: kept "
        "(a subject's null defers to the tenant's; a namespace linked to a subject takes the subject's, unless it has "
        "an override of its own)")


class NamespaceRetentionPut(RequestModel):
    """A namespace holds no sessions: its override has the memory limit only (`sessions_max_idle_days` is refused)."""

    memory_max_age_days: int | None = Field(
        default=None, ge=1, le=MAX_DAYS,
        description="A key of this namespace last written this many days ago is forgotten; it wins over the overrides "
        "of the subjects the namespace is linked to and over the tenant's; null defers to those")


class RetentionPolicyOut(BaseModel):
    subject_id: str | None = Field(description="null: the tenant's default")
    sessions_max_idle_days: int | None
    memory_max_age_days: int | None
    updated_at: datetime


class RetentionNamespaceOut(BaseModel):
    namespace: str
    memory_max_age_days: int | None
    updated_at: datetime


class RetentionOut(BaseModel):
    sessions_max_idle_days: int | None = Field(description="The tenant's default")
    memory_max_age_days: int | None = Field(description="The tenant's default")
    subjects: list[RetentionPolicyOut] = Field(description=f"Subjects' overrides, the first {MAX_LISTED} by id")
    namespaces: list[RetentionNamespaceOut] = Field(
        description=f"Memory namespaces' own overrides, the first {MAX_LISTED} by name")
    next_sweep_at: datetime | None = Field(description="When a worker sweeps next (null: no policy yet)")
    last_sweep_forget_id: str | None = Field(
        description="The receipt of the last sweep that erased or kept something (a forget job, strategy `retention`)")
