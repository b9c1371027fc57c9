"""Shared schema pieces."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RequestModel(BaseModel):
    """Unknown fields are rejected (422): a misspelt option must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class ProblemDetails(BaseModel):
    """application/problem+json (RFC 9457); extra members vary by problem type."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
