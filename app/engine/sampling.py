"""Seeded, replayable token sampling.

A replayed transition must draw exactly the randomness the original drew (assumption A1): every generation owns one
`torch.Generator` seeded from `Sampling.seed`, which the runtime derives from (session seed, transition index) with
`transition_seed`. Nothing here reads a global RNG.

Sampling draws one float64 uniform per token and inverts the cumulative distribution over the probabilities sorted
in a fixed (stable) order, rather than calling `torch.multinomial`: the result then depends only on the logits and the
generator's stream, not on a kernel's internal strategy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

from app.engine.detokenize import IncrementalDetokenizer
from app.engine.protocol import Sampling

_SEED_SPACE = 1 << 63  # fits a signed 64-bit column and torch's manual_seed


def transition_seed(session_seed: int, transition: int) -> int:
    """The seed of one transition's generation: a stable hash, the same in every process, platform and release."""
    digest = hashlib.sha256(f"lethe/transition-seed/v1:{session_seed}:{transition}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % _SEED_SPACE


def validate(sampling: Sampling) -> None:
    if sampling.temperature < 0:
        raise ValueError("temperature must be >= 0 (0 means greedy)")
    if not 0 < sampling.top_p <= 1:
        raise ValueError("top_p must be in (0, 1]")
    if sampling.max_tokens < 0:
        raise ValueError("max_tokens must be >= 0")
    if any(not stop for stop in sampling.stop):
        raise ValueError("stop strings must not be empty")


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed % _SEED_SPACE)  # negative or huge seeds map into the range manual_seed accepts
    return generator


def sample_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The next token from the last position's logits (1-D, vocabulary-sized)."""
    if sampling.temperature == 0:
        return int(torch.argmax(logits).item())  # ties resolve to the lowest id, deterministically
    probs = torch.softmax(logits.to(torch.float64) / sampling.temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    if sampling.top_p < 1:
        # The nucleus: the fewest most-likely tokens whose mass reaches top_p (the first token always stays).
        keep = int(torch.searchsorted(cumulative, torch.tensor([sampling.top_p], dtype=torch.float64)).item()) + 1
        cumulative = cumulative[: min(keep, cumulative.numel())]
    draw = torch.rand((), generator=generator, dtype=torch.float64) * cumulative[-1]
    index = min(int(torch.searchsorted(cumulative, draw.reshape(1), right=True).item()), cumulative.numel() - 1)
    return int(order[index].item())


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
