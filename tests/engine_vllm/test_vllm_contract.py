"""What the vLLM engines promise without a vLLM: the shared helpers, and the remote engine's HTTP contract against a
scripted fleet (httpx.MockTransport). These run everywhere; the real engines are tested in test_vllm_local.py and
test_vllm_remote.py wherever vLLM is installed."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from vllm.logprobs import Logprob

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.model_store import resolve_model
from app.engine.protocol import Generation, Sampling, TokenUsage
from app.engine.sampling import transition_seed
from app.engine.vllm_common import cache_salt, to_generation, vllm_seed
from app.engine.vllm_local import VLLMEngine
from app.engine.vllm_plugin import unfilled
from app.engine.vllm_remote import RemoteEngineError, VLLMRemoteEngine
from app.errors import EngineUnavailable
from app.runtime.engine_calls import use_salt
from app.runtime.salts import session_salt
from tests.support import MODEL_CACHE


@pytest.fixture(scope="module")
def chat() -> ChatMLTemplate:
    template, _ = load_chat_template(resolve_model(None, MODEL_CACHE).path)
    return template


def test_cache_salts_are_valid_for_vllm_and_distinct_per_tenant() -> None:
    tenants = ["acme", "acme/eu@prod", "x" * 500, "", "naïve\\tenant"]
    salts = [cache_salt(t) for t in tenants]
    assert cache_salt(None) is None
    assert len(set(salts)) == len(tenants) and salts == [cache_salt(t) for t in tenants]
    for s in salts:
        assert s is not None and len(s) <= 128 and not set(s) & set("/@\\\0")


def test_seeds_fit_a_signed_64_bit_field() -> None:
    for seed in (0, -1, 2**63, 2**64 + 5, transition_seed(7, 3)):
        assert 0 <= vllm_seed(seed) < 2**63
    assert vllm_seed(transition_seed(7, 3)) == transition_seed(7, 3)  # the runtime's seeds pass unchanged


def test_generation_drops_the_stop_token_and_cuts_stop_strings(chat: ChatMLTemplate) -> None:
    hello = chat.encode("Hello. Bye")
    eos = min(chat.stop_token_ids)
    usage = TokenUsage(reused=128, prefilled=5)
    ended = to_generation(chat, Sampling(), [*hello, eos], "stop", None, usage)
    assert ended.token_ids == hello and ended.finish_reason == "stop"
    assert ended.usage == TokenUsage(reused=128, prefilled=5, decoded=len(hello) + 1)
    cut = to_generation(chat, Sampling(stop=(".",)), hello, "stop", ".", usage)
    assert cut.token_ids == hello and cut.text == "Hello"  # the stop string's tokens stay; its text goes
    long = to_generation(chat, Sampling(), hello, "length", None, usage)
    assert long.text == "Hello. Bye" and long.finish_reason == "length"
    with pytest.raises(RuntimeError, match="abort"):
        to_generation(chat, Sampling(), hello, "abort", None, usage)


def test_an_unstarted_local_engine_refuses_calls() -> None:
    engine = VLLMEngine(None, MODEL_CACHE)
    assert not engine.ready and engine.name == "vllm" and engine.model_id == "SmolLM2-135M-Instruct"
    with pytest.raises(AttributeError, match="not started"):
        _ = engine.chat


class ScriptedFleet:
    """Answers like `vllm serve` (0.32) for one model; records every completion payload."""

    def __init__(
        self, chat: ChatMLTemplate, *, details: bool = True, tokenizer_ok: bool = True, plugin: bool = True
    ) -> None:
        self.chat, self.details, self.tokenizer_ok = chat, details, tokenizer_ok
        self.plugin = plugin  # Lethe's vLLM plugin beside it: a request asking prompt logprobs may still read the cache
        self.completions: list[dict[str, Any]] = []
        self.broken = False
        self.overreport = False  # report more cached tokens than the prompt holds
        self.refuses_verification = False  # answer a request asking prompt logprobs with a 400
        self.reply = chat.encode(" Hi there")

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "smollm2", "max_model_len": 4096}]})
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            tokens = self.chat.encode(body["prompt"]) if self.tokenizer_ok else [1, 2, 3]
            return httpx.Response(200, json={"tokens": tokens})
        if request.url.path == "/v1/completions":
            self.completions.append(body)
            if self.broken:
                return httpx.Response(500, text="engine dead")
            if self.refuses_verification and "prompt_logprobs" in body:
                return httpx.Response(400, json={"error": {"message": "Out of range float values"}})
            if body["prompt"] and max(body["prompt"]) > 49151:
                return httpx.Response(400, json={"error": {"message": "token id out of vocabulary"}})
            sampled = self.reply[: body["max_tokens"]]
            finished = len(sampled) == len(self.reply) and body["max_tokens"] > len(sampled)
            stop_id = min(self.chat.stop_token_ids)
            usage: dict[str, Any] = {"prompt_tokens": len(body["prompt"])}
            if self.details:
                cached = len(body["prompt"]) + 5 if self.overreport else len(body["prompt"]) // 128 * 128
                if "prompt_logprobs" in body and not (self.plugin and body.get("vllm_xargs")):
                    cached = 0  # vLLM turns cache reads off for it
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            choice = {
                "token_ids": [*sampled, stop_id] if finished else sampled,
                "finish_reason": "stop" if finished else "length",
                "stop_reason": None,
            }
            return httpx.Response(200, json={"choices": [choice], "usage": usage})
        return httpx.Response(404)


def remote(fleet: ScriptedFleet) -> VLLMRemoteEngine:
    return VLLMRemoteEngine("http://fleet", None, MODEL_CACHE, transport=httpx.MockTransport(fleet))


async def test_remote_requests_carry_the_log_salt_seed_and_explicit_sampling(chat: ChatMLTemplate) -> None:
    fleet = ScriptedFleet(chat)
    engine = remote(fleet)
    await engine.start()
    assert engine.served_model == "smollm2" and engine.ready
    handle = await engine.open("s", salt="tenant-a")
    prompt = [*chat.render_block("user", "Hi " * 150), *chat.assistant_header()]
    requests = len(fleet.completions)
    assert await engine.prefill(handle, prompt) == TokenUsage()  # appended; the request waits for generate
    assert len(fleet.completions) == requests
    sampling = Sampling(temperature=0.7, top_p=0.9, max_tokens=50, seed=transition_seed(1, 2))
    reply = await engine.generate(handle, sampling)
    assert reply.token_ids == fleet.reply and reply.finish_reason == "stop"
    assert reply.usage == TokenUsage(
        reused=len(prompt) // 128 * 128, prefilled=len(prompt) % 128, decoded=len(fleet.reply) + 1
    )
    assert handle.tokens == [*prompt, *fleet.reply] and len(fleet.completions) == requests + 1
    sent = fleet.completions[-1]
    assert sent["prompt"] == prompt and sent["cache_salt"] == cache_salt("tenant-a")
    assert sent["seed"] == transition_seed(1, 2) and sent["return_token_ids"] is True
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["min_p"], sent["repetition_penalty"]) == (
        0.7,
        0.9,
        0,
        0.0,
        1.0,
    )
    assert sorted(sent["stop_token_ids"]) == sorted(chat.stop_token_ids) and sent["skip_special_tokens"] is False
    await engine.crop(handle, len(prompt))
    assert handle.tokens == prompt
    assert await engine.generate(handle, Sampling(max_tokens=0)) == Generation([], "", "length", TokenUsage())
    assert len(fleet.completions) == requests + 1  # nothing to sample: nothing sent
    unsalted = await engine.open("u", tokens=prompt)
    warmed = await engine.warm(unsalted)  # computes now: a one-token request
    assert "cache_salt" not in fleet.completions[-1] and fleet.completions[-1]["max_tokens"] == 1
    assert warmed == TokenUsage(reused=len(prompt) // 128 * 128, prefilled=len(prompt) % 128)
    fleet.overreport = True
    lying = await engine.warm(unsalted)
    assert lying == TokenUsage(reused=len(prompt), prefilled=0)  # never more reused than the prompt holds
    await engine.close()
    assert not engine.ready


async def test_a_handle_moved_to_a_new_cache_generation_sends_its_salt(chat: ChatMLTemplate) -> None:
    """What engine_calls.sync does when a forget bumped the session's cache generation (runtime/salts.py)."""
    fleet = ScriptedFleet(chat)
    engine = remote(fleet)
    await engine.start()
    handle = await engine.open("s", salt=session_salt("tenant-a", "s"))
    prompt = [*chat.render_block("user", "Hi"), *chat.assistant_header()]
    await engine.prefill(handle, prompt)
    await engine.warm(handle)
    use_salt(engine, handle, session_salt("tenant-a", "s", 1))
    await engine.warm(handle)
    salts = [c["cache_salt"] for c in fleet.completions[-2:]]
    assert salts == [cache_salt(session_salt("tenant-a", "s")), cache_salt(session_salt("tenant-a", "s", 1))]
    assert len(set(salts)) == 2 and handle.tokens == prompt
    await engine.close()


async def test_a_fleet_without_lethes_plugin_decodes_replays(chat: ChatMLTemplate) -> None:
    """vLLM without Lethe's plugin beside it (vllm_plugin.py) reads no cache for a request that asks for prompt
    logprobs: the start-up probe finds nothing cached, and a replay's draft is decoded rather than verified by
    computing the session's whole log again."""
    fleet = ScriptedFleet(chat, plugin=False)
    engine = remote(fleet)
    await engine.start()
    assert not engine.verifies
    probe = fleet.completions[-1]
    assert probe["vllm_xargs"] == {"lethe_read_prefix_cache": 1} and probe["prompt_logprobs"] == 2
    assert probe["prompt"][:-1] == fleet.completions[-2]["prompt"] and len(probe["prompt"]) > 2 * 128
    prompt = [*chat.render_block("user", "Hi"), *chat.assistant_header()]
    handle = await engine.open("s", salt="tenant-a", tokens=prompt)
    reply = await engine.generate(handle, Sampling(temperature=0, max_tokens=50), draft=list(fleet.reply))
    assert "prompt_logprobs" not in fleet.completions[-1] and reply.token_ids == fleet.reply
    assert (reply.usage.verified, reply.usage.decoded) == (0, len(fleet.reply) + 1)
    await engine.close()

    plugged = ScriptedFleet(chat)
    with_plugin = remote(plugged)
    await with_plugin.start()
    assert with_plugin.verifies
    refusing = ScriptedFleet(chat)
    refusing.refuses_verification = True  # a vLLM that does not take a verifying request's fields: it still starts
    other = remote(refusing)
    await other.start()
    assert other.ready and not other.verifies
    await other.close()
    plugged.refuses_verification = True  # a verification the fleet refuses decodes instead of failing the replay
    handle = await with_plugin.open("s", salt="tenant-a", tokens=prompt)
    reply = await with_plugin.generate(handle, Sampling(temperature=0, max_tokens=50), draft=list(plugged.reply))
    assert "prompt_logprobs" in plugged.completions[-2] and "prompt_logprobs" not in plugged.completions[-1]
    assert reply.token_ids == plugged.reply and reply.usage.verified == 0
    await with_plugin.close()


async def test_remote_refuses_a_fleet_that_hides_cached_tokens(chat: ChatMLTemplate) -> None:
    engine = remote(ScriptedFleet(chat, details=False))
    with pytest.raises(RemoteEngineError, match="--enable-prompt-tokens-details"):
        await engine.start()
    assert not engine.ready


async def test_remote_refuses_a_fleet_with_another_tokenizer(chat: ChatMLTemplate) -> None:
    with pytest.raises(RemoteEngineError, match="tokenizer"):
        await remote(ScriptedFleet(chat, tokenizer_ok=False)).start()


async def test_remote_maps_fleet_errors_and_keeps_the_log(chat: ChatMLTemplate) -> None:
    fleet = ScriptedFleet(chat)
    engine = remote(fleet)
    await engine.start()
    handle = await engine.open("s", tokens=[1, 2, 3])
    with pytest.raises(ValueError, match="token ids"):
        await engine.prefill(handle, [10**6])  # caught locally, before any request
    assert handle.tokens == [1, 2, 3]
    with pytest.raises(ValueError, match="empty log"):
        await engine.generate(await engine.open("empty"), Sampling())
    stored = await engine.open("stored", tokens=[60000])  # a log from storage is not re-checked locally
    with pytest.raises(ValueError, match="rejected the request"):  # the fleet's 400
        await engine.generate(stored, Sampling())
    fleet.broken = True
    with pytest.raises(EngineUnavailable, match="failed the request"):  # a 5xx: a 503 for the client, to retry
        await engine.generate(handle, Sampling())
    assert handle.tokens == [1, 2, 3] and stored.tokens == [60000]
    await engine.close()


def test_the_plugin_drops_the_rows_a_cached_prompt_left_unfilled() -> None:
    """With cache reads kept for a verifying completion, vLLM answers the cached positions' prompt logprobs from an
    uninitialised buffer: a NaN there made the fleet answer 400 ("Out of range float values are not JSON compliant",
    met in bench.forget_bench), a negative id crashed its detokenizer. Such rows become None; computed rows stay."""
    computed = {17: Logprob(-0.5, 1, None), 23: Logprob(-1.5, 2, None)}
    masked = {17: Logprob(-0.5, 1, None), 9: Logprob(-math.inf, 2, None)}  # a computed row may hold -inf: kept
    rows = [None, {-4: Logprob(0.0, 1, None)}, {5: Logprob(math.nan, 1, None)}, {6: Logprob(math.inf, 3, None)},
            computed, masked]
    assert unfilled(rows) is rows and unfilled(None) is None  # in place: vLLM's choice is built from its own list
    assert rows == [None, None, None, None, computed, masked]
