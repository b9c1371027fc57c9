"""`HashEmbedder`: a deterministic, dependency-free embedder for CrewAI's memory, for offline runs and tests.

CrewAI's `Memory` needs an embedder and defaults to OpenAI's; `HashEmbedder()` needs no model, no download and no
network. It hashes lower-cased words into a fixed number of signed buckets (feature hashing) and normalises the
vector, so similarity is word overlap: good enough to recall a fact by its words, no substitute for a semantic
model. Use a real one (`Memory(embedder={"provider": ..., ...})`) wherever meaning matters.
"""

from __future__ import annotations

import hashlib
import math
import re

_WORD = re.compile(r"\w+")


class HashEmbedder:
    def __init__(self, dimensions: int = 256) -> None:
        if dimensions < 1:
            raise ValueError("dimensions must be positive")
        self.dimensions = dimensions

    def __call__(self, input: list[str]) -> list[list[float]]:  # CrewAI calls embedder(list_of_texts)
        return [self.embed(text) for text in input]

    def embed(self, text: str) -> list[float]:
        vector = [0.0] * self.dimensions
        for word in _WORD.findall(text.lower()):
            # blake2b, not hash(): Python salts str hashes per process, and a stored vector must match tomorrow's.
            digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
            vector[digest % self.dimensions] += 1.0 if digest >> 63 else -1.0
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector] if norm else vector
