"""The ASGI app: `create_app()` wires routers, error mapping and middleware; the lifespan owns every resource."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from app import __version__
from app.console import routes as console
from app.container import Container
from app.db.database import Database, resolve_database_url
from app.db.migrate import upgrade_to_head_async
from app.embeddings import Embedder, MiniLMEmbedder
from app.engine.fleet import ObservedFleet
from app.engine.model_store import model_id_for
from app.engine.process.client import EngineClient
from app.engine.process.proxies import EngineProcessCaches, EngineProcessEmbedder
from app.engine.protocol import KVEngine
from app.engine.session_caches import LocalSessionCaches, SessionCaches
from app.engine.slot import EngineSlot
from app.forget import endpoints as forget
from app.health import endpoints as health
from app.holds import endpoints as holds
from app.keys.factory import build_provider
from app.keys.identity import check_key_store
from app.keys.renewal import TokenRenewal
from app.mcp.mount import McpMount
from app.memory import endpoints as memory
from app.observability.metrics import Metrics
from app.openai_compat import endpoints as openai_compat
from app.retention import endpoints as retention
from app.sessions import endpoints as sessions
from app.settings import Settings
from app.subjects import endpoints as subjects
from app.tenants.service import TenantService
from app.threads import endpoints as threads
from app.web.middleware import ObservabilityMiddleware
from app.web.openapi import install_exact_parameters
from app.web.problems import install_problem_handlers, problem_doc
from app.webhooks import endpoints as webhooks

log = logging.getLogger(__name__)



V1_ERRORS: dict[int | str, dict[str, Any]] = {
    401: problem_doc("Missing or invalid API key"),
    404: problem_doc("Unknown id, or one that belongs to another tenant"),
    413: problem_doc("Body or prompt too large"),
    422: problem_doc("Validation error"),
    503: problem_doc("The database connection was lost under the request; retry (Retry-After)"),
}


def create_app(
    settings: Settings | None = None, *, engine: KVEngine | None = None, engine_process: Path | None = None,
    prepared: bool = False,
) -> FastAPI:
    """Build the app. `engine` lets tests inject one; by default `LETHE_ENGINE` picks it at startup.

    `engine_process`: this app is an HTTP worker (app/serving.py) whose engine and embedder run in the engine
    process on that socket; it serves every route itself. `prepared`: the supervisor already migrated the database
    and registered the bootstrap tenant."""
    settings = settings or Settings()
    metrics = Metrics()
    mcp = McpMount()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = await resolve_database_url(settings)
        if not prepared:
            await upgrade_to_head_async(url)
        db = Database.from_settings(url, settings, metrics=metrics)
        tenants = TenantService(db, auth_cache_s=settings.auth_cache_s)
        if not prepared:
            await tenants.bootstrap(settings)
        try:
            provider = build_provider(settings)
            renewal = TokenRenewal.of(provider, expiry=metrics.key_token_expiry.set)
            # Before anything reads or writes sealed content: the key store must be the one the database knows.
            await check_key_store(db, provider, settings)
            # Renewed before serving, so a process restarted near the token's end starts with a full term.
            first_renewal = await asyncio.to_thread(renewal.step) if renewal is not None else None
        except BaseException:
            await db.close()
            raise
        if engine_process is not None:
            client = EngineClient(engine_process, name=settings.engine.value, model_id=model_id_for(settings.model))
            chosen: KVEngine = client
            handles: SessionCaches = EngineProcessCaches(client)
            embedder: Embedder = EngineProcessEmbedder(client)
        else:
            chosen, handles, embedder = engine or _build_engine(settings), LocalSessionCaches(), MiniLMEmbedder()
        if isinstance(chosen, ObservedFleet):
            chosen.observe(metrics.fleet_request)  # each session request's affinity and reuse (lethe_fleet_*)
        slot = EngineSlot(chosen)
        container = Container(
            settings=settings, db=db, metrics=metrics, engine=slot, tenants=tenants, handles=handles,
            embedder=embedder,
        )
        app.state.container = container
        slot.task = asyncio.create_task(slot.load(), name="engine-load")
        container.background.append(asyncio.create_task(container.forget_worker().run(), name="forget-worker"))
        container.background.append(asyncio.create_task(container.job_events.run(), name="job-events"))
        container.background.append(asyncio.create_task(db.watch_replicas(), name="replica-watch"))
        container.background.append(asyncio.create_task(
            container.services.memory.expiry.run(interval_s=settings.memory_expiry_sweep_s), name="memory-expiry",
        ))
        if renewal is not None:
            container.background.append(asyncio.create_task(renewal.run(first_renewal), name="key-token-renewal"))
        await mcp.start()
        log.info("lethe started", extra={
            "engine": settings.engine.value, "version": __version__,
            "role": "http-worker" if engine_process is not None else "server",
        })
        # Everything allocated so far (modules, the app, pools) lives as long as the process: take it out of the
        # cyclic collector's sight, so a full collection under load walks only request garbage (tail latency).
        gc.freeze()
        try:
            yield
        finally:
            for task in [slot.task, *container.background]:
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(*(t for t in [slot.task, *container.background] if t), return_exceptions=True)
            await mcp.stop()
            await chosen.close()
            await db.close()
            log.info("lethe stopped")

    app = FastAPI(
        title="Lethe",
        version=__version__,
        summary="Stateful LLM agent serving that can truly forget.",
        description="Execution-state unlearning for stateful agents: see docs/API.md for the contract.",
        lifespan=lifespan,
    )
    install_problem_handlers(app)
    app.include_router(health.router)
    for router in (sessions.router, forget.router, memory.router, threads.router, subjects.router, holds.router,
                   retention.router):
        app.include_router(router, responses=V1_ERRORS)
    app.include_router(openai_compat.router)  # its own error documents (OpenAI's shape)
    app.include_router(webhooks.router, responses={
        401: problem_doc("Bad signature or stale timestamp; the listing: missing or invalid API key"),
        413: V1_ERRORS[413], 422: V1_ERRORS[422], 503: V1_ERRORS[503],
    })
    app.include_router(console.router)
    app.router.routes.append(mcp.route)  # MCP over streamable HTTP (app/mcp/); not in the OpenAPI document
    install_exact_parameters(app)
    app.add_middleware(ObservabilityMiddleware, metrics=metrics, max_body_bytes=settings.max_body_bytes)
    return app


def _build_engine(settings: Settings) -> KVEngine:
    from app.engine.factory import build_engine  # heavy imports (torch) only when serving

    return build_engine(settings)
