"""What the vllm-remote engine promises a fleet behind vllm-router, without one: against a scripted router and workers
(httpx.MockTransport) that place requests by `X-Session-ID` and keep a salted prefix cache per worker. The real
fleet (router + two `vllm serve` workers) is tests/fleet/test_fleet.py."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import pytest

from app.db.models import AgentSession
from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.fleet import SESSION_HEADER, FleetRequest, ObservedFleet
from app.engine.model_store import resolve_model
from app.engine.protocol import Sampling
from app.engine.vllm_remote import VLLMRemoteEngine
from app.engine.vllm_remote_wire import RETRY_AFTER_S
from app.errors import EngineUnavailable
from app.observability.metrics import Metrics
from app.runtime.engine_calls import use_salt
from app.runtime.routing import route_of
from app.runtime.salts import salt_of
from tests.support import MODEL_CACHE

BLOCK = 16  # the scripted workers' KV block


@pytest.fixture(scope="module")
def chat() -> ChatMLTemplate:
    template, _ = load_chat_template(resolve_model(None, MODEL_CACHE).path)
    return template


class ScriptedFleet:
    """A router over two workers: a request goes to the live worker its `X-Session-ID` hashes to (the first live one
    without a key), and a worker reuses the full blocks of a prompt it computed before under the same cache salt."""

    def __init__(self, chat: ChatMLTemplate) -> None:
        self.chat = chat
        self.cached: dict[str, set[tuple[Any, ...]]] = {"w0": set(), "w1": set()}
        self.alive = {"w0", "w1"}
        self.keys: list[str | None] = []  # X-Session-ID of every completion, None when absent
        self.served: list[str] = []  # the worker of every completion
        self.failure: Exception | None = None  # raised by the transport instead of answering
        self.status = 200

    def worker_of(self, key: str | None) -> str:
        live = sorted(self.alive)
        if key is None:
            return live[0]
        return live[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(live)]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "smollm2", "max_model_len": 4096}]})
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": self.chat.encode(body["prompt"])})
        assert request.url.path == "/v1/completions"
        key = request.headers.get(SESSION_HEADER)
        self.keys.append(key)
        if self.failure is not None:
            raise self.failure
        if self.status != 200:
            return httpx.Response(self.status, text="No available workers (all circuits open or unhealthy)")
        worker = self.worker_of(key)
        self.served.append(worker)
        prompt, salt = body["prompt"], body.get("cache_salt")
        full = len(prompt) // BLOCK
        blocks = [(salt, *prompt[: (i + 1) * BLOCK]) for i in range(full)]
        hit = 0
        while hit < full and blocks[hit] in self.cached[worker]:
            hit += 1
        self.cached[worker].update(blocks)
        usage = {"prompt_tokens": len(prompt), "prompt_tokens_details": {"cached_tokens": hit * BLOCK}}
        choice = {"token_ids": [self.chat.encode(" ok")[0]], "finish_reason": "length", "stop_reason": None}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    def kill(self, worker: str) -> None:
        self.alive.discard(worker)
        self.cached[worker].clear()


async def started(fleet: ScriptedFleet) -> tuple[VLLMRemoteEngine, list[FleetRequest]]:
    engine = VLLMRemoteEngine("http://router", None, MODEL_CACHE, transport=httpx.MockTransport(fleet))
    seen: list[FleetRequest] = []
    assert isinstance(engine, ObservedFleet)
    engine.observe(seen.append)
    await engine.start()
    return engine, seen


def words(chat: ChatMLTemplate, text: str, times: int) -> list[int]:
    return [*chat.render_block("user", text * times), *chat.assistant_header()]


async def test_every_session_request_carries_its_routing_key_and_the_probe_none(chat: ChatMLTemplate) -> None:
    fleet = ScriptedFleet(chat)
    engine, _ = await started(fleet)
    # The start-up probes are no session's: the tokenizer's, then the verification probe's two requests, to one worker.
    assert fleet.keys[0] is None and len(fleet.keys) == 3 and fleet.keys[1] == fleet.keys[2]
    assert str(fleet.keys[1]).startswith("lethe-verification-probe-")
    handle = await engine.open("tenant-a:ses_1", salt="tenant-a:ses_1:0", tokens=words(chat, "Hi ", 40))
    await engine.generate(handle, Sampling(max_tokens=1))
    await engine.warm(handle)
    use_salt(engine, handle, "tenant-a:ses_1:1")  # a forget's new cache generation: the same key, the same worker
    await engine.generate(handle, Sampling(max_tokens=1))
    twin = await engine.fork(handle, "tenant-a:ses_2")
    await engine.warm(twin)
    assert fleet.keys[3:] == ["tenant-a:ses_1"] * 3 + ["tenant-a:ses_2"]
    await engine.close()


async def test_each_request_says_whether_its_session_kept_its_cache(chat: ChatMLTemplate) -> None:
    fleet = ScriptedFleet(chat)
    engine, seen = await started(fleet)
    handle = await engine.open("t:s", salt="t:s:0", tokens=words(chat, "Box 3 holds apples. ", 12))
    sampling = Sampling(max_tokens=1)
    await engine.generate(handle, sampling)  # nothing to find yet
    await engine.prefill(handle, words(chat, "And box 4? ", 6))
    await engine.generate(handle, sampling)  # its prefix is where it left it
    home = fleet.served[-1]
    fleet.kill(home)  # the session's worker dies; the router sends it to the other one
    await engine.prefill(handle, words(chat, "And box 5? ", 6))
    await engine.generate(handle, sampling)  # had a cache, found none: a failover
    await engine.generate(handle, sampling)  # rebuilt on the new worker
    assert fleet.served[-1] != home
    assert [r.affinity for r in seen] == ["new", "kept", "lost", "kept"]
    assert seen[0].reused_tokens == 0 and seen[1].reused_tokens > 0 and seen[2].reused_tokens == 0
    assert all(r.prompt_tokens > 0 for r in seen)

    await engine.crop(handle, BLOCK - 1)  # what the log keeps of what was sent is less than a block: nothing to lose
    for cached in fleet.cached.values():
        cached.clear()
    await engine.prefill(handle, words(chat, "Box 9? ", 8))
    await engine.generate(handle, sampling)
    use_salt(engine, handle, "t:s:1")  # nothing was computed under the new salt
    await engine.generate(handle, sampling)
    assert [r.affinity for r in seen[4:]] == ["new", "new"]
    await engine.close()


@pytest.mark.parametrize(
    "failure",
    [httpx.ConnectError("refused"), httpx.RemoteProtocolError("peer closed connection"), httpx.ReadTimeout("slow")],
    ids=["connect", "broken", "timeout"],
)
async def test_a_fleet_gone_under_a_request_is_engine_unavailable(chat: ChatMLTemplate, failure: Exception) -> None:
    fleet = ScriptedFleet(chat)
    engine, seen = await started(fleet)
    handle = await engine.open("t:s", salt="t:s:0", tokens=words(chat, "Hi ", 30))
    logged = list(handle.tokens)
    fleet.failure = failure
    with pytest.raises(EngineUnavailable) as raised:
        await engine.generate(handle, Sampling(max_tokens=4))
    assert raised.value.status == 503 and raised.value.headers == {"Retry-After": str(RETRY_AFTER_S)}
    assert handle.tokens == logged  # nothing was appended: the turn has nothing to commit
    assert seen[-1] == FleetRequest("failed", len(logged), 0)
    fleet.failure = None
    fleet.status = 503  # the router with no live worker left
    with pytest.raises(EngineUnavailable, match="failed the request \\(503\\)"):
        await engine.warm(handle)
    fleet.status = 200
    assert (await engine.generate(handle, Sampling(max_tokens=1))).token_ids  # the retry is served
    await engine.close()


def test_the_routing_key_is_the_session_without_its_cache_generation() -> None:
    session = AgentSession(id="ses_1", tenant_id="ten_1", cache_generation=0)
    moved = AgentSession(id="ses_1", tenant_id="ten_1", cache_generation=3)
    assert route_of(session) == route_of(moved) == "ten_1:ses_1"
    assert salt_of(session) != salt_of(moved)
    assert route_of(AgentSession(id="ses_1", tenant_id="ten_2")) != route_of(session)


def test_fleet_requests_are_counted_by_affinity() -> None:
    metrics = Metrics()
    for request in (FleetRequest("new", 300, 0), FleetRequest("kept", 320, 256), FleetRequest("lost", 340, 0)):
        metrics.fleet_request(request)
    text = metrics.render().decode()
    assert 'lethe_fleet_requests_total{affinity="kept"} 1.0' in text
    assert 'lethe_fleet_reused_tokens_total{affinity="kept"} 256.0' in text
    assert 'lethe_fleet_prompt_tokens_total{affinity="lost"} 340.0' in text


async def test_start_waits_for_a_fleet_that_comes_up_later(chat: ChatMLTemplate) -> None:
    """vllm-router listens only once a worker is healthy, and then answers 503 while none is: the engine keeps
    asking instead of leaving the process unready for good."""
    fleet = ScriptedFleet(chat)
    answers: list[httpx.Response | Exception] = [
        httpx.ConnectError("refused"), httpx.Response(503, text="No available workers")
    ]

    def later(request: httpx.Request) -> httpx.Response:
        if not answers:
            return fleet(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    engine = VLLMRemoteEngine("http://router", None, MODEL_CACHE, transport=httpx.MockTransport(later))
    await engine.start()
    assert engine.ready and not answers and engine.served_model == "smollm2"
    await engine.close()
