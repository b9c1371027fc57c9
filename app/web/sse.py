"""Server-sent events for streaming transitions: the native `delta`… `turn` stream here, OpenAI's two formats in
app/openai_compat/streaming.py, over the same started transition (`start`) and the same response (`respond`).

The transition runs as a task the stream observes. Its tokens become text deltas as they are sampled, detokenized
incrementally (app/engine/detokenize.py): the work per delta does not grow with the reply. Errors before the first
token (a busy session, a bad tool result, a prompt too long) are ordinary answers, not a stream.

Events are framed by sse-starlette's `EventSourceResponse`. FastAPI's own (0.135+) frames only what a generator path
operation yields, which answers `text/event-stream` before the first token exists; these routes decide only then
whether they stream at all. sse-starlette watches the connection: a client that disconnects cancels the stream's
body, whose `finally` cancels the task, so the generation stops at its next token and the turn writes nothing (as if
it had never been sent). The wire stays what clients have always read here: lines end in `\\n` (its default is
`\\r\\n`), and no keep-alive comments (its `: ping` every 15 s, however busy the stream): a stream opens with its
first token and is never idle for long, while a client that reads every block as an event would trip on them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent

from app.engine.detokenize import IncrementalDetokenizer
from app.engine.protocol import ChatTemplate, TokenSink
from app.errors import LetheError
from app.web.problems import problem

log = logging.getLogger(__name__)

R = TypeVar("R")
M = TypeVar("M", bound=BaseModel)
_DONE = object()
LINE_END = "\n"


@dataclass
class Run(Generic[R]):
    """A started transition: its text deltas (as sampled; None when it finished before sampling any) and its task."""

    deltas: AsyncIterator[str] | None
    task: asyncio.Future[R]

    def outcome(self) -> R | LetheError:
        """Once its deltas are read (it has finished): its result, or its error (an unexpected one logged, and
        answered as a bare 500 as the API's error handler does)."""
        try:
            return self.task.result()
        except LetheError as exc:
            return exc
        except Exception:
            log.exception("a streamed transition failed")
            return LetheError("an unexpected error occurred; see the server log")


async def start(run: Callable[[TokenSink], Awaitable[R]], chat: ChatTemplate) -> Run[R]:
    """Start `run(on_tokens)` and wait for its first tokens; raises its error if it fails before any."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def on_tokens(tokens: list[int]) -> None:  # called from the engine's thread
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
    return Run(_deltas(first, queue, IncrementalDetokenizer(chat.decode)), task)


async def _deltas(first: list[int], queue: asyncio.Queue[Any], text: IncrementalDetokenizer) -> AsyncIterator[str]:
    item: Any = first
    while item is not _DONE:
        delta = text.push(item)
        if delta:
            yield delta
        item = await queue.get()
    rest = text.flush()
    if rest:
        yield rest


def event(name: str | None, data: dict[str, Any] | str) -> ServerSentEvent:
    """One event: `data` as compact JSON (a string as it is, e.g. `[DONE]`); no `event:` line when `name` is None."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return ServerSentEvent(text, event=name, sep=LINE_END)


def respond(events: AsyncIterator[ServerSentEvent], run: Run[Any]) -> EventSourceResponse:
    """`events` as `text/event-stream` (with `Cache-Control: no-store` and `X-Accel-Buffering: no`, so that neither a
    cache nor a proxy holds deltas back)."""
    return EventSourceResponse(
        _cancelling(events, run.task), sep=LINE_END, ping=0,
        # uvicorn drains requests in flight for LETHE_SHUTDOWN_GRACE_S after SIGTERM, then cancels them; a stream is
        # one of them, so sse-starlette's own drain must not cut it sooner.
        shutdown_grace_period=math.inf,
    )


async def _cancelling(
    events: AsyncIterator[ServerSentEvent], task: asyncio.Future[Any]
) -> AsyncIterator[ServerSentEvent]:
    """`events`, and the transition cancelled if the stream ends early (the client disconnected)."""
    try:
        async for item in events:
            yield item
    finally:
        task.cancel()  # a no-op once the transition finished


async def stream_turn(run: Callable[[TokenSink], Awaitable[M]], chat: ChatTemplate) -> EventSourceResponse | M:
    """A native turn as `delta` events (`{"text": ...}`), then one `turn` event with the object a non-streaming turn
    answers (or one `error` event with a problem document). Answers that object itself when the turn finished
    without sampling anything (no reply), and raises its error if it failed before that."""
    started = await start(run, chat)
    if started.deltas is None:
        return started.task.result()
    return respond(_turn_events(started), started)


async def _turn_events(run: Run[M]) -> AsyncIterator[ServerSentEvent]:
    assert run.deltas is not None
    async for delta in run.deltas:
        yield event("delta", {"text": delta})
    outcome = run.outcome()
    if isinstance(outcome, LetheError):
        yield event("error", problem(outcome.status, outcome.type_slug, outcome.title, outcome.detail, **outcome.extra))
        return
    yield event("turn", outcome.model_dump(mode="json"))
