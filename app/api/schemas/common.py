"""Shared schema pieces."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import PydanticCustomError

from app.text import REASON, unstorable_path


def unstorable_error(path: str) -> PydanticCustomError:
    where = f" (at {path.lstrip('.')})" if path else ""
    return PydanticCustomError("unstorable_text", "text {reason}{where}", {"reason": REASON, "where": where})


class RequestModel(BaseModel):
    """Unknown fields are rejected (422): a misspelt option must not be silently ignored.

    Every field of every request body, nested lists and objects included, is checked for text PostgreSQL cannot
    store (app/text.py): a NUL or an unpaired surrogate answers 422 with the field's `loc`, never a 500 from the
    database. One validator here instead of one per field, so a field added later is covered too."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        path = unstorable_path(value)
        if path is not None:
            raise unstorable_error(path)
        return value


class ProblemDetails(BaseModel):
    """application/problem+json (RFC 9457); extra members vary by problem type."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
