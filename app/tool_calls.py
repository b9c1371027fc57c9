"""A model's tool call and the built-in environment's starting state: plain data the runtime produces and the
database stores (app/sessions/repositories/tools.py), so it sits below both. What a call means, and who answers it, is
app/runtime/tool_catalog.py."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

# The built-in environment of a session before any transition changed it (a bank account and a calendar).
INITIAL_STATE: Final[dict[str, Any]] = {
    "bank": {"balance": 1000.0, "currency": "EUR", "transfers": []},
    "calendar": {"events": []},
}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "name": self.name, "arguments": self.arguments}, sort_keys=True)

    @property
    def arguments_sha256(self) -> str:
        return hashlib.sha256(canonical(self.arguments).encode()).hexdigest()
