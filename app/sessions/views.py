"""What the session service takes and returns: plain values over the stored rows, no behaviour."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.db.models import AgentSession, Artifact
from app.errors import Conflict
from app.runtime.engine_calls import Usage
from app.sessions.repositories.artifacts import Retired
from app.tool_calls import ToolCall


@dataclass(frozen=True)
class SessionConfig:
    system_prompt: str | None = None
    memory_namespace: str | None = None
    context_policy: str = "full"
    retrieval: dict[str, Any] = field(default_factory=dict)
    checkpoint_policy: str = "every_turn"
    tools: list[dict[str, Any]] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    compaction: dict[str, Any] = field(default_factory=dict)
    subject_id: str | None = None  # the data subject it is about (app/subjects/)


@dataclass(frozen=True)
class SessionView:
    row: AgentSession
    status: str
    pending: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ArtifactView:
    row: Artifact
    parents: list[str]


@dataclass(frozen=True)
class TurnResult:
    turn: int
    epoch: int
    input_ids: list[str]
    reply_id: str | None
    reply_content: str | None
    usage: Usage
    finish_reason: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


class StaleHead(Conflict):
    """A conditional transition (`expect_turns`) found the session moved on."""

    type_slug = "stale-head"
    title = "Session moved on"


def parse_calls_json(content: str) -> list[ToolCall]:
    """A stored tool_call artifact's call (its content is the call as JSON)."""
    try:
        body = json.loads(content)
        return [ToolCall(str(body["id"]), str(body["name"]), dict(body.get("arguments") or {}))]
    except (ValueError, KeyError, TypeError):
        return []


@dataclass(frozen=True)
class Deleted:
    """A session deletion: the finished forget job recording its shred (None: it erased nothing sealed) and what
    it erased."""

    forget_id: str | None
    erased: Retired
