"""What an HTTP worker builds over its engine client (client.py) besides the engine itself: the embedder and the
sessions' cache handles, both served by the engine process."""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.process.client import EngineClient
from app.engine.protocol import CacheHandle
from app.engine.session_caches import LocalSessionCaches


class EngineProcessEmbedder:
    """The Embedder of an HTTP worker: the engine process embeds (the model and torch stay there)."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await self.client.embed(texts)


class EngineProcessCaches:
    """SessionCaches of an HTTP worker (app/engine/session_caches.py): the engine process keeps one handle per
    session, and a transition attaches to it; this worker keeps its last copies so an unchanged one costs no tokens
    over the socket."""

    def __init__(self, client: EngineClient, max_handles: int = 1024) -> None:
        self.client = client
        self._copies = LocalSessionCaches(max_handles)

    async def checkout(self, session_id: str) -> CacheHandle | None:
        handle = await self.client.attach(session_id, self._copies.peek(session_id))
        if handle is None:
            await self._copies.drop(session_id)
        else:
            self._copies.keep(session_id, handle)
        return handle

    def keep(self, session_id: str, handle: CacheHandle) -> None:
        self._copies.keep(session_id, handle)

    async def drop(self, session_id: str) -> CacheHandle | None:
        await self.client.drop(session_id)
        return await self._copies.drop(session_id)
