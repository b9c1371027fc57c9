"""Server-sent events in OpenAI's two stream formats, over a transition started by app/web/sse.py.

The stream observes the transition's task (as the native stream does); a client that disconnects cancels it, so
nothing is sampled for nobody and nothing is written. Errors before the first token are ordinary error answers; after
it they are an `error` event (Responses: `{"type": "error", "code", "message", "param"}`) or a `data: {"error": {...}}`
chunk (Chat Completions), which the SDK raises as an APIError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import ServerSentEvent

from app.errors import LetheError
from app.openai_compat.errors import body
from app.openai_compat.markup import VisibleStream
from app.web.sse import Run, event


class Sequence:
    """Responses events carry a growing `sequence_number`; the event's name is also its `type`."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, /, **fields: Any) -> ServerSentEvent:
        payload = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return event(kind, payload)


async def response_events(
    run: Run[dict[str, Any]], skeleton: dict[str, Any], reply_id: str
) -> AsyncIterator[ServerSentEvent]:
    """response.created … output_text.delta … function calls … response.completed (or an `error` event).

    Text deltas are the reply's visible text (markup.py): tool-call markup never reaches them. The message item is
    announced with its first visible text, so a reply that only calls tools has none, as its stored response. Its
    calls follow as OpenAI streams function calls (`output_item.added`, `function_call_arguments.delta` and
    `.done`, `output_item.done`), once the transition has stored them: their ids are the stored items' (a call's
    id derives from the transition, its item id is its artifact's), so a client can refer to them later."""
    seq = Sequence()
    yield seq("response.created", response=skeleton)
    yield seq("response.in_progress", response=skeleton)
    message = {"type": "message", "id": reply_id, "role": "assistant", "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": reply_id, "output_index": 0, "content_index": 0}
    text = VisibleStream()
    shown: list[str] = []

    def opened() -> list[ServerSentEvent]:
        return [seq("response.output_item.added", output_index=0, item=message),
                seq("response.content_part.added", **where, part=part)]

    if run.deltas is not None:
        async for delta in run.deltas:
            visible = text.push(delta)
            if visible:
                for announced in [] if shown else opened():
                    yield announced
                shown.append(visible)
                yield seq("response.output_text.delta", **where, delta=visible, logprobs=[])
    result = run.outcome()
    if isinstance(result, LetheError):
        code = "invalid_api_key" if result.status == 401 else result.type_slug
        yield seq("error", code=code, message=result.detail, param=result.extra.get("param"))
        return
    final = next((o for o in result["output"] if o.get("id") == reply_id), None)
    if final is not None or shown:
        done_text = final["content"][0]["text"] if final else "".join(shown)
        if not shown:  # visible text the deltas never carried (it cannot, but the stored reply is the truth)
            for announced in [*opened(), seq("response.output_text.delta", **where, delta=done_text, logprobs=[])]:
                yield announced
        yield seq("response.output_text.done", **where, text=done_text, logprobs=[])
        yield seq("response.content_part.done", **where, part={**part, "text": done_text})
        yield seq("response.output_item.done", output_index=0,
                  item=final or {**message, "status": "completed", "content": [{**part, "text": done_text}]})
    others = [o for o in result["output"] if o.get("id") != reply_id]
    for index, item in enumerate(others, start=1 if final is not None or shown else 0):
        for item_event in _item_events(seq, index, item):
            yield item_event
    # Always `response.completed` (the response's own `status` says `incomplete` when max_output_tokens cut it): the
    # SDK's stream helper finishes only on that event.
    yield seq("response.completed", response=result)


def _item_events(seq: Sequence, index: int, item: dict[str, Any]) -> list[ServerSentEvent]:
    """An output item after the message: a function call streamed as OpenAI streams one."""
    if item.get("type") != "function_call":
        return [seq("response.output_item.added", output_index=index, item={**item, "status": "in_progress"}),
                seq("response.output_item.done", output_index=index, item=item)]
    where = {"item_id": item["id"], "output_index": index}
    return [
        seq("response.output_item.added", output_index=index,
            item={**item, "arguments": "", "status": "in_progress"}),
        seq("response.function_call_arguments.delta", **where, delta=item["arguments"]),
        seq("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]),
        seq("response.output_item.done", output_index=index, item=item),
    ]


async def chat_chunks(
    run: Run[dict[str, Any]], head: dict[str, Any], include_usage: bool
) -> AsyncIterator[ServerSentEvent]:
    """chat.completion.chunk objects, then `data: [DONE]` (or a `data: {"error": ...}` chunk)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> ServerSentEvent:
        only = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return event(None, {**head, "choices": [only]})

    yield chunk({"role": "assistant", "content": ""})
    text = VisibleStream()  # the message's content, without tool-call markup (markup.py)
    shown = False
    if run.deltas is not None:
        async for delta in run.deltas:
            visible = text.push(delta)
            if visible:
                shown = True
                yield chunk({"content": visible})
    result = run.outcome()
    if isinstance(result, LetheError):
        yield event(None, body(result.status, result.detail, code=result.type_slug))
        return
    choice = result["choices"][0]
    if not shown and choice["message"].get("content"):  # a text no token carried (a deletion request's plan)
        yield chunk({"content": choice["message"]["content"]})
    calls = choice["message"].get("tool_calls") or []
    for index, call in enumerate(calls):  # each call whole in one delta: its id, name and arguments
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield event(None, {**head, "choices": [], "usage": result["usage"]})
    yield event(None, "[DONE]")
