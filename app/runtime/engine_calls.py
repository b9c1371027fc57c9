"""The transition F on the engine: catch a cache handle up with the stored log, then run one transition.

Exactness (what selective replay relies on) needs the same forward passes in a replay as in the original run: the hf
engine's KV differs in the last float bits when the same tokens are split into other chunks. So one transition is
always the same calls:

0. `prefill(pending)` when the engine has not computed part of the stored log yet (the system block of
   transition 0, which session creation does not prefill): its own call, so transition 0 ends on a chunk boundary
   too and a forget whose target entered at transition 1 still reuses the system block;
1. `prefill(observation blocks + assistant header)`: one call, one chunk;
2. `generate(sampling)` with the transition's own seed;
3. `prefill(end_of_turn)` (or, when a stop string cut the text, a crop back to the prompt and
   `prefill(encode(text) + end_of_turn)`), so the cache covers exactly the log when the transition ends.

Without a reply, step 1 is `prefill(observation blocks)` and nothing follows. Every transition therefore ends on a
chunk boundary, and a crop to any transition end followed by the same per-transition calls reproduces the original
bit for bit.

On an engine that defers prefills (vllm, vllm-remote: protocol.py), steps 0, 1 and 3 send nothing and step 2 is the
transition's one request, over the whole log: it computes the previous transition's closing tokens, the pending ones
and the observations together, and its usage counts them. So there `closing_tokens` is 0 (the next transition's
`prefill_tokens` counts them) and a transition without a reply computes nothing (`prefill_tokens` 0; its tokens are
counted by the next request). Summed over a session, `prefill_tokens + closing_tokens` is what the engine computed.

Engines that record chunks (hf: `records_chunks`) report the chunk sizes each transition added; the runtime stores
them with the transition's last artifact (the *recipe*), so another process, or this one after an eviction, rebuilds
a cache chunk for chunk instead of in one pass that would differ in the last bits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from app.engine.protocol import CacheHandle, KVEngine, Sampling, TokenSink
from app.engine.sampling import transition_seed
from app.engine.tokens import common_prefix
from app.errors import PayloadTooLarge
from app.runtime.blocks import Block, assistant_block


@dataclass(frozen=True)
class StoredLog:
    """What the database says a session's cache stands for."""

    tokens: list[int]
    recipe: list[int]  # chunk sizes covering a prefix of `tokens` (empty when unknown)


@dataclass
class Synced:
    handle: CacheHandle
    pending: list[int]  # the stored log's tail the engine has not seen; the transition prefills it first, alone
    prefilled: int  # prompt tokens computed while catching up (part of this transition's prefill)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # the log the reply was sampled from (without a reply: the log after the observations)
    reused_tokens: int  # of those, served from the cache
    prefill_tokens: int  # of those, computed now: prompt_tokens = reused_tokens + prefill_tokens
    decode_tokens: int  # sampled tokens, a stop token included
    closing_tokens: int  # computed after sampling to close the turn (the reply and the end-of-turn marker, on hf)
    verified_tokens: int = 0  # a replay's: reply tokens accepted from its draft without decoding (not in decode_tokens)


@dataclass(frozen=True)
class Outcome:
    blocks: list[Block]  # the observations, then the reply when there is one
    reply: Block | None
    usage: Usage
    finish_reason: Literal["stop", "length"] | None
    chunks_at: int  # token offset where this transition's chunks begin
    chunks: list[int] | None  # chunk sizes this transition added; None when the engine does not report them


def context_limit(engine: KVEngine) -> int | None:
    """The most tokens a session's log may hold, None when the engine does not say."""
    return engine.max_context_tokens


def recipe_of(engine: KVEngine, handle: CacheHandle) -> list[int] | None:
    return engine.chunks(handle) if engine.records_chunks else None


async def sync(engine: KVEngine, handle: CacheHandle | None, session_key: str, salt: str, log: StoredLog) -> Synced:
    """Bring `handle` (None: this process has none) to the stored log: crop what differs, prefill what is missing
    along the recipe's chunk boundaries, and leave the rest pending. Two processes on one database stay correct
    because the database, not a handle, is the truth; the cache only saves work when it agrees."""
    covered = sum(log.recipe)
    recipe = log.recipe if engine.records_chunks and 0 < covered <= len(log.tokens) else []
    if handle is None:
        if recipe:
            opened = await engine.open(session_key, salt=salt, tokens=log.tokens[:covered], chunks=list(recipe))
            return Synced(opened, log.tokens[covered:], 0)  # the engine rebuilds the recipe on the next call
        return Synced(await engine.open(session_key, salt=salt), list(log.tokens), 0)
    use_salt(engine, handle, salt)
    common = common_prefix(handle.tokens, log.tokens)
    if common < len(handle.tokens):
        await engine.crop(handle, common)
    prefilled, position, boundary = 0, common, 0
    for size in recipe:
        boundary += size
        if boundary > position:
            prefilled += (await engine.prefill(handle, log.tokens[position:boundary])).prefilled
            position = boundary
    return Synced(handle, log.tokens[position:], prefilled)


def use_salt(engine: KVEngine, handle: CacheHandle, salt: str | None) -> None:
    """Move a handle to the session's current cache salt: a forget may have given the session a new one
    (runtime/salts.py). On a shared prefix cache nothing is computed under it yet, so the next request prefills the
    whole log; an engine without one (hf) keeps its cache as it is."""
    if handle.salt != salt:
        engine.resalt(handle, salt)


def check_room(engine: KVEngine, log_tokens: int, new_tokens: int, generate: bool) -> int | None:
    """Raise 413 when the transition cannot fit the model's context; return the most tokens it may sample."""
    limit = context_limit(engine)
    if limit is None:
        return None
    chat = engine.chat
    closing = len(chat.assistant_header()) + len(chat.end_of_turn()) + 1 if generate else 0
    needed = log_tokens + new_tokens + closing
    if needed > limit:
        raise PayloadTooLarge(
            f"the prompt would hold {needed} tokens with the reply's first token; the model's context is {limit}",
            prompt_tokens=needed,
            context_tokens=limit,
        )
    return limit - log_tokens - new_tokens - closing + 1 if generate else None


@dataclass(frozen=True)
class SamplingDefaults:
    """What a session samples with where its config leaves a parameter out. The API's schemas take their defaults
    from here, so a request without the field and a stored config without it mean the same thing."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int = 0


SAMPLING_DEFAULTS: Final = SamplingDefaults()


def sampling_for(config: Mapping[str, Any], turn: int, room: int | None) -> Sampling:
    """The sampling of transition `turn` under a session's stored sampling config: its seed derives from the session
    seed and the index (assumption A1), and `room` (check_room) caps max_tokens so the closed turn fits the context.
    A replay of the transition gets the same object, hence the same tokens."""
    # A transition may carry its own sampling (`per_turn`, what an OpenAI-compatible request sets per response); it
    # is stored with the session, so a replay of the transition samples exactly as the original did.
    override = (config.get("per_turn") or {}).get(str(turn))
    if override:
        config = {**config, **override}
    max_tokens = int(config.get("max_tokens", SAMPLING_DEFAULTS.max_tokens))
    return Sampling(
        temperature=float(config.get("temperature", SAMPLING_DEFAULTS.temperature)),
        top_p=float(config.get("top_p", SAMPLING_DEFAULTS.top_p)),
        max_tokens=max_tokens if room is None else min(max_tokens, room),
        stop=tuple(config.get("stop", ())),
        seed=transition_seed(int(config.get("seed", SAMPLING_DEFAULTS.seed)), turn),
    )


async def advance(
    engine: KVEngine,
    synced: Synced,
    observations: list[Block],
    sampling: Sampling | None,
    on_tokens: TokenSink | None = None,
    draft: list[int] | None = None,
) -> Outcome:
    """Run one transition on the engine (the calls of the module docstring). `sampling` None: no reply. `draft`: a
    replay's recorded reply, which an engine that can verifies instead of decoding (KVEngine.generate): the same
    calls, the same tokens."""
    handle, chat = synced.handle, engine.chat
    before = recipe_of(engine, handle)
    first = [t for block in observations for t in block.token_ids]
    reply: Block | None = None
    finish: Literal["stop", "length"] | None = None
    decoded = verified = closing = generation_prefill = pending_prefill = 0
    if synced.pending:
        pending_prefill = (await engine.prefill(handle, synced.pending)).prefilled
    if sampling is None:
        first_usage = await engine.prefill(handle, first)
        prompt_tokens = len(handle.tokens)
    else:
        first_usage = await engine.prefill(handle, [*first, *chat.assistant_header()])
        prompt_tokens = len(handle.tokens)
        generation = await engine.generate(handle, sampling, on_tokens, draft=draft)
        generation_prefill, decoded = generation.usage.prefilled, generation.usage.decoded
        verified = generation.usage.verified
        finish = generation.finish_reason
        generated = generation.token_ids
        if sampling.stop and generation.text != chat.decode(generated):
            # A stop string cut the text: the log must hold what the artifact says, so the cut text is re-rendered
            # after a crop to the prompt's end (a chunk boundary). A replay takes the same branch with the same tokens.
            await engine.crop(handle, prompt_tokens)
            generated = chat.encode(generation.text)
            closing = (await engine.prefill(handle, [*generated, *chat.end_of_turn()])).prefilled
        else:
            closing = (await engine.prefill(handle, chat.end_of_turn())).prefilled
        reply = assistant_block(chat, generation.text, generated)
    prefill = synced.prefilled + pending_prefill + first_usage.prefilled + generation_prefill
    # What the transition did not compute was served from the cache or, on an engine that defers (vLLM) and without a
    # reply, waits for the next request. The clamp guards an engine whose several calls each recompute a partial
    # cache block, and so report more prompt tokens computed than the log holds.
    usage = Usage(prompt_tokens, max(0, prompt_tokens - prefill), prefill, decoded, closing, verified)
    after = recipe_of(engine, handle)
    chunks: list[int] | None = None
    at = sum(before or [])
    if before is not None and after is not None and after[: len(before)] == before and sum(after) == len(handle.tokens):
        chunks = after[len(before) :]
    blocks = [*observations, *([reply] if reply is not None else [])]
    return Outcome(blocks, reply, usage, finish, at, chunks)


async def rewind(engine: KVEngine, handle: CacheHandle, n_tokens: int) -> None:
    """Crop a handle back after a failed transition (its log may hold part of the failed work)."""
    await engine.crop(handle, min(n_tokens, len(handle.tokens)))
