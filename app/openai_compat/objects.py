"""OpenAI's objects as the compatible routes answer them: lists, responses, tools. Pure shaping over stored rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.db.models import AgentSession, Artifact
from app.db.openai_models import OpenAIResponse
from app.errors import NotFound
from app.ids import has_prefix
from app.openai_compat.errors import BadParameter
from app.openai_compat.items import item_of
from app.openai_compat.schemas import FunctionTool
from app.runtime.tool_catalog import normalize as normalize_tools


def page(items: list[dict[str, Any]], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """OpenAI's cursor list: `order` (asc: oldest first), the items after the one named `after`, `limit` of them."""
    if order == "desc":
        items = list(reversed(items))
    if after is not None:
        index = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if index is None:
            raise BadParameter("after", f"no item {after!r} in this list")
        items = items[index + 1:]
    chunk = items[:limit]
    return {"object": "list", "data": chunk, "first_id": chunk[0]["id"] if chunk else None,
            "last_id": chunk[-1]["id"] if chunk else None, "has_more": len(items) > limit}


def ts(at: datetime | None) -> int:
    return int((at or datetime.now()).timestamp())


def require_id(value: str, prefix: str, what: str) -> None:
    """A malformed id is an unknown one (and never reaches SQL, whatever characters it holds)."""
    if not has_prefix(value, prefix):
        raise NotFound(f"no {what} {value!r}")


def lethe_tools(tools: list[FunctionTool]) -> list[dict[str, Any]]:
    """Function tools as a session's client tools (the model's calls wait for the client's output)."""
    specs = [{"name": t.name, "description": t.description or "", "parameters": t.parameters or {"type": "object"}}
             for t in tools]
    try:
        return normalize_tools(specs)
    except ValueError as exc:
        raise BadParameter("tools", str(exc)) from None


def function_tools(session_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "name": t["name"], "description": t.get("description") or None,
             "parameters": t.get("parameters"), "strict": False}
            for t in session_tools if not t.get("builtin")]


def plan_message(plan: dict[str, Any]) -> dict[str, Any]:
    """The output message answering a deletion request in plain words: the plan's reply (ids and counts only)."""
    return {"type": "message", "id": plan["reply_id"], "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": plan["reply"], "annotations": [], "logprobs": []}]}


def plan_response(
    response_id: str, plan: dict[str, Any], params: dict[str, Any], previous_response_id: str | None
) -> dict[str, Any]:
    """A deletion request's response when nothing matched and no session is left to hold it (nothing is stored)."""
    return {
        "id": response_id, "object": "response", "created_at": ts(None), "completed_at": ts(None),
        "status": "completed", "error": None, "incomplete_details": None, "instructions": None,
        "metadata": params.get("metadata") or {}, "model": params["model"], "output": [plan_message(plan)],
        "parallel_tool_calls": True, "temperature": 0.0, "top_p": 1.0, "max_output_tokens": None,
        "tool_choice": "auto", "tools": [], "previous_response_id": previous_response_id, "conversation": None,
        "store": False, "background": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": _usage({}),
    }


def response_object(row: OpenAIResponse, session: AgentSession, arts: list[Artifact]) -> dict[str, Any]:
    """A response as OpenAI's object, its output read from its transition's artifacts as they are now (a deletion
    request's answer holds the plan's reply instead: it ran no transition)."""
    plan = row.params.get("plan")
    if plan is not None:
        arts = []
    output = [item for a in arts if a.kind in ("assistant", "tool_call") and (item := item_of(a)) is not None]
    if plan is not None:
        output = [plan_message(plan)]
    replies = [a for a in arts if a.kind == "assistant"]
    finish = (replies[-1].meta or {}).get("finish_reason") if replies else None
    config = {**session.sampling, **((session.sampling.get("per_turn") or {}).get(str(row.turn)) or {})}
    params, usage = row.params, row.usage
    incomplete = finish == "length"
    return {
        "id": row.id, "object": "response", "created_at": ts(row.created_at), "completed_at": ts(row.created_at),
        "status": "incomplete" if incomplete else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": session.system_prompt, "metadata": params.get("metadata") or {}, "model": params["model"],
        "output": output, "parallel_tool_calls": True,
        "temperature": float(config.get("temperature", 0.0)), "top_p": float(config.get("top_p", 1.0)),
        "max_output_tokens": int(config.get("max_tokens", 256)), "tool_choice": "auto",
        "tools": function_tools(session.tools), "previous_response_id": row.previous_response_id,
        "conversation": {"id": row.conversation_id} if row.conversation_id else None,
        "store": True, "background": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": _usage(usage),
        "lethe_session_id": row.session_id, "lethe_turn": row.turn,
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": usage.get("input_tokens", 0),
        "input_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0),
                                 "cache_write_tokens": usage.get("prefill_tokens", 0)},
        "output_tokens": usage.get("output_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
    }
