"""The hf engine's state on a handle (`handle.state`): its cache, and the recipe that rebuilds it exactly."""

from __future__ import annotations

from typing import Any

import torch


class HandleState:
    __slots__ = ("__weakref__", "cache", "chunks", "covered", "logits", "owner", "serial")

    def __init__(self, owner: object, serial: int) -> None:
        self.owner = owner  # the engine: a handle is only valid with the engine that made its state
        self.serial = serial  # the pool's key: unlike id(), never reused by a later state
        self.cache: Any = None  # a DynamicCache while resident, None once evicted or released
        self.chunks: list[int] = []  # sizes of the forward passes over `covered`, in order
        self.covered: list[int] = []  # the log prefix those passes consumed; longer log tokens are pending
        self.logits: torch.Tensor | None = None  # the last pass's last-position logits, while still the log's end

    @property
    def nbytes(self) -> int:
        total = 0 if self.logits is None else self.logits.untyped_storage().nbytes()
        if self.cache is not None:
            for layer in self.cache.layers:
                if layer.is_initialized:
                    # The storage, not the view: a cropped layer keeps its whole buffer until the next pass.
                    total += layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
        return total

    def evict(self) -> None:
        self.cache = None
        self.logits = None

    def whole_chunks_within(self, n_tokens: int) -> tuple[int, int]:
        """How many leading chunks fit in `n_tokens`, and the token offset where they end."""
        kept, boundary = 0, 0
        for size in self.chunks:
            if boundary + size > n_tokens:
                break
            boundary += size
            kept += 1
        return kept, boundary
