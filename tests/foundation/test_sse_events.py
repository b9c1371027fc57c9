"""What the stream helpers (app/web/sse.py, app/openai_compat/streaming.py) put on the wire for a transition that
fails after its first token, and that a stream closed early cancels its transition. The happy paths run end to end
over HTTP (tests/runtime/test_runtime_streaming.py, tests/openai_compat); a failure after the first token cannot be
provoked there, so here the transition is a coroutine that samples a few real tokens and then fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.model_store import resolve_model
from app.engine.protocol import TokenSink
from app.errors import Conflict
from app.openai_compat.streaming import chat_chunks
from app.web.problems import problem
from app.web.sse import respond, start, stream_turn
from tests.support import MODEL_CACHE

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def chat() -> ChatMLTemplate:
    template, _ = load_chat_template(resolve_model(None, MODEL_CACHE).path)
    return template


class Reply(BaseModel):
    text: str


def sampling_then(chat: ChatMLTemplate, text: str, end: Exception | None) -> Callable[[TokenSink], Awaitable[Reply]]:
    async def run(on_tokens: TokenSink) -> Reply:
        for token in chat.encode(text):
            on_tokens([token])
        if end is not None:
            raise end
        return Reply(text=text)

    return run


async def wire(response: Any) -> bytes:
    """The body as it goes out: sse-starlette sends each event as its `encode()` answers."""
    return b"".join([item.encode() async for item in response.body_iterator])


async def test_a_native_stream_frames_deltas_then_the_turn(chat: ChatMLTemplate) -> None:
    response = await stream_turn(sampling_then(chat, "Hi 🎉", None), chat)
    assert not isinstance(response, Reply)
    assert response.media_type == "text/event-stream"
    assert response.headers["cache-control"] == "no-store" and response.headers["x-accel-buffering"] == "no"
    body = await wire(response)
    blocks = body.decode().split("\n\n")
    assert blocks[-1] == "" and "\r" not in body.decode()
    assert blocks[-2] == 'event: turn\ndata: {"text":"Hi \\ud83c\\udf89"}'  # compact JSON, ASCII-escaped as ever
    deltas = [json.loads(b.removeprefix("event: delta\ndata: "))["text"] for b in blocks[:-2]]
    assert "".join(deltas) == "Hi 🎉" and len(deltas) > 1


async def test_a_native_turn_failing_after_its_first_token_ends_with_an_error_event(chat: ChatMLTemplate) -> None:
    response = await stream_turn(sampling_then(chat, "Hello", Conflict("the session moved on")), chat)
    assert not isinstance(response, Reply)
    last = (await wire(response)).decode().split("\n\n")[-2]
    assert last.startswith("event: error\ndata: ")
    assert json.loads(last.removeprefix("event: error\ndata: ")) == problem(409, "conflict", "Conflicting state",
                                                                         "the session moved on")


async def test_an_unexpected_failure_is_logged_and_ends_as_a_500(
    chat: ChatMLTemplate, caplog: pytest.LogCaptureFixture
) -> None:
    response = await stream_turn(sampling_then(chat, "Hello", RuntimeError("disk on fire")), chat)
    assert not isinstance(response, Reply)
    last = (await wire(response)).decode().split("\n\n")[-2]
    error = json.loads(last.removeprefix("event: error\ndata: "))
    assert error["status"] == 500 and "disk on fire" not in last  # the cause is for the log, not the client
    assert any(r.exc_info and "disk on fire" in str(r.exc_info[1]) for r in caplog.records)


async def test_a_chat_stream_failing_after_its_first_token_ends_with_an_error_chunk_and_no_done(
    chat: ChatMLTemplate,
) -> None:
    started = await start(sampling_then(chat, "Hello", Conflict("the session moved on")), chat)
    body = (await wire(respond(chat_chunks(started, {"id": "chatcmpl-1"}, False), started))).decode()
    blocks = body.split("\n\n")
    assert all(b.startswith("data: ") for b in blocks[:-1]) and "[DONE]" not in body
    assert json.loads(blocks[-2].removeprefix("data: "))["error"]["message"] == "the session moved on"


async def test_a_stream_closed_early_cancels_its_transition(chat: ChatMLTemplate) -> None:
    never = asyncio.Event()

    async def run(on_tokens: TokenSink) -> Reply:
        on_tokens(chat.encode("Hello"))
        await never.wait()  # a reply of minutes
        return Reply(text="unreachable")

    started = await start(run, chat)
    events = respond(chat_chunks(started, {"id": "chatcmpl-1"}, False), started).body_iterator
    assert isinstance(events, AsyncGenerator)
    assert b'"role":"assistant"' in (await anext(events)).encode()
    await events.aclose()  # what sse-starlette does once the client disconnected
    with contextlib.suppress(asyncio.CancelledError):
        await started.task
    assert started.task.cancelled()
