"""Greedy verification on the in-process vLLM engine (app/engine/vllm_verify.py), for real: a recorded reply given as
the draft comes back token for token as decoding gives it, from one request when it still holds; a draft that goes
wrong anywhere decodes from there; anything that cannot be certified, and every sampled or stop-string reply, is
decoded whole. Equal tokens are asserted against plain decoding of the same log, every time."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.engine import verify
from app.engine.protocol import CacheHandle, Generation, Sampling
from app.engine.vllm_local import VLLMEngine
from tests.engine_vllm.vllm_helpers import GREEDY, facts, salt, sampled


async def _prompt(engine: VLLMEngine, question: str) -> CacheHandle:
    handle = await engine.open("verify", salt=salt())
    chat = engine.chat
    context = facts(chat)[: -len(chat.assistant_header())]  # a system block and a long user block
    await engine.prefill(handle, [*context, *chat.render_block("user", question), *chat.assistant_header()])
    return handle


async def _twice(
    engine: VLLMEngine, sampling: Sampling, draft_of: Callable[[list[int]], list[int]], question: str
) -> tuple[Generation, Generation]:
    """The reply decoded, then the same log's reply computed again with `draft_of(decoded tokens)` as the draft."""
    handle = await _prompt(engine, question)
    prompt = len(handle.tokens)
    decoded = await engine.generate(handle, sampling)
    await engine.crop(handle, prompt)
    again = await engine.generate(handle, sampling, draft=draft_of(list(decoded.token_ids)))
    assert handle.tokens[prompt:] == again.token_ids
    assert (again.token_ids, again.text, again.finish_reason) == (
        decoded.token_ids, decoded.text, decoded.finish_reason
    )
    return decoded, again


async def test_an_unchanged_reply_is_verified_in_one_request(batched_engine: VLLMEngine) -> None:
    decoded, again = await _twice(batched_engine, GREEDY, lambda reply: reply, "Which box holds 21 apples?")
    assert decoded.usage.verified == 0 and decoded.finish_reason == "stop"
    # Every decision accepted from the draft, the stop token included; nothing decoded.
    assert (again.usage.verified, again.usage.decoded) == (len(decoded.token_ids) + 1, 0)
    assert again.usage.reused > 0  # the log's cached blocks still serve the verifying request


@pytest.mark.parametrize("at", [0, 2])
async def test_a_draft_wrong_at_one_token_decodes_from_there(batched_engine: VLLMEngine, at: int) -> None:
    def wrong(reply: list[int]) -> list[int]:
        return [*reply[:at], reply[at] + 1, *reply[at + 1 :]]

    decoded, again = await _twice(batched_engine, GREEDY, wrong, "What is my name?")
    assert len(decoded.token_ids) > at
    assert (again.usage.verified, again.usage.decoded) == (at, len(decoded.token_ids) - at + 1)


async def test_a_draft_cut_short_or_running_long_decodes_its_difference(batched_engine: VLLMEngine) -> None:
    decoded, short = await _twice(batched_engine, GREEDY, lambda reply: reply[:2], "How many apples are in box 3?")
    n = len(decoded.token_ids)
    assert (short.usage.verified, short.usage.decoded) == (2, n - 2 + 1)
    _, long = await _twice(batched_engine, GREEDY, lambda reply: [*reply, *reply], "How many apples are in box 3?")
    assert (long.usage.verified, long.usage.decoded) == (n, 1)  # the stop token, decided against the draft's next


async def test_a_decision_that_cannot_be_certified_decodes_the_whole_reply(
    batched_engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verify, "GREEDY_MARGIN", float("inf"))  # no gap clears it: as a near-tie would
    decoded, again = await _twice(batched_engine, GREEDY, lambda reply: reply, "Which box holds 14 apples?")
    assert (again.usage.verified, again.usage.decoded) == (0, decoded.usage.decoded)


@pytest.mark.parametrize(
    "sampling", [sampled(11), Sampling(temperature=0.0, max_tokens=24, stop=("apples",))], ids=["sampled", "stop"]
)
async def test_sampled_and_stop_string_replies_are_decoded(batched_engine: VLLMEngine, sampling: Sampling) -> None:
    decoded, again = await _twice(batched_engine, sampling, lambda reply: reply, "Which box holds 21 apples?")
    assert (again.usage.verified, again.usage.decoded) == (0, decoded.usage.decoded)


async def test_a_reply_that_fills_max_tokens_ends_on_length_as_decoding_does(batched_engine: VLLMEngine) -> None:
    """With room for exactly the recorded reply, decoding samples no stop token after it: nor may verification,
    though the request's next decision (a stop) is at hand."""
    question = "Which box holds 21 apples?"
    free, _ = await _twice(batched_engine, GREEDY, lambda reply: reply, question)
    assert free.finish_reason == "stop"
    exact = Sampling(temperature=0.0, max_tokens=len(free.token_ids))
    decoded, again = await _twice(batched_engine, exact, lambda reply: reply, question)
    assert decoded.finish_reason == "length" and decoded.token_ids == free.token_ids
    assert (again.usage.verified, again.usage.decoded) == (len(free.token_ids), 0)
