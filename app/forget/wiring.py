"""Building the forget service, executor and worker from the app's container (used by the routers and the lifespan)."""

from __future__ import annotations

from app.container import Container
from app.forget.executor import ForgetExecutor
from app.forget.service import ForgetService
from app.forget.worker import ForgetWorker
from app.sessions.service import SessionService


def session_service(container: Container) -> SessionService:
    return SessionService(
        container.db, container.engine, container.handles, lock_timeout_s=container.settings.session_lock_timeout_s,
        embedder=container.embedder,
    )


def forget_service(container: Container) -> ForgetService:
    return ForgetService(
        container.db, container.engine, container.embedder, wait_s=container.settings.forget_wait_s,
        wake=container.forget_wake,
    )


def forget_executor(container: Container) -> ForgetExecutor:
    return ForgetExecutor(
        container.db, container.engine, container.handles, session_service(container), container.metrics,
        container.embedder, lock_timeout_s=container.settings.forget_lock_timeout_s,
    )


def forget_worker(container: Container) -> ForgetWorker:
    settings = container.settings
    worker = ForgetWorker(
        container.db, container.metrics, lambda: forget_executor(container),
        lease_s=settings.forget_lease_s, poll_s=settings.forget_poll_s, ready=lambda: container.engine.ready,
    )
    worker.wake = container.forget_wake
    return worker
