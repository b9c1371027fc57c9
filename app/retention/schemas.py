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
        "(a subject's null defers to the tenant's; a namespace linked to a subject takes the subject's)")


class RetentionPolicyOut(BaseModel):
    subject_id: str | None = Field(description="null: the tenant's default")
    sessions_max_idle_days: int | None
    memory_max_age_days: int | None
    updated_at: datetime


class RetentionOut(BaseModel):
    sessions_max_idle_days: int | None = Field(description="The tenant's default")
    memory_max_age_days: int | None = Field(description="The tenant's default")
    subjects: list[RetentionPolicyOut] = Field(description=f"Subjects' overrides, the first {MAX_LISTED} by id")
    next_sweep_at: datetime | None = Field(description="When a worker sweeps next (null: no policy yet)")
    last_sweep_forget_id: str | None = Field(
        description="The receipt of the last sweep that erased or kept something (a forget job, strategy `retention`)")
