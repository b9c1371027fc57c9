"""Forget requests, receipts and detector webhooks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.api.schemas.common import RequestModel

Strategy = Literal[
    "selective_replay", "full_reset", "delete_dependents", "no_forget", "memory_delete", "forget_instruction",
    "source_redaction", "sanitize_no_replay", "sanitized_rebuild",
]


class MemoryRef(RequestModel):
    namespace: str = Field(min_length=1, max_length=200)
    key: str = Field(min_length=1, max_length=200)


class ForgetTarget(RequestModel):
    """Exactly one target form: an artifact, a text span in a session, a memory record, or a semantic query."""

    artifact_id: str | None = Field(default=None, min_length=1, max_length=64)
    session_id: str | None = Field(default=None, min_length=1, max_length=64)
    text: str | None = Field(default=None, min_length=1, max_length=100_000)
    memory: MemoryRef | None = None
    query: str | None = Field(default=None, min_length=1, max_length=10_000)
    min_similarity: float | None = Field(default=None, ge=-1.0, le=1.0)

    @model_validator(mode="after")
    def _exactly_one(self) -> ForgetTarget:
        forms = [self.artifact_id is not None, self.text is not None, self.memory is not None, self.query is not None]
        if sum(forms) != 1:
            raise ValueError("give exactly one of artifact_id, text (with session_id), memory, query (with session_id)")
        if (self.text is not None or self.query is not None) and self.session_id is None:
            raise ValueError("text and query targets need session_id")
        if self.min_similarity is not None and self.query is None:
            raise ValueError("min_similarity applies only to a query target")
        return self


class ForgetRequest(RequestModel):
    target: ForgetTarget
    strategy: Strategy = "selective_replay"
    dry_run: bool = False
    wait: bool = False
    reason: str | None = Field(default=None, max_length=2000)


class ForgetJobOut(BaseModel):
    id: str
    status: Literal["queued", "running", "succeeded", "failed", "needs_input"]
    strategy: str
    target: dict[str, Any]
    sessions: list[dict[str, Any]] = Field(default_factory=list)
    memory: dict[str, Any] | None = None
    suppressed_side_effects: list[dict[str, Any]] = Field(default_factory=list)
    committed_side_effects: list[dict[str, Any]] = Field(default_factory=list)
    duration_ms: int | None = None
    error: str | None = None


class DetectorWebhook(RequestModel):
    session_id: str = Field(min_length=1, max_length=64)
    artifact_id: str | None = Field(default=None, min_length=1, max_length=64)
    text: str | None = Field(default=None, min_length=1, max_length=100_000)
    detector: str = Field(default="unknown", max_length=200)
    score: float | None = Field(default=None, ge=0.0, le=1.0)


class WebhookAccepted(BaseModel):
    forget_id: str
