"""Deletion requests in plain words: "Forget that I live in Paris", "Delete "I live in Paris"", "Delete message 3".

A user turn that is one of these is not a message to the model: it is recognised before the transition, answered
with a dry-run plan (which messages match, what depends on them, why), and never stored, so it can never be retrieved
or replayed as context (DeLLM, section V-C). Nothing is deleted until the client confirms the plan through
`POST /v1/forget {"plan_id": ...}`.

The grammar is deliberately narrow: a request must start with a forgetting verb and name what to forget in one of the
shapes below. "Delete the meeting from my calendar" is a task for the agent, not a request to forget, and does not
match (it names neither a quoted text, a message, nor "that ..."). Each shape says how M is matched:

- `message <n>` / `message art_...`: by id (n counts the session's user messages from 1, oldest first);
- a quoted text: every message containing it exactly;
- `everything about <words>` / `what I said about <words>`: keyword (PostgreSQL full-text search);
- `forget [that|about] <statement>`, `delete/remove/erase that <I/my ...>`: meaning: messages whose embedding is at
  least `MEANING_SIMILARITY` similar to the statement, or that contain it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

MEANING_SIMILARITY: Final = 0.6  # "I live in Paris" against "I live in Paris." ≈ 0.98, against unrelated facts < 0.3

_QUOTES = "\"'\u2018\u2019\u201c\u201d"  # straight and typographic quotes
_VERB = r"(?:please\s+)?(?:can\s+you\s+)?(?:forget|delete|remove|erase)"
_SHAPES: Final[list[tuple[Literal["id", "text", "keyword", "meaning"], re.Pattern[str]]]] = [
    ("id", re.compile(rf"^{_VERB}\s+(?:my\s+|the\s+)?message\s+(?:#|number\s+)?(art_[A-Za-z0-9_-]+|\d+)$", re.I)),
    ("text", re.compile(rf"^{_VERB}\s+[{_QUOTES}](.+)[{_QUOTES}]$", re.I | re.S)),
    ("keyword", re.compile(
        rf"^{_VERB}\s+(?:everything|anything|all)\s+(?:I\s+(?:said|told\s+you|wrote)\s+)?(?:about|regarding)\s+(.+)$",
        re.I | re.S,
    )),
    ("keyword", re.compile(rf"^{_VERB}\s+what\s+I\s+(?:said|told\s+you|wrote)\s+about\s+(.+)$", re.I | re.S)),
    ("meaning", re.compile(r"^(?:please\s+)?(?:can\s+you\s+)?forget\s+(?:the\s+fact\s+)?(?:that\s+|about\s+)?(.+)$",
                           re.I | re.S)),
    # "delete that ..." only for a statement about oneself: "delete that event" is a task, not a request to forget.
    ("meaning", re.compile(rf"^{_VERB}\s+(?:the\s+fact\s+)?that\s+((?:I|I'm|I've|I'd|my|me)\b.+)$", re.I | re.S)),
]


@dataclass(frozen=True)
class DeletionRequest:
    how: Literal["id", "text", "keyword", "meaning"]
    what: str  # the id, text, keywords or statement the request names


def parse(message: str) -> DeletionRequest | None:
    """The deletion request `message` is, or None when it is an ordinary message."""
    text = message.strip()
    if not text or len(text) > 2000:
        return None
    bare = text.rstrip(" .!?")
    for how, pattern in _SHAPES:
        match = pattern.match(bare if how != "text" else text.rstrip(" .!?"))
        if match:
            what = match.group(1).strip()
            if how == "meaning":
                what = what.rstrip(" .!?")
            return DeletionRequest(how, what) if what else None
    return None
