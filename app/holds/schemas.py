"""The holds routes' shapes (docs/API.md, "Legal holds")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.ids import SUBJECT_ID_PATTERN
from app.memory.schemas import NAMESPACE_PATTERN
from app.request_model import RequestModel

SCOPES = ("subject_id", "session_id", "namespace")
MAX_LISTED = 100


def _one_scope(schema: dict[str, Any]) -> None:
    """The validator's rule in the JSON Schema (exactly one scope, the others absent or null)."""
    schema["oneOf"] = [
        {"type": "object", "required": [given],
         "properties": {given: {"type": "string"}, **{other: {"type": "null"} for other in SCOPES if other != given}}}
        for given in SCOPES
    ]


class HoldCreate(RequestModel):
    model_config = ConfigDict(json_schema_extra=_one_scope)

    subject_id: Annotated[str, Field(min_length=1, max_length=200, pattern=SUBJECT_ID_PATTERN)] | None = Field(
        default=None, description="Hold everything of this subject (made if new: a hold may come before the data)")
    session_id: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="Hold one session (and the OpenAI conversation it is)")
    namespace: Annotated[str, Field(min_length=1, max_length=200, pattern=NAMESPACE_PATTERN)] | None = Field(
        default=None, description="Hold every key of one memory namespace")
    reason: str = Field(min_length=1, max_length=2000,
                        description="Why (kept, in the clear: the hold is the record that must survive erasure)")

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if sum(v is not None for v in (self.subject_id, self.session_id, self.namespace)) != 1:
            raise ValueError("give exactly one of subject_id, session_id and namespace")
        return self


class HoldEventOut(BaseModel):
    action: str = Field(description="`placed`, `released`, `deferred` (a subject's erasure skipped what the hold "
                                    "covers, or a forget job reached a session it covers; its release runs it "
                                    "again) or `skipped` (a retention sweep did)")
    key_id: str | None = Field(description="The API key that did it (none for what Lethe did itself)")
    at: datetime
    detail: dict[str, Any] = Field(description="Ids only: for `deferred`, the forget job with the subject it erases "
                                   "or the session it reached")


class HoldOut(BaseModel):
    id: str
    subject_id: str | None = None
    session_id: str | None = None
    namespace: str | None = None
    reason: str
    created_at: datetime
    created_by: str | None
    released_at: datetime | None = None
    released_by: str | None = None
    deferred: list[str] = Field(default_factory=list,
                                description="Subjects whose erasure skipped what this hold covers, run on release")
    jobs: list[str] = Field(default_factory=list,
                            description=f"Forget jobs waiting on this hold (status `held`: they reached a session it "
                            f"covers), the first {MAX_LISTED}, oldest first; queued again on release")
    events: list[HoldEventOut] = Field(default_factory=list, description="The audit trail, oldest first")
    erasures: list[str] = Field(default_factory=list,
                                description="On release: the forget jobs it queued again and those of the deferred "
                                "erasures it ran")
