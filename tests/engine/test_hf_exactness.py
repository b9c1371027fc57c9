"""Exactness: a cropped-and-replayed handle equals a fresh run of the same chunks, token for token and bit for bit.

This is what forgetting relies on (protocol.py): the random splits stand for transition boundaries.
"""

from __future__ import annotations

import random

from app.engine.hf import HFEngine
from app.engine.protocol import CacheHandle
from app.engine.sampling import transition_seed
from tests.engine.engine_helpers import GREEDY, conversation, kv_equal, run_chunks, sampled, split

N_SPLITS = 12
SPLIT_RNG_SEED = 20240611


async def test_crop_and_replay_equals_a_fresh_run_over_random_splits(engine: HFEngine) -> None:
    tokens = conversation(engine)
    rng = random.Random(SPLIT_RNG_SEED)
    checked = {"greedy": 0, "sampled": 0}
    for i in range(N_SPLITS):
        chunks = split(tokens, rng.sample(range(1, len(tokens)), rng.randint(1, 3)))
        distractor = engine.chat.render_block("user", f"Forget this: secret number {rng.randint(0, 10**6)}.")
        subject = await engine.open(f"subject-{i}")
        for chunk in chunks:
            await engine.prefill(subject, chunk)
        await engine.prefill(subject, distractor)
        await engine.generate(subject, sampled(seed=i, max_tokens=4))  # the work a forget removes
        for mode, sampling in (("greedy", GREEDY), ("sampled", sampled(transition_seed(7, i)))):
            # Restore to a chunk boundary past the first chunk and replay the rest in its chunks; keeping them all
            # replays nothing, so the logits of the last chunk must be recomputed, exactly.
            keep = rng.randint(1, len(chunks))
            await engine.crop(subject, sum(len(c) for c in chunks[:keep]))
            for chunk in chunks[keep:]:
                await engine.prefill(subject, chunk)
            replayed = await engine.generate(subject, sampling)
            fresh, reference = await run_chunks(engine, f"fresh-{i}-{mode}", chunks, sampling)
            assert replayed.token_ids == reference.token_ids, (i, mode, [len(c) for c in chunks], keep)
            assert replayed.text == reference.text and replayed.finish_reason == reference.finish_reason
            assert subject.tokens == fresh.tokens and engine.chunks(subject) == engine.chunks(fresh)
            assert kv_equal(engine, subject, fresh), (i, mode)
            checked[mode] += 1
            await engine.release(fresh)
        await engine.release(subject)
    assert checked == {"greedy": N_SPLITS, "sampled": N_SPLITS}


async def test_forget_one_transition_equals_the_session_without_it(engine: HFEngine) -> None:
    """The paper's case: transitions T1 T2 T3, T2 the target. Restore = crop to the end of T1, then replay T3; the
    result must equal the counterfactual session that never saw T2 (its index stays taken: seeds keep their index).
    """
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
        await engine.prefill(handle, chat.end_of_turn())  # a transition's closing tokens are prefilled inside it
        return reply.token_ids

    async def session(key: str, indices: list[int]) -> tuple[CacheHandle, dict[int, list[int]], dict[int, int]]:
        handle = await engine.open(key)
        await engine.prefill(handle, system)
        replies, ends = {}, {}
        for index in indices:
            replies[index] = await transition(handle, index)
            ends[index] = len(handle.tokens)  # the checkpoint offset after the transition
        return handle, replies, ends

    original, _, ends = await session("with-target", [1, 2, 3])
    counterfactual, expected, _ = await session("counterfactual", [1, 3])
    await engine.crop(original, ends[1])
    replayed = await transition(original, 3)
    assert replayed == expected[3]
    assert original.tokens == counterfactual.tokens
    assert kv_equal(engine, original, counterfactual)
