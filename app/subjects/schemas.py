"""The subjects routes' shapes (docs/API.md, "Data subjects")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.forget.locate import DEFAULT_MIN_SIMILARITY
from app.memory.schemas import NAMESPACE_PATTERN
from app.request_model import RequestModel

MAX_NAMESPACES = 100
MAX_LISTED = 100
MAX_ALSO = 20
MAX_QUERY = 10_000
Namespace = Annotated[str, Field(min_length=1, max_length=200, pattern=NAMESPACE_PATTERN)]


class SubjectPut(RequestModel):
    memory_namespaces: list[Namespace] = Field(
        max_length=MAX_NAMESPACES,
        description="Exactly the memory namespaces that are this subject's (replaces the list; [] unlinks all)",
    )


class SubjectOut(BaseModel):
    id: str
    memory_namespaces: list[str]
    sessions: int = Field(description="How many sessions name this subject")
    session_ids: list[str] = Field(description=f"The first {MAX_LISTED}, oldest first")
    conversation_ids: list[str] = Field(description=f"OpenAI conversations among those {MAX_LISTED} sessions")
    created_at: datetime
    erased_at: datetime | None = None
    erase_forget_id: str | None = None
    holds: list[dict[str, Any]] = Field(
        default_factory=list,
        description=f"Standing legal holds over the subject or a part of theirs, the first {MAX_LISTED}: `{{id, "
        "subject_id | session_id | namespace, reason, created_at}}`")


def _also_schema(schema: dict[str, Any]) -> None:
    """SubjectAlso's validator in the JSON Schema: `text` or `query` (or both), and `min_similarity` only with
    `query`."""
    schema["anyOf"] = [
        {"required": [given], "properties": {given: {"type": kind}}} for given, kind in (("text", "array"),
                                                                                        ("query", "string"))
    ]
    schema["if"] = {"required": ["min_similarity"], "properties": {"min_similarity": {"type": "number"}}}
    schema["then"] = {"required": ["query"], "properties": {"query": {"type": "string"}}}


class SubjectAlso(RequestModel):
    """What the subject left in other subjects' sessions (and in sessions of no one's): `text`, `query` or both."""

    model_config = ConfigDict(json_schema_extra=_also_schema)

    text: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(
        default=None, min_length=1, max_length=MAX_ALSO,
        description="What they said that entered other subjects' sessions: each session whose user messages, "
        "documents or tool results hold one of these is forgotten of it by selective replay",
    )
    query: str | None = Field(
        default=None, min_length=1, max_length=MAX_QUERY,  # as a forget's query target (app/forget/schemas.py)
        description="A semantic predicate: each session with an observation at least `min_similarity` similar to it "
        "gets a query forget (every observation that similar dropped, by selective replay)",
    )
    min_similarity: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description=f"Cosine similarity an observation needs to match `query` (default {DEFAULT_MIN_SIMILARITY}); "
        "only with `query`",
    )

    @model_validator(mode="after")
    def _text_or_query(self) -> SubjectAlso:
        if self.text is None and self.query is None:
            raise ValueError("give text, query or both")
        if self.min_similarity is not None and self.query is None:
            raise ValueError("min_similarity applies only with query")
        return self


class SubjectErase(RequestModel):
    dry_run: bool = Field(default=False, description="Answer what would be erased; change nothing")
    wait: bool = Field(default=True, description="Answer once the erasure's job ended (200), or as it stands after "
                       "LETHE_FORGET_WAIT_S (202); false: answer at once (202)")
    also: SubjectAlso | None = None
    reason: str | None = Field(
        default=None, max_length=2000,  # as a forget's (tests/foundation/test_hardening_input.py: one limit a name)
        description="Why (accepted, not kept: a reason can name what is erased; the receipt carries ids and counts)",
    )


class SubjectErasePlan(BaseModel):
    subject_id: str
    dry_run: bool = True
    sessions: list[str] = Field(description="Sessions that would be erased whole (a conversation's among them)")
    conversations: list[str]
    namespaces: list[str]
    memory_keys: int = Field(description="Live memory keys that would be tombstoned, each with its cascade")
    also: list[str] = Field(
        default_factory=list, description="Other subjects' sessions `also.text` or `also.query` would reach",
    )
    held: list[dict[str, str]] = Field(
        default_factory=list,
        description="`{hold_id, session_id}` or `{hold_id, namespace}`: what a standing legal hold keeps out (the "
        "erasure skips it and is deferred on the hold)",
    )
