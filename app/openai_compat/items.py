"""OpenAI items ↔ Lethe artifacts.

An item *is* an artifact, under the artifact's id: a user message is a `user` artifact, a model message an
`assistant` one, a `function_call` a `tool_call` artifact, a `function_call_output` a `tool_result`. Items are read
from the session's live artifacts every time, never copied, so when a forget rewrites a session its items change
with it (a replayed model message gets a new id; observations keep theirs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.db.models import Artifact
from app.openai_compat.errors import BadParameter
from app.openai_compat.markup import visible_text
from app.runtime.blocks import Observation

ITEM_KINDS = ("user", "document", "assistant", "tool_call", "tool_result")

def item_of(row: Artifact) -> dict[str, Any] | None:
    if row.erased:  # its keys were shredded (a backup restored from before its forget): the item is gone
        return None
    meta = row.meta or {}
    if row.kind in ("user", "document"):
        return {"type": "message", "id": row.id, "role": "user", "status": "completed",
                "content": [{"type": "input_text", "text": row.content}]}
    if row.kind == "assistant":
        text = visible_text(row.content)
        if not text and "<tool_call>" in row.content:
            return None  # only calls (or a call cut short): the calls are the function_call items
        return {"type": "message", "id": row.id, "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
    if row.kind == "tool_call":
        try:
            call = json.loads(row.content)
        except ValueError:
            return None
        return {"type": "function_call", "id": row.id, "call_id": str(call.get("id", meta.get("tool_call_id", ""))),
                "name": str(call.get("name", "")), "arguments": json.dumps(call.get("arguments") or {}),
                "status": "completed"}
    if row.kind == "tool_result":
        return {"type": "function_call_output", "id": row.id, "call_id": str(meta.get("tool_call_id", "")),
                "output": row.content, "status": "completed"}
    return None


def items_of(rows: Sequence[Artifact]) -> list[dict[str, Any]]:
    return [item for row in rows if row.archived_by is None and (item := item_of(row)) is not None]


def check_text(value: Any, param: str) -> None:
    """Strings PostgreSQL cannot store (NUL) or that are not Unicode text (unpaired surrogates): 400, not 500."""
    if isinstance(value, str):
        if "\x00" in value:
            raise BadParameter(param, f"{param} contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadParameter(param, f"{param} contains an unpaired surrogate") from None
    elif isinstance(value, dict):
        for key, inner in value.items():
            check_text(key, param)
            check_text(inner, f"{param}.{key}" if param else str(key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            check_text(inner, f"{param}[{index}]")


def message_text(content: Any, param: str, *, output: bool = False) -> str:
    """A message's content: a string, or text parts (`input_text`; `output_text` for a model's own message)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadParameter(param, f"{param} must be a string or a list of text parts")
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        allowed = ("input_text", "output_text", "text") if output else ("input_text", "text")
        if kind not in allowed or not isinstance(part.get("text"), str):
            raise BadParameter(
                f"{param}[{index}].type", f"only text content is supported ({', '.join(allowed)}); got {kind!r}"
            )
        texts.append(part["text"])
    return "".join(texts)


def split_system(items: Sequence[dict[str, Any]], param: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Leading system/developer messages (a conversation's opening items) become the session's system prompt."""
    system: list[str] = []
    index = 0
    while index < len(items) and _role(items[index]) in ("system", "developer"):
        system.append(message_text(items[index].get("content"), f"{param}[{index}].content"))
        index += 1
    return ("\n\n".join(system) if system else None), list(items[index:])


def observations(items: Sequence[dict[str, Any]], param: str, offset: int = 0) -> list[Observation]:
    """Input items as a transition's observations: user messages and function_call_output; anything else is 400."""
    out: list[Observation] = []
    for i, item in enumerate(items, start=offset):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise BadParameter(where, f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role != "user":
                raise BadParameter(
                    f"{where}.role",
                    f"only user messages can be added here (got role {role!r}): a conversation's model messages are "
                    "the ones this server sampled, and system/developer messages belong to `instructions` (or open a "
                    "conversation)",
                )
            extra = set(item) - {"type", "role", "content", "id", "status"}
            if extra:
                raise BadParameter(f"{where}.{sorted(extra)[0]}", "unsupported message field")
            out.append(Observation("user", message_text(item.get("content"), f"{where}.content")))
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id or len(call_id) > 64:
                raise BadParameter(f"{where}.call_id", "call_id must be the id of a function_call (≤ 64 characters)")
            text = output if isinstance(output, str) else message_text(output, f"{where}.output")
            out.append(Observation("tool_result", text, {"tool_call_id": call_id}))
        else:
            raise BadParameter(
                f"{where}.type", f"unsupported item type {kind!r}: messages (role user) and function_call_output only"
            )
    return out


def _role(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    role = item.get("role")
    return role if isinstance(role, str) and item.get("type", "message") == "message" else None
