"""Everything a running app owns, built and closed by the lifespan (app/main.py); nothing at import time."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from app.db.session import Database
from app.embeddings import Embedder
from app.engine.protocol import KVEngine
from app.observability.metrics import Metrics
from app.runtime.handles import HandleRegistry
from app.settings import Settings
from app.tenants.service import TenantService

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

    async def load(self) -> None:
        try:
            await self.engine.start()
            log.info("engine ready", extra={"engine": self.engine.name, "model": self.engine.model_id})
        except Exception as exc:  # reported by /readyz; the process keeps serving liveness and metrics
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("engine failed to start")


@dataclass
class Container:
    settings: Settings
    db: Database
    metrics: Metrics
    engine: EngineSlot
    tenants: TenantService
    handles: HandleRegistry = field(default_factory=HandleRegistry)
    embedder: Embedder = field(default_factory=Embedder)
    # Set by a submit to wake this process's forget worker at once (other processes find the job by polling).
    forget_wake: asyncio.Event = field(default_factory=asyncio.Event)
    background: list[asyncio.Task[None]] = field(default_factory=list)
