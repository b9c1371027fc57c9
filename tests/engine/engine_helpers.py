"""Shared building blocks of the engine tests (not fixtures: plain functions over a started engine)."""

from __future__ import annotations

import itertools

import torch

from app.engine.hf import HFEngine
from app.engine.protocol import CacheHandle, Generation, Sampling

GREEDY = Sampling(temperature=0.0, max_tokens=12)


def sampled(seed: int, max_tokens: int = 12) -> Sampling:
    return Sampling(temperature=0.7, top_p=0.95, max_tokens=max_tokens, seed=seed)


def conversation(engine: HFEngine) -> list[int]:
    chat = engine.chat
    return [
        *chat.render_block("system", "You are a helpful assistant. Answer briefly."),
        *chat.render_block("user", "My name is Ada and I live at 12 Rue Cler, Paris. I like sailing and tea."),
        *chat.render_block("assistant", "Nice to meet you, Ada! Sailing and tea sound lovely."),
        *chat.render_block("user", "Write two sentences about the sea, then tell me where I live."),
        *chat.assistant_header(),
    ]


async def run_chunks(
    engine: HFEngine, key: str, chunks: list[list[int]], sampling: Sampling
) -> tuple[CacheHandle, Generation]:
    """A fresh handle that prefills `chunks` one call each, then generates."""
    handle = await engine.open(key)
    for chunk in chunks:
        await engine.prefill(handle, chunk)
    return handle, await engine.generate(handle, sampling)


def kv_equal(engine: HFEngine, a: CacheHandle, b: CacheHandle) -> bool:
    pairs = zip(engine.kv_tensors(a), engine.kv_tensors(b), strict=True)
    return all(torch.equal(ka, kb) and torch.equal(va, vb) for (ka, va), (kb, vb) in pairs)


def split(tokens: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = [0, *sorted(cuts), len(tokens)]
    return [tokens[a:b] for a, b in itertools.pairwise(bounds) if b > a]
