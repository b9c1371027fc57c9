"""The slot that holds the app's engine while it loads and after."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from app.engine.protocol import KVEngine

log = logging.getLogger(__name__)


@dataclass
class EngineSlot:
    """The engine loads in the background so liveness answers at once; readiness waits for it."""

    engine: KVEngine
    task: asyncio.Task[None] | None = None
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.error is None and self.engine.ready

    async def available(self) -> bool:
        """`ready`, after asking an engine that lives elsewhere (the engine process) to look again if it was not:
        a request that needs the model is turned away only when the engine really cannot serve it. It asks even while
        this process's own start is still polling: under several HTTP workers, /readyz answered by one worker lets
        clients in at once, and a sibling between two polls must not answer 503 for an engine that is up (a CI run
        of tests/mcp/test_mcp_workers.py did)."""
        refresh = getattr(self.engine, "refresh", None)
        if not self.ready and self.error is None and refresh is not None:
            await refresh()
        return self.ready

    async def load(self) -> None:
        try:
            await self.engine.start()
            log.info("engine ready", extra={"engine": self.engine.name, "model": self.engine.model_id})
        except Exception as exc:  # reported by /readyz; the process keeps serving liveness and metrics
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("engine failed to start")
