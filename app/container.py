"""Everything a running app owns, built and closed by the lifespan (app/main.py); nothing at import time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from app.db.session import Database
from app.embeddings import Embedder
from app.engine.slot import EngineSlot
from app.observability.metrics import Metrics
from app.runtime.handles import HandleRegistry
from app.settings import Settings
from app.tenants.service import TenantService


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
