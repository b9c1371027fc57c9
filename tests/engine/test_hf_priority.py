"""A forget goes first on the real hf engine, and changes no token: a reply paused mid-way for a more urgent
generation produces the tokens it produces unpaused, and a forget's replay interleaved with live replies still equals
its counterfactual, token for token and bit for bit, as the live replies equal theirs.

Interleavings are forced: a live reply's token callback (on the engine's worker thread, between two decode steps)
holds the worker until the urgent call is queued, so the urgent call arrives while the reply is mid-way, every time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from app.engine.hf import HFEngine
from app.engine.priority import Priority, engine_priority, measure_wait
from app.engine.protocol import CacheHandle, Generation, Sampling
from app.engine.sampling import transition_seed
from tests.engine.engine_helpers import conversation, kv_equal, sampled

BOUND_S = 120  # bounds a bug, never paces a test
T = TypeVar("T")


def hold_until_queued(engine: HFEngine, level: Priority) -> None:
    """On the worker thread: wait until a call at `level` is queued (a barrier on the queue's state)."""
    assert engine._worker.wait_queued(level, BOUND_S), "the urgent call was never queued"


class Interrupting:
    """A token callback that, at the reply's `at`-th token, starts `urgent()` on the loop and holds the reply until the
    urgent work's first engine call is queued; logs each token of the reply as "live" in `log`."""

    def __init__(
        self, engine: HFEngine, at: int, level: Priority, urgent: Callable[[], Coroutine[Any, Any, T]],
        log: list[str] | None = None,
    ) -> None:
        self.engine, self.at, self.level, self._urgent = engine, at, level, urgent
        self.loop = asyncio.get_running_loop()
        self.log = [] if log is None else log
        self.count = 0
        self.started: concurrent.futures.Future[T] | None = None

    def __call__(self, tokens: list[int]) -> None:
        self.count += len(tokens)
        self.log.extend("live" for _ in tokens)
        if self.count == self.at:
            self.started = asyncio.run_coroutine_threadsafe(self._urgent(), self.loop)
            hold_until_queued(self.engine, self.level)

    async def result(self) -> T:
        assert self.started is not None, "the reply ended before the urgent work started"
        return await asyncio.wait_for(asyncio.wrap_future(self.started), BOUND_S)


async def prepared(engine: HFEngine, key: str) -> CacheHandle:
    handle = await engine.open(key)
    await engine.prefill(handle, conversation(engine))
    return handle


async def alone(engine: HFEngine, key: str, sampling: Sampling) -> Generation:
    handle = await prepared(engine, key)
    try:
        return await engine.generate(handle, sampling)
    finally:
        await engine.release(handle)


async def test_a_reply_paused_mid_way_for_a_forget_equals_the_same_reply_unpaused(engine: HFEngine) -> None:
    live_sampling, urgent_sampling = sampled(seed=11, max_tokens=16), sampled(seed=12, max_tokens=8)
    reference = await alone(engine, "paused-reference", live_sampling)
    urgent_reference = await alone(engine, "urgent-reference", urgent_sampling)
    assert len(reference.token_ids) > 4  # long enough to be paused mid-way

    live = await prepared(engine, "paused-live")
    urgent = await prepared(engine, "paused-urgent")
    pauses = engine._worker.pauses
    log: list[str] = []

    async def forget_call() -> Generation:
        with engine_priority(Priority.FORGET):
            return await engine.generate(urgent, urgent_sampling, lambda t: log.extend("urgent" for _ in t))

    spy = Interrupting(engine, 3, Priority.FORGET, forget_call, log)
    with measure_wait() as waited:
        paused = await asyncio.wait_for(engine.generate(live, live_sampling, spy), BOUND_S)
    interrupted = await spy.result()
    assert paused.token_ids == reference.token_ids and paused.text == reference.text
    assert paused.finish_reason == reference.finish_reason
    assert interrupted.token_ids == urgent_reference.token_ids
    # The forget's whole generation ran between the reply's third and fourth token.
    n_live, n_urgent = len(paused.token_ids), len(interrupted.token_ids)
    assert log == ["live"] * 3 + ["urgent"] * n_urgent + ["live"] * (n_live - 3)
    assert engine._worker.pauses == pauses + 1
    assert waited.calls == 1 and waited.seconds > 0  # the reply waited while the forget's generation ran
    await engine.release(live)
    await engine.release(urgent)


async def test_a_replay_interleaved_with_live_replies_equals_its_counterfactual(engine: HFEngine) -> None:
    """The paper's case (test_hf_exactness.py), with the replay run at forget priority while three live sessions
    generate: the replay preempts them between decode steps, and every sequence still equals its run alone."""
    chat = engine.chat
    system = chat.render_block("system", "You are a helpful assistant.")
    observations = {
        1: [*chat.render_block("user", "My favourite colour is green."), *chat.assistant_header()],
        2: [*chat.render_block("user", "My home address is 12 Rue Cler, Paris."), *chat.assistant_header()],
        3: [*chat.render_block("user", "Where do I live, and what is my favourite colour?"), *chat.assistant_header()],
    }

    async def transition(handle: CacheHandle, index: int) -> list[int]:
        await engine.prefill(handle, observations[index])
        reply = await engine.generate(handle, sampled(transition_seed(99, index), max_tokens=10))
        await engine.prefill(handle, chat.end_of_turn())
        return reply.token_ids

    async def session(key: str, indices: list[int]) -> tuple[CacheHandle, dict[int, list[int]], dict[int, int]]:
        handle = await engine.open(key)
        await engine.prefill(handle, system)
        replies, ends = {}, {}
        for index in indices:
            replies[index] = await transition(handle, index)
            ends[index] = len(handle.tokens)
        return handle, replies, ends

    original, _, ends = await session("interleaved-original", [1, 2, 3])
    counterfactual, expected, _ = await session("interleaved-counterfactual", [1, 3])
    live_samplings = [sampled(seed=20 + i, max_tokens=24) for i in range(3)]
    references = [await alone(engine, f"interleaved-live-ref-{i}", s) for i, s in enumerate(live_samplings)]
    lives = [await prepared(engine, f"interleaved-live-{i}") for i in range(3)]
    pauses = engine._worker.pauses

    async def replay() -> list[int]:
        with engine_priority(Priority.FORGET):
            await engine.crop(original, ends[1])
            return await transition(original, 3)

    spy = Interrupting(engine, 2, Priority.FORGET, replay)
    generations = await asyncio.wait_for(asyncio.gather(
        engine.generate(lives[0], live_samplings[0], spy),
        *(engine.generate(h, s) for h, s in zip(lives[1:], live_samplings[1:], strict=True)),
    ), BOUND_S)
    replayed = await spy.result()
    assert replayed == expected[3]
    assert original.tokens == counterfactual.tokens
    assert kv_equal(engine, original, counterfactual)
    for generation, reference in zip(generations, references, strict=True):
        assert generation.token_ids == reference.token_ids
    assert engine._worker.pauses > pauses  # the replay did run between the live reply's decode steps
    for handle in (original, counterfactual, *lives):
        await engine.release(handle)
