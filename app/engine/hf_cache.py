"""The hf engine's cache mechanics on a handle's state, run on the engine's one worker thread: a forward pass recorded
as a chunk, a crop to whole chunks, an evicted cache rebuilt along its chunks (hf.py's docstring says why exactly so).
"""

from __future__ import annotations

from typing import Any

import torch

from app.engine.cache_pool import CachePool
from app.engine.hf_state import HandleState


def truncate(model: Any, pool: CachePool[HandleState], state: HandleState, n_tokens: int) -> None:
    """Keep the longest run of whole chunks that fits in `n_tokens`; tokens past it become pending."""
    kept, boundary = state.whole_chunks_within(n_tokens)
    drop = len(state.covered) - boundary
    if drop == 0:
        return
    del state.chunks[kept:]
    del state.covered[boundary:]
    state.logits = None
    if state.cache is not None:
        if boundary == 0:
            state.cache = new_cache(model)
        else:
            # transformers 5.19: a negative argument drops that many tokens from the end (a positive one is the
            # deprecated "keep n" form, rejected by 5.24). Each layer becomes a view: no tensor is copied.
            state.cache.crop(-drop)
        pool.touch(state)


def new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def forward(model: Any, pool: CachePool[HandleState], state: HandleState, token_ids: list[int]) -> int:
    """One forward pass over `token_ids` after the cached prefix; records it as a chunk."""
    vocab = int(model.config.vocab_size)
    if min(token_ids) < 0 or max(token_ids) >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab})")
    try:
        out = model(
            input_ids=torch.tensor([token_ids], dtype=torch.long),
            past_key_values=state.cache,
            use_cache=True,
            logits_to_keep=1,  # only the last position is ever sampled; skips the lm_head for the rest
        )
    except BaseException:
        # A failure between layers leaves them at different lengths: drop the cache, the chunks rebuild it.
        pool.drop(state)
        state.evict()
        raise
    state.logits = out.logits[0, -1]
    state.chunks.append(len(token_ids))
    state.covered.extend(token_ids)
    return len(token_ids)


def forward_all(model: Any, pool: CachePool[HandleState], state: HandleState, token_ids: list[int]) -> torch.Tensor:
    """`forward`, keeping every position's logits: row i is what decides the token after `token_ids[i]` (a draft's
    verification, hf.py)."""
    vocab = int(model.config.vocab_size)
    if min(token_ids) < 0 or max(token_ids) >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab})")
    try:
        out = model(input_ids=torch.tensor([token_ids], dtype=torch.long), past_key_values=state.cache, use_cache=True)
    except BaseException:
        pool.drop(state)
        state.evict()
        raise
    rows: torch.Tensor = out.logits[0]
    state.logits = rows[-1]
    state.chunks.append(len(token_ids))
    state.covered.extend(token_ids)
    return rows


def cut_last_chunk(state: HandleState, keep: int) -> None:
    """Keep the first `keep` tokens of the last chunk (a slice of every layer). The shorter chunk is *not* what a
    pass over those tokens alone computes (float noise), so a caller cuts only inside work it discards before the
    call ends (a verification's rejected tail, hf.py), never to leave it in a recipe."""
    drop = state.chunks[-1] - keep
    if drop <= 0:
        return
    state.cache.crop(-drop)
    del state.covered[len(state.covered) - drop :]
    if keep:
        state.chunks[-1] = keep
    else:
        state.chunks.pop()
    state.logits = None


def make_resident(model: Any, pool: CachePool[HandleState], state: HandleState) -> int:
    """Rebuild an evicted cache by replaying its chunks; returns the tokens recomputed."""
    if state.cache is not None:
        return 0
    chunks, covered = state.chunks, state.covered
    state.cache, state.chunks, state.covered = new_cache(model), [], []
    position = 0
    try:
        for size in chunks:
            position += forward(model, pool, state, covered[position : position + size])
    except BaseException:
        state.chunks, state.covered = chunks, covered  # keep the recipe whole for the next attempt
        raise
    return position


def settle(pool: CachePool[HandleState], state: HandleState) -> None:
    pool.touch(state)
    pool.evict_over_budget(keep=state)
