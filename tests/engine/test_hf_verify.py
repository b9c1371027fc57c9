"""Verified generation (app/engine/verify.py, HFEngine.generate's draft): the certification on crafted logits, and on
the real tiny model a draft's generation equals decoding's, token for token and cache bit for bit."""

from __future__ import annotations

import pytest
import torch

from app.engine import verify
from app.engine.hf import HFEngine
from app.engine.protocol import CacheHandle, Generation, Sampling, TokenUsage
from app.engine.torch_sampling import make_generator, sample_token
from tests.engine.engine_helpers import conversation, kv_equal

GREEDY = Sampling(max_tokens=24)
SAMPLED = Sampling(temperature=0.7, max_tokens=24, seed=18)


def _logits(*values: float) -> torch.Tensor:
    row = torch.full((16,), -10.0)
    row[: len(values)] = torch.tensor(values)
    return row


def test_greedy_certifies_a_gap_above_the_margin_only() -> None:
    wide = verify.decide(_logits(1.0, 1.0 - 2 * verify.GREEDY_MARGIN), GREEDY, None)
    near = verify.decide(_logits(1.0, 1.0 - verify.GREEDY_MARGIN / 2), GREEDY, None)
    assert wide == verify.Decision(0, True)
    assert near == verify.Decision(0, False)  # the same choice, but a perturbation within the bound could flip it


def test_sampled_decision_is_the_samplers_and_uncertified_next_to_a_boundary() -> None:
    logits = _logits(2.0, 1.0, 0.5)
    for seed in range(20):
        generator = make_generator(seed)
        state = generator.get_state()
        expected = sample_token(logits, SAMPLED, generator)
        generator.set_state(state)
        draw = float(torch.rand((), generator=generator, dtype=torch.float64).item())
        assert verify.decide(logits, SAMPLED, draw).token == expected
    probs = torch.softmax(logits.to(torch.float64) / SAMPLED.temperature, dim=-1)
    boundary = float(probs[0])  # token 0 holds [0, p0): a draw just below its end is not certified
    assert verify.decide(logits, SAMPLED, boundary - 1e-9) == verify.Decision(0, False)
    assert verify.decide(logits, SAMPLED, boundary / 2) == verify.Decision(0, True)
    assert verify.decide(logits, SAMPLED, boundary + 1e-9).certified is False
    tied = _logits(1.0, 1.0 - verify.PERTURBATION)  # neighbours within the bound: the rank may swap
    assert verify.decide(tied, SAMPLED, 0.1).certified is False
    assert verify.decide(logits, Sampling(temperature=0.7, top_p=0.9), 0.1).certified is False  # a nucleus


async def _run(
    engine: HFEngine, key: str, sampling: Sampling, draft: list[int] | None
) -> tuple[CacheHandle, Generation]:
    handle, generation, _ = await _closed(engine, key, sampling, draft)
    return handle, generation


async def _closed(
    engine: HFEngine, key: str, sampling: Sampling, draft: list[int] | None
) -> tuple[CacheHandle, Generation, TokenUsage]:
    """A transition's engine calls; answers the closing's usage too."""
    handle = await engine.open(key)
    await engine.prefill(handle, conversation(engine))
    generation = await engine.generate(handle, sampling, draft=draft)
    closing = await engine.prefill(handle, engine.chat.end_of_turn())  # the transition's closing
    return handle, generation, closing


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
async def test_a_draft_gives_decodings_generation_and_cache(
    engine: HFEngine, sampling: Sampling, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded_handle, decoded = await _run(engine, "decoded", sampling, None)
    assert decoded.usage.verified == 0
    reply = decoded.token_ids
    cases = {
        "same": reply,
        "changed": [*reply[:5], (reply[5] + 1) % 1000, *reply[6:]],  # the sampler disagrees at 5: decodes on
        "short": reply[:8],  # the draft ends early: decodes the rest
        "empty": [],
    }
    for name, draft in cases.items():
        handle, generation = await _run(engine, f"{name}-{sampling.temperature}", sampling, draft)
        assert generation.token_ids == reply and generation.finish_reason == decoded.finish_reason, name
        # Every decision is counted once: accepted from the draft, or decoded.
        assert generation.usage.verified + generation.usage.decoded == decoded.usage.decoded, name
        assert handle.tokens == decoded_handle.tokens and engine.chunks(handle) == engine.chunks(decoded_handle)
        assert kv_equal(engine, handle, decoded_handle), name  # the closing computes the same chunk
        if name == "same":
            assert (generation.usage.verified, generation.usage.decoded) == (decoded.usage.decoded, 0)
        if name == "changed":
            assert generation.usage.verified == 5  # the sixth decision disagrees: decoded, and the rest with it
        if name == "short":
            assert generation.usage.verified == 8
    # A margin nothing clears: every decision past the first is uncertified, so the engine decodes from the prompt.
    monkeypatch.setattr(verify, "PERTURBATION", 1e6)
    handle, fallback = await _run(engine, f"fallback-{sampling.temperature}", sampling, reply)
    assert fallback.token_ids == reply and fallback.usage.verified == 0
    assert fallback.usage.decoded == decoded.usage.decoded and kv_equal(engine, handle, decoded_handle)


@pytest.mark.parametrize("max_tokens", [128, 6], ids=["stopped", "cut"])
async def test_a_draft_accepted_whole_is_the_closings_chunk(engine: HFEngine, max_tokens: int) -> None:
    """Accepted whole, the verification pass (the draft with the end of turn) is exactly the closing's chunk: the
    closing computes nothing again, counts the end of turn the pass holds, and leaves the decoded cache bit for bit,
    whether the reply stopped or was cut by max_tokens. A call other than that closing drops the pass."""
    sampling = Sampling(max_tokens=max_tokens)
    decoded_handle, decoded, decoded_closing = await _closed(engine, f"plain-{max_tokens}", sampling, None)
    reply, end = decoded.token_ids, engine.chat.end_of_turn()
    assert decoded.finish_reason == ("length" if max_tokens == 6 else "stop") and len(reply) <= max_tokens
    assert decoded_closing.prefilled == len(reply) + len(end)  # decoding leaves the reply pending

    handle, generation, closing = await _closed(engine, f"whole-{max_tokens}", sampling, reply)
    assert (generation.token_ids, generation.usage.decoded) == (reply, 0)
    assert closing.prefilled == len(end)  # the reply's tokens were computed once, by the verification
    assert handle.tokens == decoded_handle.tokens and engine.chunks(handle) == engine.chunks(decoded_handle)
    assert kv_equal(engine, handle, decoded_handle)

    # A longer prefill than the chunk ahead (the end of turn and more) is one chunk with the reply, as after decoding.
    more = [*end, *conversation(engine)[-3:]]
    longer, plain = await engine.open(f"longer-{max_tokens}"), await engine.open(f"longer-plain-{max_tokens}")
    for h, d in ((longer, reply), (plain, None)):
        await engine.prefill(h, conversation(engine))
        await engine.generate(h, sampling, draft=d)
        assert (await engine.prefill(h, more)).prefilled == len(reply) + len(more)
    assert engine.chunks(longer) == engine.chunks(plain) and kv_equal(engine, longer, plain)

    # The stop-string branch of a transition crops to the prompt and prefills another closing: the pass is dropped.
    other = await engine.open(f"cropped-{max_tokens}")
    await engine.prefill(other, conversation(engine))
    prompt = len(other.tokens)
    await engine.generate(other, sampling, draft=reply)
    await engine.crop(other, prompt)
    recomputed = await engine.prefill(other, [*reply, *end])
    assert recomputed.prefilled == len(reply) + len(end)
    assert other.tokens == decoded_handle.tokens and kv_equal(engine, other, decoded_handle)
