"""The in-process vLLM engine, for real: prefix reuse, crop-and-continue exactness, tenant isolation, and where vLLM
is *not* exact (measured, and kept true by these tests; docs/engines.md has the write-up)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from app.engine.priority import EngineWait, Priority, engine_priority, measure_wait
from app.engine.protocol import CacheHandle, KVEngine, Sampling, TokenUsage
from app.engine.sampling import transition_seed
from app.engine.vllm_local import VLLMEngine
from app.runtime.blocks import Observation, render
from app.runtime.engine_calls import Synced, advance
from tests.engine_vllm.vllm_helpers import (
    BLOCK,
    CHUNKING_LOGPROB_BOUND,
    GREEDY,
    added_while_paused,
    facts,
    max_abs_diff,
    salt,
    sampled,
    user_turn,
)
from tests.support import MODEL_CACHE

KV_CACHE_BYTES = 128 << 20  # ~2,900 float32 tokens (22 blocks) of SmolLM2: small enough to evict on purpose
MODES = {"greedy": GREEDY, "sampled": sampled(transition_seed(7, 3))}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine() -> AsyncIterator[VLLMEngine]:
    # One sequence at a time: the concurrency test below claims bit-exactness, which batching would not give.
    vllm = VLLMEngine(None, MODEL_CACHE, max_model_len=2048, kv_cache_bytes=KV_CACHE_BYTES, max_num_seqs=1)
    await vllm.start()
    yield vllm
    await vllm.close()


async def test_engine_is_a_kv_engine_with_128_token_blocks(engine: VLLMEngine) -> None:
    assert isinstance(engine, KVEngine) and engine.ready
    assert engine.name == "vllm" and engine.model_id == "SmolLM2-135M-Instruct"
    assert engine.block_size == BLOCK and engine.exactness == "unbatched"


async def test_a_transition_is_one_request_over_the_whole_log(
    engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefills only append; `generate` sends the whole log in one request, which reuses every full block earlier
    requests computed (decode-filled ones included) and computes the rest once: the previous turn's closing tokens,
    the new observation and at most the partial block before them. Its usage is vLLM's count for that request."""
    chat = engine.chat
    sent: list[list[int]] = []
    request = engine._request

    async def recording(handle: CacheHandle, log_ids: list[int], params: object) -> object:
        sent.append(list(log_ids))
        return await request(handle, log_ids, params)

    monkeypatch.setattr(engine, "_request", recording)
    handle = await engine.open("one-request", salt=salt())
    computed = 0  # tokens of the log whose KV an earlier request computed
    figures = []
    observations = [facts(chat), user_turn(chat, "How many apples are in box 3?"), user_turn(chat, "And box 9?")]
    for index, observation in enumerate(observations):
        if index:
            assert await engine.prefill(handle, []) == TokenUsage()
        assert await engine.prefill(handle, observation) == TokenUsage() and len(sent) == index
        prompt = list(handle.tokens)
        reply = await engine.generate(handle, GREEDY)
        assert sent[-1] == prompt and len(sent) == index + 1  # one request, over the whole log
        usage = reply.usage
        assert usage.reused == min(computed, len(prompt) - 1) // BLOCK * BLOCK
        assert usage.reused + usage.prefilled == len(prompt)
        assert usage.prefilled - (len(prompt) - computed) < BLOCK  # new tokens, at most one partial block again
        computed = len(prompt) + usage.decoded - 1  # every sampled token but the last was fed back
        figures.append((len(prompt), usage.reused, usage.prefilled))
    assert figures[0][1] == 0 and all(reused > 0 for _, reused, _ in figures[1:])
    print("one request per transition (prompt, reused, prefilled):", figures)


async def test_turn_usage_through_the_runtime_adds_up(engine: VLLMEngine) -> None:
    """The runtime's per-transition usage on the lazy engine: the one request's counts, closing tokens included in
    the next transition's prefill, never more computed than the prompt holds."""
    chat = engine.chat
    handle = await engine.open("runtime", salt=salt())
    synced = Synced(handle, chat.render_block("system", "You are a helpful assistant. Answer briefly."), 0)
    logged = 0
    for turn, text in enumerate(["Hi! Please help me plan my week.", "Suggest a time for my runs."], start=1):
        outcome = await advance(engine, synced, [render(chat, Observation("user", text))], sampled(turn, 16))
        usage = outcome.usage
        assert usage.prompt_tokens == usage.reused_tokens + usage.prefill_tokens
        assert 0 < usage.prefill_tokens <= usage.prompt_tokens and usage.closing_tokens == 0
        assert usage.prefill_tokens - (usage.prompt_tokens - logged) < BLOCK
        logged = usage.prompt_tokens + usage.decode_tokens - 1
        synced = Synced(handle, [], 0)
    silent = await advance(engine, synced, [render(chat, Observation("user", "Noted."))], None)
    assert silent.usage.prefill_tokens == 0 and silent.usage.prompt_tokens == len(handle.tokens)


@pytest.mark.parametrize("mode", MODES)
async def test_crop_then_continue_samples_what_a_fresh_run_over_the_same_tokens_samples(
    engine: VLLMEngine, mode: str
) -> None:
    """The replay after a crop in the middle of a block samples what a run of the final log in one request samples,
    under another tenant's salt (nothing shared), token for token, with logprobs within CHUNKING_LOGPROB_BOUND: the
    cut block is recomputed from its start in both, but the replay's earlier blocks were computed by the requests of
    turn 1 and its tail by a request of its own, where the fresh run computes the whole log in one pass, so equal
    bits rest on the CPU's kernels (docs/engines.md row 2; the bound explains). (The decode in turn 1 stays inside
    one block here; the next test is the case where it does not.)"""
    chat, sampling = engine.chat, MODES[mode]
    subject = await engine.open("subject", salt=salt())
    await engine.prefill(subject, facts(chat))
    await engine.generate(subject, sampling)
    keep = len(subject.tokens)
    assert keep // BLOCK == len(facts(chat)) // BLOCK, "turn 1 must not fill a block while decoding"
    await engine.prefill(subject, user_turn(chat, "My secret code is 4417 and I live at 12 Rue Cler, Paris."))
    await engine.generate(subject, sampling)  # the work the crop removes
    await engine.crop(subject, keep)
    assert keep % BLOCK, "the crop must cut a block"
    await engine.prefill(subject, user_turn(chat, "How many apples are in box 9? Then write a poem."))
    prompt = len(subject.tokens)
    fresh = await engine.open("fresh", salt=salt(), tokens=list(subject.tokens))
    replayed, reference = await engine.generate(subject, sampling), await engine.generate(fresh, sampling)
    assert replayed.usage.reused == keep // BLOCK * BLOCK  # the cut block and everything after it are recomputed
    assert (reference.usage.reused, reference.usage.prefilled) == (0, prompt)
    assert replayed.token_ids == reference.token_ids and replayed.text == reference.text
    for handle in (subject, fresh):
        await engine.crop(handle, prompt)
    replay_ids, replay_lp = await engine.sample_logprobs(subject, sampling)
    fresh_ids, fresh_lp = await engine.sample_logprobs(fresh, sampling)
    assert replay_ids == fresh_ids == replayed.token_ids[: len(replay_ids)]
    drift = max_abs_diff(replay_lp, fresh_lp)
    assert drift <= CHUNKING_LOGPROB_BOUND, (drift, replay_lp, fresh_lp)
    print(f"[{mode}] replay after a crop vs one request over the log: max |d logprob| = {drift:.3g}")


async def test_forget_one_transition_equals_the_counterfactual_session(engine: VLLMEngine) -> None:
    """The paper's case on vLLM: T1 T2 T3 with T2 the target; crop to the end of T1 and replay T3. The counterfactual
    runs T1 T3 with the same calls under another salt, so it computes every block itself, including blocks filled
    while decoding. Same calls, same blocks, same bits."""
    chat = engine.chat
    padding = 30
    while len(system := chat.render_block("system", "You are a helpful assistant." + " Be kind." * padding)) < 220:
        padding += 1  # a system block that ends a little before the second block boundary
    observations = {
        1: [*chat.render_block("user", "My favourite colour is green. Say why it is nice."), *chat.assistant_header()],
        2: [*chat.render_block("user", "My home address is 12 Rue Cler, Paris."), *chat.assistant_header()],
        3: [*chat.render_block("user", "Where do I live, and what is my favourite colour?"), *chat.assistant_header()],
    }

    async def session(indices: list[int]) -> tuple[CacheHandle, dict[int, list[int]], dict[int, int]]:
        handle = await engine.open(f"session-{indices}", salt=salt())
        await engine.prefill(handle, system)
        replies, ends = {}, {}
        for index in indices:
            await engine.prefill(handle, observations[index])
            reply = await engine.generate(handle, sampled(transition_seed(99, index), max_tokens=40))
            await engine.prefill(handle, chat.end_of_turn())
            replies[index], ends[index] = reply.token_ids, len(handle.tokens)
        return handle, replies, ends

    original, _, ends = await session([1, 2, 3])
    counterfactual, expected, _ = await session([1, 3])
    assert len(system) < 2 * BLOCK <= ends[1], "T1's reply must fill a block while decoding"
    await engine.crop(original, ends[1])
    await engine.prefill(original, observations[3])
    replayed = await engine.generate(original, sampled(transition_seed(99, 3), max_tokens=40))
    await engine.prefill(original, chat.end_of_turn())
    assert replayed.token_ids == expected[3]
    assert original.tokens == counterfactual.tokens
    probe = sampled(1234)
    assert await engine.sample_logprobs(original, probe) == await engine.sample_logprobs(counterfactual, probe)


async def test_finding_blocks_filled_while_decoding_differ_from_a_prefill_in_the_last_bits(engine: VLLMEngine) -> None:
    """NOT exact: a block completed by decode steps is cached with KV computed one token at a time; a run that
    prefills the same tokens computes it in one pass, and float32 kernels round differently (measured: logprobs
    differ by up to ~2e-5 on 8 of 8 prompts, tokens equal on 8 of 8). A replay that reuses the original's blocks is
    exact (previous test); one whose blocks were evicted and recomputed by a prefill is only this close."""
    chat, sampling = engine.chat, sampled(501)
    question = chat.render_block("user", "Write a long story about a sailor and the sea.")
    prompt = [*facts(chat, 40)[: 2 * BLOCK - 16 - len(question) - 3], *question, *chat.assistant_header()]
    subject = await engine.open("decoded", salt=salt())
    await engine.prefill(subject, prompt)
    story = await engine.generate(subject, sampled(500, max_tokens=60))
    assert len(prompt) < 2 * BLOCK < len(prompt) + len(story.token_ids), "the story must complete block 2"
    await engine.prefill(subject, user_turn(chat, "Now summarise it in one line."))
    usage = await engine.warm(subject)
    assert usage.reused >= 2 * BLOCK  # block 2, decode-filled, comes from the cache
    fresh = await engine.open("prefilled", salt=salt(), tokens=list(subject.tokens))
    cached_ids, cached_lp = await engine.sample_logprobs(subject, sampling)
    fresh_ids, fresh_lp = await engine.sample_logprobs(fresh, sampling)
    assert cached_ids == fresh_ids
    drift = max_abs_diff(cached_lp, fresh_lp)
    assert 0 < drift < 1e-3, drift
    print(f"decode-filled block vs prefill: max |d logprob| = {drift:.3g} over {len(cached_lp)} tokens")


async def test_finding_reuse_is_block_granular_and_a_whole_cached_log_recomputes_its_last_block(
    engine: VLLMEngine,
) -> None:
    chat = engine.chat
    tokens = facts(chat, 40)[: 2 * BLOCK]  # exactly two blocks
    handle = await engine.open("aligned", salt=salt(), tokens=tokens)
    first = await engine.warm(handle)
    again = await engine.warm(handle)  # the same log, all of it cached
    assert (first.reused, first.prefilled) == (0, 2 * BLOCK)
    # vLLM must compute at least the last prompt token, and it serves whole blocks: the last block is recomputed.
    assert (again.reused, again.prefilled) == (BLOCK, BLOCK)
    await engine.crop(handle, 2 * BLOCK - 1)
    cut = await engine.warm(handle)
    assert (cut.reused, cut.prefilled) == (BLOCK, BLOCK - 1)


async def test_cache_salt_keeps_tenants_apart(engine: VLLMEngine) -> None:
    tokens = facts(engine.chat)
    tenant_a, tenant_b = salt(), salt()
    a = await engine.open("a", salt=tenant_a, tokens=tokens)
    assert (await engine.warm(a)).reused == 0
    b = await engine.open("b", salt=tenant_b, tokens=tokens)
    assert (await engine.warm(b)).reused == 0  # the same tokens under another salt share nothing
    a2 = await engine.open("a2", salt=tenant_a, tokens=tokens)
    assert (await engine.warm(a2)).reused == len(tokens) // BLOCK * BLOCK


async def test_fork_shares_the_cached_blocks(engine: VLLMEngine) -> None:
    handle = await engine.open("parent", salt=salt())
    await engine.prefill(handle, facts(engine.chat))
    twin = await engine.fork(handle, "twin")
    assert twin.tokens == handle.tokens and twin.salt == handle.salt and twin.tokens is not handle.tokens
    mine, theirs = await engine.generate(handle, GREEDY), await engine.generate(twin, GREEDY)
    assert mine.token_ids == theirs.token_ids
    assert theirs.usage.reused == (len(twin.tokens) - len(theirs.token_ids)) // BLOCK * BLOCK


async def test_concurrent_sessions_are_exact_and_the_loop_stays_free(
    engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_num_seqs=1 (exactness "unbatched") runs one sequence at a time: concurrent calls give the solo results bit
    for bit. (With batching, logprobs of batched requests differ: `python -m bench.vllm_batching` measures how often.)

    And the loop stays free while the engine computes: the second call's request reaches vLLM's engine core while
    the first one's is still being computed there, and a callback the loop is given as each request goes in runs
    before any answer comes back. A call that held the loop until its answer (a blocking wait for the engine core)
    would answer the first request before the second one is sent, and run the callbacks only afterwards."""
    chat = engine.chat
    logs = [facts(chat, 20), [*chat.render_block("user", "Tell me about tea and sailing."), *chat.assistant_header()]]
    probe = sampled(42, max_tokens=16)

    async def run_all(concurrently: bool) -> list[tuple[list[int], list[float]]]:
        handles = [await engine.open(f"c{i}", salt=salt(), tokens=list(log)) for i, log in enumerate(logs)]
        if concurrently:
            return list(await asyncio.gather(*(engine.sample_logprobs(h, probe) for h in handles)))
        return [await engine.sample_logprobs(h, probe) for h in handles]

    solo = await run_all(concurrently=False)
    loop = asyncio.get_running_loop()
    events: list[str] = []  # in the order the loop saw them
    llm = engine._started()
    add, request = llm.engine_core.add_request_async, engine._request

    async def adding(core_request: object) -> None:
        await add(core_request)
        events.append("added")  # in the engine core now
        loop.call_soon(events.append, "loop ran")

    async def answered(handle: CacheHandle, log_ids: list[int], params: object) -> object:
        output = await request(handle, log_ids, params)
        events.append("answered")
        return output

    monkeypatch.setattr(llm.engine_core, "add_request_async", adding)
    monkeypatch.setattr(engine, "_request", answered)
    together = await run_all(concurrently=True)
    assert together == solo
    assert sorted(events[:4]) == ["added", "added", "loop ran", "loop ran"], events
    assert events[4:] == ["answered", "answered"], events


async def test_a_forget_s_request_is_scheduled_before_a_live_one_queued_earlier(
    engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM runs with priority scheduling, and each request carries its task's priority (app/engine/priority.py;
    vLLM serves lower values first). Forced: the scheduler is paused (in-flight requests kept), a live request and
    then a forget's are added, and only once vLLM's engine core has both (the adds went out on its input socket
    before the resume does) is it resumed: one sequence at a time (max_num_seqs=1), the forget's runs first."""
    llm = engine._started()
    sent: list[int] = []
    added = asyncio.Queue[None]()
    generate, add = llm.generate, llm.engine_core.add_request_async

    def recording(*args: object, **kwargs: object) -> object:
        sent.append(int(kwargs.get("priority", 0)))  # type: ignore[call-overload]
        return generate(*args, **kwargs)

    async def adding(request: object) -> None:
        await add(request)
        added.put_nowait(None)

    monkeypatch.setattr(llm, "generate", recording)
    monkeypatch.setattr(llm.engine_core, "add_request_async", adding)
    chat = engine.chat
    tokens = [*chat.render_block("user", "Name three colours."), *chat.assistant_header()]
    live = await engine.open("prio-live", salt=salt(), tokens=list(tokens))
    urgent = await engine.open("prio-forget", salt=salt(), tokens=list(tokens))
    finished: list[str] = []

    async def run(handle: CacheHandle, name: str, level: Priority) -> None:
        with engine_priority(level):
            await engine.generate(handle, GREEDY)
        finished.append(name)

    await llm.pause_generation(mode="keep", clear_cache=False)
    try:
        tasks = [asyncio.create_task(run(live, "live", Priority.LIVE))]
        await asyncio.wait_for(added.get(), 60)
        tasks.append(asyncio.create_task(run(urgent, "forget", Priority.FORGET)))
        await asyncio.wait_for(added.get(), 60)
    finally:
        await llm.resume_generation()
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    assert sent == [0, -1]
    assert finished == ["forget", "live"]


async def test_a_request_reports_its_wait_and_vllm_registers_no_metrics(
    engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget's engine wait on vLLM is the time its request spent in vLLM's queue (app/engine/vllm_stats.py): added
    while vLLM is paused, it waits at least as long as the pause lasts once the engine core has it. The core queued it
    before it answers `is_paused` (one input socket, in order), and the pause then lasts 0.3 s more (`hold`: a delay
    the test makes, not a race it waits for): the measured wait cannot be shorter. vLLM keeps those timestamps only
    with stats on, and the stats must not bring vLLM's Prometheus metrics into the process."""
    from prometheus_client import REGISTRY

    llm = engine._started()
    held: list[float] = []

    async def forget_work(handle: CacheHandle) -> EngineWait:
        with engine_priority(Priority.FORGET), measure_wait() as waited:
            await engine.generate(handle, GREEDY)
        return waited

    async def hold() -> None:
        assert await llm.is_paused()  # answered after the engine core queued the request
        held_from = time.monotonic()
        await asyncio.sleep(0.3)
        held.append(time.monotonic() - held_from)

    tokens = [*engine.chat.render_block("user", "Hi."), *engine.chat.assistant_header()]
    handle = await engine.open("waits", salt=salt(), tokens=tokens)
    task = await added_while_paused(engine, monkeypatch, forget_work(handle), hold)
    waited = await asyncio.wait_for(task, 120)
    assert waited.calls == 1 and waited.seconds >= held[0], (waited, held)
    assert not [metric.name for metric in REGISTRY.collect() if metric.name.startswith("vllm")]


async def test_cache_misses_are_detected_after_eviction(engine: VLLMEngine) -> None:
    """The cache is an optimisation: an evicted log is recomputed (by a prefill, so possibly not bit-exact for
    decode-filled blocks) and the engine counts it, so a replay can say whether it reused the original's blocks."""
    chat = engine.chat
    handle = await engine.open("evicted", salt=salt())
    await engine.prefill(handle, facts(chat))
    await engine.generate(handle, GREEDY)
    misses = engine.cache_misses
    filler = facts(chat, 300)[:1600]  # two of these (26 blocks) overflow the 22 blocks and push the LRU ones out
    for _ in range(2):
        await engine.warm(await engine.open("filler", salt=salt(), tokens=filler))
    await engine.prefill(handle, user_turn(chat, "Still there?"))
    usage = (await engine.generate(handle, GREEDY)).usage
    assert usage.reused == 0 and engine.cache_misses == misses + 1


async def test_generation_conventions(engine: VLLMEngine) -> None:
    chat = engine.chat
    handle = await engine.open("conventions", salt=salt())
    await engine.prefill(handle, [*chat.render_block("user", "Say hi."), *chat.assistant_header()])
    before = len(handle.tokens)
    reply = await engine.generate(handle, Sampling(max_tokens=200))
    assert reply.finish_reason == "stop"  # it ended on <|im_end|>, which is not in the result nor in the log
    assert not set(reply.token_ids) & chat.stop_token_ids
    assert handle.tokens[before:] == reply.token_ids and reply.text == chat.decode(reply.token_ids)
    assert reply.usage.decoded == len(reply.token_ids) + 1
    await engine.prefill(handle, user_turn(chat, "Count from one to ten in words, separated by commas."))
    short = await engine.generate(handle, Sampling(max_tokens=3))
    assert short.finish_reason == "length" and len(short.token_ids) == short.usage.decoded == 3
    await engine.crop(handle, len(handle.tokens) - 3)
    cut = await engine.generate(handle, Sampling(max_tokens=50, stop=(".",)))
    assert cut.finish_reason == "stop" and "." not in cut.text and "." in chat.decode(cut.token_ids)
    assert handle.tokens[-len(cut.token_ids) :] == cut.token_ids  # a stop string's tokens stay in the log, as in hf
    nothing = await engine.generate(handle, Sampling(max_tokens=0))
    assert nothing.token_ids == [] and nothing.usage == TokenUsage()  # nothing sampled, nothing computed yet


async def test_misuse_is_rejected(engine: VLLMEngine) -> None:
    handle = await engine.open("misuse")
    with pytest.raises(ValueError, match="empty log"):
        await engine.generate(handle, GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        await engine.prefill(handle, [10**7])
    with pytest.raises(ValueError, match="crop"):
        await engine.crop(handle, 1)
    with pytest.raises(ValueError, match="context"):
        await engine.prefill(handle, [1] * 4096)
    assert handle.tokens == []
