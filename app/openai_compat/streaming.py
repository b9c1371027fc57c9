"""Server-sent events in OpenAI's two stream formats, over one transition run as a task.

The transition runs as a task the stream observes (as the native stream does, app/api/sse.py); a client that
disconnects cancels it (Starlette cancels the body, `sse` cancels the task), so nothing is sampled for nobody and
nothing is written. Errors before the first token are ordinary error answers; after it they are an
`error` event (Responses: `{"type": "error", "code", "message", "param"}`) or a `data: {"error": {...}}` chunk (Chat
Completions), which the SDK raises as an APIError.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi.responses import StreamingResponse

from app.engine.protocol import ChatTemplate, TokenSink
from app.errors import LetheError

R = TypeVar("R")
_DONE = object()
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


@dataclass
class Run(Generic[R]):
    """A started transition: its text deltas (as sampled; None when it finished before sampling any) and its task."""

    deltas: AsyncIterator[str] | None
    task: asyncio.Future[R]

    async def outcome(self) -> tuple[R | None, LetheError | None]:
        try:
            return self.task.result(), None
        except LetheError as exc:
            return None, exc
        except Exception:
            return None, LetheError("an unexpected error occurred; see the server log")


async def start(run: Callable[[TokenSink], Awaitable[R]], chat: ChatTemplate) -> Run[R]:
    """Start `run(on_tokens)` and wait for its first tokens; raises its error if it fails before any."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def on_tokens(tokens: list[int]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, tokens)

    task = asyncio.ensure_future(run(on_tokens))
    task.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, _DONE))
    try:
        first = await queue.get()
    except BaseException:  # cancelled while waiting for the first token (client gone, shutdown)
        task.cancel()
        raise
    if first is _DONE:
        task.result()  # raises the error before any token as a plain answer
        return Run(None, task)
    return Run(_deltas(first, queue, chat), task)


async def _deltas(first: list[int], queue: asyncio.Queue[Any], chat: ChatTemplate) -> AsyncIterator[str]:
    tokens: list[int] = []
    sent = ""
    item: Any = first
    while item is not _DONE:
        tokens.extend(item)
        text = chat.decode(tokens)
        if not text.endswith("\ufffd") and len(text) > len(sent):  # never split a multi-byte character
            yield text[len(sent):]
            sent = text
        item = await queue.get()


def sse(body: AsyncIterator[bytes], run: Run[Any]) -> StreamingResponse:
    return StreamingResponse(_cancelled_with(body, run.task), media_type="text/event-stream", headers=HEADERS)


async def _cancelled_with(body: AsyncIterator[bytes], task: asyncio.Future[Any]) -> AsyncIterator[bytes]:
    """`body`, and the transition cancelled if the stream ends early (the client disconnected)."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        task.cancel()  # a no-op once the transition finished


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def data(payload: dict[str, Any] | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class Sequence:
    """Responses events carry a growing `sequence_number`."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, name: str, **fields: Any) -> bytes:
        payload = {"type": name, "sequence_number": self.n, **fields}
        self.n += 1
        return event(name, payload)


async def response_events(
    run: Run[dict[str, Any]], skeleton: dict[str, Any], reply_id: str
) -> AsyncIterator[bytes]:
    """response.created … output_text.delta … response.completed (or an `error` event)."""
    seq = Sequence()
    yield seq("response.created", response=skeleton)
    yield seq("response.in_progress", response=skeleton)
    message = {"type": "message", "id": reply_id, "role": "assistant", "status": "in_progress", "content": []}
    yield seq("response.output_item.added", output_index=0, item=message)
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": reply_id, "output_index": 0, "content_index": 0}
    yield seq("response.content_part.added", **where, part=part)
    text = ""
    if run.deltas is not None:
        async for delta in run.deltas:
            text += delta
            yield seq("response.output_text.delta", **where, delta=delta, logprobs=[])
    result, error = await run.outcome()
    if error is not None or result is None:
        assert error is not None
        code = "invalid_api_key" if error.status == 401 else error.type_slug
        yield seq("error", code=code, message=error.detail, param=error.extra.get("param"))
        return
    final = next((o for o in result["output"] if o.get("id") == reply_id), None)
    done_text = final["content"][0]["text"] if final else text
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
) -> AsyncIterator[bytes]:
    """chat.completion.chunk objects, then `data: [DONE]` (or a `data: {"error": ...}` chunk)."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return data({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    yield chunk({"role": "assistant", "content": ""})
    if run.deltas is not None:
        async for delta in run.deltas:
            yield chunk({"content": delta})
    result, error = await run.outcome()
    if error is not None or result is None:
        assert error is not None
        from app.openai_compat.errors import body

        yield data(body(error.status, error.detail, code=error.type_slug))
        return
    choice = result["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    last: dict[str, Any] = {}
    if calls:
        last["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    yield chunk(last, choice["finish_reason"])
    if include_usage:
        yield data({**head, "choices": [], "usage": result["usage"]})
    yield data("[DONE]")
