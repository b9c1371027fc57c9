"""Request priorities on a vLLM fleet (app/engine/fleet_priority.py), against scripted `vllm serve` servers
(httpx.MockTransport): one that takes a request's `priority` (vLLM 0.32 does under either scheduling policy), and one
that refuses a non-zero priority with a 400 (earlier vLLM served with the default `fcfs`). The start-up probe decides
what the engine sends, as LETHE_VLLM_REMOTE_PRIORITY says: never assumed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.fleet_priority import FleetRefusesPriority, PriorityMode
from app.engine.model_store import resolve_model
from app.engine.priority import Priority, engine_priority
from app.engine.protocol import Sampling
from app.engine.vllm_remote import VLLMRemoteEngine
from tests.support import MODEL_CACHE

REFUSAL = "Got priority -2 but Priority scheduling is not enabled."  # what vLLM < 0.11 answered under fcfs


@pytest.fixture(scope="module")
def chat() -> ChatMLTemplate:
    template, _ = load_chat_template(resolve_model(None, MODEL_CACHE).path)
    return template


class Server:
    """A `vllm serve` that records every completion's body; `refuses`: it answers a non-zero priority with a 400."""

    def __init__(self, chat: ChatMLTemplate, *, refuses: bool = False, other_error: str | None = None) -> None:
        self.chat, self.refuses, self.other_error = chat, refuses, other_error
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "smollm2", "max_model_len": 4096}]})
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": self.chat.encode(body["prompt"])})
        self.bodies.append(body)
        if self.other_error is not None:
            return httpx.Response(400, json={"error": {"message": self.other_error, "type": "BadRequestError"}})
        if self.refuses and body.get("priority", 0) != 0:
            return httpx.Response(400, json={"error": {"message": REFUSAL, "type": "BadRequestError", "code": 400}})
        usage = {"prompt_tokens": len(body["prompt"]), "prompt_tokens_details": {"cached_tokens": 0}}
        choice = {"token_ids": [self.chat.encode(" ok")[0]], "finish_reason": "length", "stop_reason": None}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    def priorities(self) -> list[int | None]:
        return [body.get("priority") for body in self.bodies]


VERIFICATION_PROBE = 2  # requests start() sends after the priority probe (vllm_remote.py: _probe_verification)


async def started(server: Server, mode: PriorityMode) -> VLLMRemoteEngine:
    engine = VLLMRemoteEngine(
        "http://router", None, MODEL_CACHE, transport=httpx.MockTransport(server), priority=mode
    )
    await engine.start()
    return engine


async def one_request_per_priority(engine: VLLMRemoteEngine, chat: ChatMLTemplate) -> None:
    handle = await engine.open("t:s", salt="t:s:0", tokens=[*chat.render_block("user", "Hi"), *chat.assistant_header()])
    await engine.generate(handle, Sampling(max_tokens=1))  # a live turn
    for level in (Priority.FORGET, Priority.DETECTOR):
        with engine_priority(level):
            await engine.generate(handle, Sampling(max_tokens=1))


async def test_a_fleet_that_takes_priorities_gets_each_request_s(chat: ChatMLTemplate) -> None:
    server = Server(chat)
    engine = await started(server, "auto")
    assert engine.sends_priority
    await one_request_per_priority(engine, chat)
    # The priority probe's, the verification probe's two (live), then live, forget, detector (lower goes first).
    assert server.priorities() == [-2, 0, 0, 0, -1, -2]
    await engine.close()


async def test_a_fleet_that_refuses_them_gets_none_in_auto_and_fails_the_start_in_on(chat: ChatMLTemplate) -> None:
    server = Server(chat, refuses=True)
    engine = await started(server, "auto")
    assert not engine.sends_priority
    await one_request_per_priority(engine, chat)
    # Refused once and asked again without, then none sent.
    assert server.priorities() == [-2, *[None] * (1 + VERIFICATION_PROBE + 3)]
    await engine.close()

    with pytest.raises(FleetRefusesPriority, match="--scheduling-policy priority"):
        await started(Server(chat, refuses=True), "on")


async def test_off_sends_none_and_another_refusal_is_not_taken_for_one(chat: ChatMLTemplate) -> None:
    server = Server(chat)
    engine = await started(server, "off")
    assert not engine.sends_priority
    await one_request_per_priority(engine, chat)
    assert server.priorities() == [None] * (1 + VERIFICATION_PROBE + 3)
    await engine.close()

    with pytest.raises(ValueError, match="max_tokens"):  # a fleet that is wrong otherwise fails the start, as before
        await started(Server(chat, other_error="max_tokens must be at least 1"), "auto")
