"""Shared schema pieces (request bodies derive from app/request_model.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ProblemDetails(BaseModel):
    """application/problem+json (RFC 9457); extra members vary by problem type."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
