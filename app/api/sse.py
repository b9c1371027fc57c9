"""Server-sent events for streaming turns: `delta` events with the reply's text as it is sampled, then one `turn`
event holding the same object a non-streaming turn answers (or one `error` event with a problem document).

The transition runs as a task the stream observes. A client that disconnects cancels it: Starlette cancels the
stream's body, whose `finally` cancels the task, so the generation stops at its next token and the turn writes
nothing (as if it had never been sent). Errors before the first token (a busy session, a bad tool result, a prompt
too long) are ordinary problem+json answers, not a stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from app.api.problems import problem
from app.engine.protocol import ChatTemplate, TokenSink
from app.errors import LetheError

_DONE = object()
M = TypeVar("M", bound=BaseModel)


def event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def stream_turn(run: Callable[[TokenSink], Awaitable[M]], chat: ChatTemplate) -> StreamingResponse | M:
    """Start `run(on_tokens)`; stream its tokens as text deltas once the first one arrives. Returns the plain result
    when the turn finishes without sampling anything (no reply), and raises its error if it fails before that."""
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
        return task.result()  # raises the turn's error as a normal problem answer
    return StreamingResponse(_events(first, queue, task, chat), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _events(
    first: list[int], queue: asyncio.Queue[Any], task: asyncio.Future[M], chat: ChatTemplate
) -> AsyncIterator[bytes]:
    try:
        async for chunk in _turn_events(first, queue, task, chat):
            yield chunk
    finally:
        task.cancel()  # a no-op once the turn finished; else the client is gone and nobody reads the rest


async def _turn_events(
    first: list[int], queue: asyncio.Queue[Any], task: asyncio.Future[M], chat: ChatTemplate
) -> AsyncIterator[bytes]:
    tokens: list[int] = list(first)
    sent = ""
    item: Any = first
    while True:
        if item is not _DONE:
            if item is not first:
                tokens.extend(item)
            text = chat.decode(tokens)
            if not text.endswith("\ufffd") and len(text) > len(sent):  # never split a multi-byte character
                yield event("delta", {"text": text[len(sent):]})
                sent = text
        else:
            break
        item = await queue.get()
    try:
        result = task.result()
    except LetheError as exc:
        yield event("error", problem(exc.status, exc.type_slug, exc.title, exc.detail, **exc.extra))
        return
    except Exception:
        yield event("error", problem(500, "internal-error", "Internal error"))
        return
    yield event("turn", result.model_dump(mode="json"))
