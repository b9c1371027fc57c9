"""Server-sent events in OpenAI's two stream formats, over a transition started by app/api/sse.py.

The stream observes the transition's task (as the native stream does); a client that disconnects cancels it, so
nothing is sampled for nobody and nothing is written. Errors before the first token are ordinary error answers; after
it they are an `error` event (Responses: `{"type": "error", "code", "message", "param"}`) or a `data: {"error": {...}}`
chunk (Chat Completions), which the SDK raises as an APIError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import ServerSentEvent

from app.api.sse import Run, event
from app.errors import LetheError
from app.openai_compat.errors import body


class Sequence:
    """Responses events carry a growing `sequence_number`; the event's name is also its `type`."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, name: str, **fields: Any) -> ServerSentEvent:
        payload = {"type": name, "sequence_number": self.n, **fields}
        self.n += 1
        return event(name, payload)


async def response_events(
    run: Run[dict[str, Any]], skeleton: dict[str, Any], reply_id: str
) -> AsyncIterator[ServerSentEvent]:
    """response.created … output_text.delta … response.completed (or an `error` event)."""
    seq = Sequence()
    yield seq("response.created", response=skeleton)
    yield seq("response.in_progress", response=skeleton)
    message = {"type": "message", "id": reply_id, "role": "assistant", "status": "in_progress", "content": []}
    yield seq("response.output_item.added", output_index=0, item=message)
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": reply_id, "output_index": 0, "content_index": 0}
    yield seq("response.content_part.added", **where, part=part)
    deltas: list[str] = []
    if run.deltas is not None:
        async for delta in run.deltas:
            deltas.append(delta)
            yield seq("response.output_text.delta", **where, delta=delta, logprobs=[])
    result = run.outcome()
    if isinstance(result, LetheError):
        code = "invalid_api_key" if result.status == 401 else result.type_slug
        yield seq("error", code=code, message=result.detail, param=result.extra.get("param"))
        return
    final = next((o for o in result["output"] if o.get("id") == reply_id), None)
    done_text = final["content"][0]["text"] if final else "".join(deltas)
    yield seq("response.output_text.done", **where, text=done_text, logprobs=[])
    yield seq("response.content_part.done", **where, part={**part, "text": done_text})
    done_message = final or {**message, "status": "completed",
                             "content": [{**part, "text": done_text}]}
    yield seq("response.output_item.done", output_index=0, item=done_message)
    others = [o for o in result["output"] if o.get("id") != reply_id]
    for index, item in enumerate(others, start=1):
        yield seq("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
        yield seq("response.output_item.done", output_index=index, item=item)
    if final is None:
        result = {**result, "output": [done_message, *others]}
    # Always `response.completed` (the response's own `status` says `incomplete` when max_output_tokens cut it): the
    # SDK's stream helper finishes only on that event.
    yield seq("response.completed", response=result)


async def chat_chunks(
    run: Run[dict[str, Any]], head: dict[str, Any], include_usage: bool
) -> AsyncIterator[ServerSentEvent]:
    """chat.completion.chunk objects, then `data: [DONE]` (or a `data: {"error": ...}` chunk)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> ServerSentEvent:
        only = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return event(None, {**head, "choices": [only]})

    yield chunk({"role": "assistant", "content": ""})
    if run.deltas is not None:
        async for delta in run.deltas:
            yield chunk({"content": delta})
    result = run.outcome()
    if isinstance(result, LetheError):
        yield event(None, body(result.status, result.detail, code=result.type_slug))
        return
    choice = result["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    last: dict[str, Any] = {}
    if calls:
        last["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    yield chunk(last, choice["finish_reason"])
    if include_usage:
        yield event(None, {**head, "choices": [], "usage": result["usage"]})
    yield event(None, "[DONE]")
