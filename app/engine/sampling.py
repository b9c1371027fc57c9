"""Sampling rules every engine and process shares, torch-free: the seed of a transition, what a valid `Sampling` is,
and where a stop string cuts a reply. The hf engine's seeded sampler itself is torch_sampling.py.

A replayed transition must draw exactly the randomness the original drew (assumption A1): every generation is seeded
from `Sampling.seed`, which the runtime derives from (session seed, transition index) with `transition_seed`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from app.engine.detokenize import IncrementalDetokenizer
from app.engine.protocol import Sampling

SEED_SPACE = 1 << 63  # fits a signed 64-bit column and torch's manual_seed


def transition_seed(session_seed: int, transition: int) -> int:
    """The seed of one transition's generation: a stable hash, the same in every process, platform and release."""
    digest = hashlib.sha256(f"lethe/transition-seed/v1:{session_seed}:{transition}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_SPACE


def validate(sampling: Sampling) -> None:
    if sampling.temperature < 0:
        raise ValueError("temperature must be >= 0 (0 means greedy)")
    if not 0 < sampling.top_p <= 1:
        raise ValueError("top_p must be in (0, 1]")
    if sampling.max_tokens < 0:
        raise ValueError("max_tokens must be >= 0")
    if any(not stop for stop in sampling.stop):
        raise ValueError("stop strings must not be empty")


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the earliest stop string begins in `text`, or None."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return min(found) if found else None


class StopWatch:
    """Stop strings found in a reply as its tokens are sampled, without decoding the whole reply for every token.

    The text is kept incrementally (detokenize.py); each check searches only what the new tokens could complete: a
    stop that lies wholly inside text already checked was found then. The position answered is in the whole text, as
    `find_stop(decode(all tokens), stops)` answers it."""

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...]) -> None:
        self._text = IncrementalDetokenizer(decode)
        self._stops = stops
        self._longest = max(len(s) for s in stops)
        self._emitted = ""
        self._checked = 0  # length of the text at the previous check

    def check(self, tokens: list[int]) -> int | None:
        self._emitted += self._text.push(tokens)
        held = self._text.peek()
        cut = max(0, self._checked - self._longest + 1)
        window = self._emitted[cut:] + held if cut <= len(self._emitted) else held[cut - len(self._emitted) :]
        self._checked = len(self._emitted) + len(held)
        found = find_stop(window, self._stops)
        return None if found is None else cut + found
