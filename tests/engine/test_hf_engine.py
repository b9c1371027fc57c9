"""The hf engine's calls against the real tiny model: accounting, stops, crop, fork, eviction, the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from app.engine import hf_cache
from app.engine.hf import HFEngine
from app.engine.protocol import CacheHandle, KVEngine, Sampling, TokenUsage
from tests.engine.engine_helpers import GREEDY, conversation, kv_equal, run_chunks, sampled


def test_is_a_kv_engine(engine: HFEngine) -> None:
    assert isinstance(engine, KVEngine)
    assert engine.ready and engine.name == "hf" and engine.model_id == "SmolLM2-135M-Instruct"


async def test_usage_accounting(engine: HFEngine) -> None:
    tokens = conversation(engine)
    handle = await engine.open("usage")
    assert await engine.prefill(handle, tokens[:30]) == TokenUsage(reused=0, prefilled=30)
    assert await engine.prefill(handle, tokens[30:]) == TokenUsage(reused=30, prefilled=len(tokens) - 30)
    gen = await engine.generate(handle, Sampling(max_tokens=5))
    assert gen.finish_reason == "length" and len(gen.token_ids) == 5
    assert gen.usage == TokenUsage(reused=len(tokens), prefilled=0, decoded=5)
    assert handle.tokens == tokens + gen.token_ids
    # A generation leaves its reply pending: the closing prefills it with the end of turn, in one chunk, so the
    # transition's cache is the same whether its reply was decoded or verified (hf.py).
    closing = engine.chat.end_of_turn()
    usage = await engine.prefill(handle, closing)
    assert usage == TokenUsage(reused=len(tokens), prefilled=5 + len(closing))
    assert engine.chunks(handle) == [30, len(tokens) - 30, 5 + len(closing)]
    assert await engine.prefill(handle, []) == TokenUsage(reused=len(handle.tokens), prefilled=0)


async def test_stop_token_ends_the_turn_and_is_not_logged(engine: HFEngine) -> None:
    chat = engine.chat
    prompt = [*chat.render_block("user", "Say only: yes"), *chat.assistant_header()]
    handle, gen = await run_chunks(engine, "stop-token", [prompt], Sampling(max_tokens=40))
    assert gen.finish_reason == "stop"
    assert gen.usage.decoded == len(gen.token_ids) + 1  # the stop token was sampled, then left out
    assert not set(gen.token_ids) & chat.stop_token_ids
    assert handle.tokens == prompt + gen.token_ids
    assert sum(engine.chunks(handle)) == len(prompt)  # the reply is pending, for the closing's one chunk


async def test_stop_strings(engine: HFEngine) -> None:
    tokens = conversation(engine)
    handle, full = await run_chunks(engine, "stop-string", [tokens], Sampling(max_tokens=16))
    assert full.finish_reason == "length" and len(full.text) > 20
    stop = full.text[12:15]
    cut = full.text.find(stop)
    await engine.crop(handle, len(tokens))
    stopped = await engine.generate(handle, Sampling(max_tokens=16, stop=("never appears", stop)))
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[:cut]
    assert stopped.token_ids == full.token_ids[: len(stopped.token_ids)]
    assert stop in engine.chat.decode(stopped.token_ids)  # the log keeps the exact sampled tokens
    assert stop not in engine.chat.decode(stopped.token_ids[:-1])
    assert handle.tokens == tokens + stopped.token_ids


async def test_max_tokens_zero_and_length(engine: HFEngine) -> None:
    tokens = conversation(engine)
    handle = await engine.open("length")
    await engine.prefill(handle, tokens)
    nothing = await engine.generate(handle, Sampling(max_tokens=0))
    assert nothing.token_ids == [] and nothing.finish_reason == "length" and nothing.usage.decoded == 0
    three = await engine.generate(handle, sampled(seed=1, max_tokens=3))
    assert three.finish_reason == "length" and len(three.token_ids) == 3 and three.usage.decoded == 3


async def test_crop_bounds(engine: HFEngine) -> None:
    handle = await engine.open("bounds")
    await engine.prefill(handle, conversation(engine)[:20])
    for bad in (-1, 21):
        with pytest.raises(ValueError):
            await engine.crop(handle, bad)
    assert len(handle.tokens) == 20
    await engine.crop(handle, 20)
    await engine.crop(handle, 0)
    assert handle.tokens == [] and engine.chunks(handle) == []
    with pytest.raises(ValueError, match="empty log"):
        await engine.generate(handle, GREEDY)


async def test_crop_inside_a_chunk_makes_its_rest_pending(engine: HFEngine) -> None:
    tokens = conversation(engine)
    handle = await engine.open("mid-chunk")
    await engine.prefill(handle, tokens[:40])
    await engine.prefill(handle, tokens[40:])
    await engine.crop(handle, 50)
    assert engine.chunks(handle) == [40] and len(handle.tokens) == 50
    usage = await engine.prefill(handle, tokens[50:])
    assert usage == TokenUsage(reused=40, prefilled=len(tokens) - 40)
    replayed = await engine.generate(handle, GREEDY)
    fresh, reference = await run_chunks(engine, "mid-chunk-fresh", [tokens[:40], tokens[40:]], GREEDY)
    assert replayed.token_ids == reference.token_ids
    assert kv_equal(engine, handle, fresh)


async def test_generate_right_after_a_crop_recomputes_the_last_chunk(engine: HFEngine) -> None:
    tokens = conversation(engine)
    handle, _ = await run_chunks(engine, "recompute", [tokens[:60], tokens[60:]], sampled(seed=5))
    await engine.crop(handle, len(tokens))
    again = await engine.generate(handle, sampled(seed=5))
    assert again.usage == TokenUsage(reused=60, prefilled=len(tokens) - 60, decoded=again.usage.decoded)
    fresh, reference = await run_chunks(engine, "recompute-fresh", [tokens[:60], tokens[60:]], sampled(seed=5))
    assert again.token_ids == reference.token_ids
    assert kv_equal(engine, handle, fresh)


async def test_eviction_and_rebuild_give_the_same_tokens(engine: HFEngine) -> None:
    tokens = conversation(engine)
    closing = engine.chat.end_of_turn()

    async def build(key: str) -> CacheHandle:
        handle = await engine.open(key)
        await engine.prefill(handle, tokens[:50])
        await engine.prefill(handle, tokens[50:])
        await engine.generate(handle, sampled(seed=3, max_tokens=6))  # ends on length: one token pending
        await engine.prefill(handle, closing)
        return handle

    evicted = await build("evict-me")
    budget = engine.memory_budget_bytes
    try:
        engine.memory_budget_bytes = 0  # only the handle in use may stay resident
        other = await engine.open("pusher")
        await engine.prefill(other, tokens[:10])
        assert not engine.is_resident(evicted) and engine.is_resident(other)
    finally:
        engine.memory_budget_bytes = budget
    reference = await build("stays")
    chunks = engine.chunks(evicted)
    assert chunks == engine.chunks(reference)
    follow_up = engine.chat.assistant_header()
    usage = await engine.prefill(evicted, follow_up)
    assert usage == TokenUsage(reused=0, prefilled=len(evicted.tokens))  # the rebuild is measured, not hidden
    await engine.prefill(reference, follow_up)
    assert engine.chunks(evicted) == engine.chunks(reference)
    assert kv_equal(engine, evicted, reference)
    for seed in (0, 11):
        a = await engine.generate(evicted, sampled(seed=seed, max_tokens=8))
        b = await engine.generate(reference, sampled(seed=seed, max_tokens=8))
        assert a.token_ids == b.token_ids


async def test_release_keeps_the_log_and_the_recipe(engine: HFEngine) -> None:
    tokens = conversation(engine)
    handle, first = await run_chunks(engine, "release", [tokens[:25], tokens[25:]], GREEDY)
    await engine.release(handle)
    assert not engine.is_resident(handle) and handle.tokens[: len(tokens)] == tokens
    await engine.crop(handle, len(tokens))
    again = await engine.generate(handle, GREEDY)
    assert again.token_ids == first.token_ids
    assert again.usage.prefilled == len(tokens) and again.usage.reused == 0


async def test_fork_is_independent(engine: HFEngine) -> None:
    tokens = conversation(engine)
    parent, _ = await run_chunks(engine, "parent", [tokens], Sampling(max_tokens=0))
    child = await engine.fork(parent, "child")
    assert child.tokens == parent.tokens and child.tokens is not parent.tokens
    assert kv_equal(engine, parent, child)
    await engine.crop(child, 10)  # the child rewrites its past...
    await engine.prefill(child, engine.chat.render_block("user", "Something else entirely."))
    await engine.generate(child, sampled(seed=2))
    assert parent.tokens == tokens  # ...and the parent neither sees it in its log nor in its cache
    from_parent = await engine.generate(parent, GREEDY)
    fresh, reference = await run_chunks(engine, "parent-fresh", [tokens], GREEDY)
    assert from_parent.token_ids == reference.token_ids
    assert kv_equal(engine, parent, fresh)


async def test_a_handle_built_from_a_stored_log(engine: HFEngine) -> None:
    tokens = conversation(engine)
    stored = CacheHandle(session_key="stored", tokens=list(tokens))
    assert await engine.prefill(stored, []) == TokenUsage(reused=0, prefilled=len(tokens))
    foreign = CacheHandle(session_key="foreign", tokens=[1, 2], state=object())
    with pytest.raises(ValueError, match="another engine"):
        await engine.prefill(foreign, [3])


async def test_a_log_edited_by_the_caller_is_recomputed_from_the_last_agreeing_chunk(engine: HFEngine) -> None:
    tokens = conversation(engine)
    handle, _ = await run_chunks(engine, "edited", [tokens[:30], tokens[30:60], tokens[60:]], Sampling(max_tokens=0))
    handle.tokens[45] = tokens[46]
    usage = await engine.prefill(handle, [])
    assert usage == TokenUsage(reused=30, prefilled=len(tokens) - 30)
    assert engine.chunks(handle) == [30, len(tokens) - 30]


async def test_bad_token_ids_are_refused(engine: HFEngine) -> None:
    handle = await engine.open("bad-ids")
    with pytest.raises(ValueError, match="token ids"):
        await engine.prefill(handle, [1, 10**9])
    assert handle.tokens == []


async def test_model_work_does_not_block_the_event_loop(engine: HFEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward pass runs while the event loop goes on serving: the pass, held at its start, asks the loop to run a
    callback and waits for it before it computes. On the loop's own thread that callback could never run (the loop
    is stuck in the pass), and the wait would end unanswered (its limit only bounds that bug)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    passes: list[tuple[int, bool]] = []  # per forward pass: its thread, and whether the loop ran while it was held
    forward = hf_cache.forward

    def held(*args: Any) -> int:
        loop_ran = threading.Event()
        loop.call_soon_threadsafe(loop_ran.set)
        passes.append((threading.get_ident(), loop_ran.wait(timeout=60)))
        return forward(*args)

    monkeypatch.setattr(hf_cache, "forward", held)
    handle = await engine.open("loop")
    tokens = conversation(engine)
    assert await engine.prefill(handle, tokens) == TokenUsage(reused=0, prefilled=len(tokens))
    assert passes and all(ran for _, ran in passes), passes
    assert loop_thread not in {thread for thread, _ in passes}


async def test_a_stored_recipe_rebuilds_the_same_cache(engine: HFEngine) -> None:
    """After a restart, a log reopened with its chunk recipe continues exactly as the live handle does."""
    tokens = conversation(engine)
    live, _ = await run_chunks(engine, "live", [tokens[:33], tokens[33:]], sampled(seed=8, max_tokens=5))
    await engine.prefill(live, engine.chat.end_of_turn())
    reopened = await engine.open("reopened", tokens=list(live.tokens), chunks=engine.chunks(live))
    assert not engine.is_resident(reopened)
    follow_up = engine.chat.render_block("user", "And then?") + engine.chat.assistant_header()
    usage = await engine.prefill(reopened, follow_up)
    assert usage == TokenUsage(reused=0, prefilled=len(live.tokens) + len(follow_up))
    await engine.prefill(live, follow_up)
    assert kv_equal(engine, live, reopened)
    a, b = await engine.generate(live, sampled(seed=4)), await engine.generate(reopened, sampled(seed=4))
    assert a.token_ids == b.token_ids
    with pytest.raises(ValueError, match="chunks"):
        await engine.open("bad", tokens=[1, 2], chunks=[3])
