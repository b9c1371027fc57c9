"""Blocks: how each kind of observation becomes exact prompt tokens.

Every observation is rendered as its own chat block (`ChatTemplate.render_block`), so its artifact owns an exact
token span and the prompt is the concatenation of block tokens: a checkpoint is a token offset, a forget can drop or
re-render one observation and leave every other block's tokens untouched.

Rendering choices (a replay must render a sanitized observation with these same functions, hence one place):

- `user` is a user-role block holding the text verbatim.
- `document` is a user-role block `Document (source: <source>):\\n<content>` (`Document:\\n<content>` without a
  source). The user role because the small chat models we serve know only system/user/assistant, and a document is
  something handed to the agent from outside, like a user message; the header keeps it apart from what the user typed.
- `tool_result` is a `tool`-role block holding the result text only. The tool call id stays out of the prompt (it is
  kept in the artifact's meta): ids are random, so a replay that re-issues a call would otherwise change the prompt and
  could never reproduce the counterfactual session token for token.
- `system` is the session's system prompt, a system-role block at transition 0.
- `memory` is one live memory record injected at session start (transition 0, after the system block): a system-role
  block `Memory (<key>):\n<value>`, the value as text (a JSON value other than a string is rendered as JSON). The
  artifact's meta links it to (namespace, key, version), which is how a forget of the record finds it.

An artifact's `content` is what the client sent (the document text without the header); the prompt text is derived.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from app.engine.protocol import ChatTemplate

# Observation kinds and the chat role each renders in; new kinds (memory, summary, ...) register here.
ROLE_OF: Final[Mapping[str, str]] = {
    "system": "system",
    "memory": "system",
    "instruction": "system",
    "user": "user",
    "document": "user",
    "tool_result": "tool",
}
# Kinds written by a model call: the provenance of the full context policy chains through them (context.py).
MODEL_KINDS: Final[frozenset[str]] = frozenset({"assistant", "tool_call", "summary"})
# Observations that inject outside content mid-session: the before_injections checkpoint policy keys on them.
INJECTION_KINDS: Final[frozenset[str]] = frozenset({"document", "tool_result", "memory"})
# Meta keys a client may see (the rest of `meta` is the runtime's own bookkeeping, e.g. the chunk recipe).
PUBLIC_META: Final[tuple[str, ...]] = ("source", "tool_call_id", "namespace", "key", "version", "name")


@dataclass(frozen=True)
class Observation:
    """One external input of a transition, before rendering."""

    kind: str
    content: str
    meta: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ROLE_OF:
            raise ValueError(f"unknown observation kind {self.kind!r}")


@dataclass(frozen=True)
class Block:
    """A rendered unit of the log, about to become an artifact."""

    kind: str
    content: str
    token_ids: list[int]
    meta: dict[str, Any] = field(default_factory=dict)


def prompt_text(observation: Observation) -> str:
    if observation.kind == "document":
        source = observation.meta.get("source")
        header = f"Document (source: {source}):" if source else "Document:"
        return f"{header}\n{observation.content}"
    if observation.kind == "memory":
        return f"Memory ({observation.meta.get('key', '')}):\n{observation.content}"
    return observation.content


def render(chat: ChatTemplate, observation: Observation) -> Block:
    tokens = chat.render_block(ROLE_OF[observation.kind], prompt_text(observation))
    return Block(observation.kind, observation.content, tokens, dict(observation.meta))


def assistant_block(chat: ChatTemplate, content: str, generated: list[int]) -> Block:
    """The reply as it sits in the log: the generation prompt, the sampled tokens and the closing tokens."""
    return Block("assistant", content, [*chat.assistant_header(), *generated, *chat.end_of_turn()])


def sampled_of(chat: ChatTemplate, token_ids: list[int]) -> list[int]:
    """The sampled tokens of a reply block as assistant_block laid it out (the draft a replay verifies)."""
    head, tail = len(chat.assistant_header()), len(chat.end_of_turn())
    return list(token_ids[head : len(token_ids) - tail]) if len(token_ids) >= head + tail else []


def memory_observation(namespace: str, key: str, version: int, value: Any) -> Observation:
    content = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return Observation("memory", content, {"namespace": namespace, "key": key, "version": str(version)})
