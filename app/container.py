"""The composition root: everything a running app owns, built once by the lifespan (app/main.py), closed by it too.
Nothing is built at import time or per request; routers reach the services through `app/web/deps.py`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from app.db.database import Database
from app.db.notifications import JobEvents, announce_shred
from app.embeddings import Embedder, MiniLMEmbedder
from app.engine.session_caches import LocalSessionCaches, SessionCaches
from app.engine.slot import EngineSlot
from app.forget.cascade import JobCascade
from app.forget.executor import ForgetExecutor
from app.forget.service import ForgetService
from app.forget.shredding import Shredder
from app.forget.worker import ForgetWorker
from app.holds.service import HoldService
from app.keys.admin import KeyAdmin
from app.keys.content import Sealer
from app.keys.factory import build_keyring
from app.keys.leaves import Leaves
from app.memory.catalog import MemoryCatalog
from app.memory.search import MemorySearch
from app.memory.service import MemoryService
from app.observability.metrics import Metrics
from app.openai_compat.chat import ChatService
from app.openai_compat.service import CompatService
from app.policies import build_policies
from app.retention.service import RetentionService
from app.sessions.service import SessionService
from app.settings import Settings
from app.subjects.erasure import STRATEGY as SUBJECT_ERASURE
from app.subjects.erasure import SubjectErasure
from app.subjects.service import SubjectService
from app.tenants.service import TenantService
from app.threads.service import ThreadService
from app.webhooks.service import DetectorWebhooks


def build_sealer(settings: Settings, db: Database, tenants: TenantService) -> Sealer:
    """The process's keyring and leaves; its shreds are announced to every other process's key cache."""
    return Sealer(
        build_keyring(settings), Leaves(tenants.reserve_leaves),
        announce=lambda tenant_id, leaves: announce_shred(db, tenant_id, leaves),
    )


def build_key_admin(settings: Settings, db: Database) -> KeyAdmin:
    """`lethe keys`: the serving processes' shredder, without the rest of a running app."""
    sealer = build_sealer(settings, db, TenantService(db))
    return KeyAdmin(db, sealer.keyring.provider, Shredder(db, sealer), horizon_s=settings.erasure_horizon_s)


@dataclass(frozen=True)
class Services:
    """One of each per process. They hold no request state: the long-lived parts they share (database pool, engine,
    this process's cache handles, the embedder) are the container's."""

    sessions: SessionService
    forget: ForgetService
    forget_executor: ForgetExecutor
    memory: MemoryService
    memory_catalog: MemoryCatalog
    memory_search: MemorySearch
    webhooks: DetectorWebhooks
    conversations: CompatService
    chat: ChatService
    threads: ThreadService
    subjects: SubjectService
    subject_erasure: SubjectErasure
    holds: HoldService
    retention: RetentionService


@dataclass
class Container:
    settings: Settings
    db: Database
    metrics: Metrics
    engine: EngineSlot
    tenants: TenantService
    handles: SessionCaches = field(default_factory=LocalSessionCaches)
    embedder: Embedder = field(default_factory=MiniLMEmbedder)
    # Set when a job is queued, by a submit here or by any process (job_events): wakes this process's forget worker.
    forget_wake: asyncio.Event = field(default_factory=asyncio.Event)
    job_events: JobEvents = field(init=False)
    # Content at rest (docs/erasure-at-rest.md): the process's keyring and leaves, handed to every repository that
    # seals, and the shredder that punctures what a forget erased.
    sealer: Sealer = field(init=False)
    shredder: Shredder = field(init=False)
    background: list[asyncio.Task[None]] = field(default_factory=list)
    services: Services = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        horizon_s = settings.erasure_horizon_s
        self.metrics.erasure_horizon.set(horizon_s)
        self.sealer = sealer = build_sealer(settings, self.db, self.tenants)
        self.shredder = Shredder(self.db, sealer)
        self.job_events = JobEvents(self.db.pg_url, self.forget_wake, shredded=sealer.forget_cached)
        policies = build_policies()  # the one registry, handed to everything that resolves a session's policy
        sessions = SessionService(
            self.db, self.engine, self.handles, self.embedder, policies, sealer,
            lock_timeout_s=settings.session_lock_timeout_s, lease_s=settings.session_lease_s,
            on_wait=self.metrics.session_waiters.inc, settle=self.shredder.settle, horizon_s=horizon_s,
        )
        forget = ForgetService(
            self.db, self.engine, self.embedder, policies, sealer=sealer, wait_s=settings.forget_wait_s,
            wake=self.forget_wake, events=self.job_events, shredder=self.shredder, horizon_s=horizon_s,
        )
        executor = ForgetExecutor(
            self.db, self.engine, self.handles, sessions, self.metrics, self.embedder, policies, sealer=sealer,
            lock_timeout_s=settings.forget_lock_timeout_s, replay_verify=settings.replay_verify, horizon_s=horizon_s,
            shredder=self.shredder,
        )
        # A forget's cascade is the selective-replay job over every session the record was injected into, queued in
        # the tombstone's transaction (finished there when it reached none); it shreds once the tombstone committed.
        memory = MemoryService(self.db, sealer, cascade=JobCascade(
            "selective_replay", "memory record forgotten",
            on_finished=lambda strategy: self.metrics.job_finished(strategy, "succeeded", 0),
            sealer=sealer, shredder=self.shredder, horizon_s=horizon_s,
        ))
        erasure = SubjectErasure(self.db, sealer, sessions, memory, forget, self.shredder, self.embedder,
                                 horizon_s=horizon_s, metrics=self.metrics)
        executor.runners[SUBJECT_ERASURE] = erasure.run  # its job runs in this process's forget worker
        self.services = Services(
            sessions=sessions,
            forget=forget,
            forget_executor=executor,
            memory=memory,
            memory_catalog=MemoryCatalog(self.db),
            memory_search=MemorySearch(self.db, sealer, self.embedder, memory.expiry),
            webhooks=DetectorWebhooks(self.db, forget),
            conversations=CompatService(self.db, self.engine, sessions, forget, sealer=sealer),
            chat=ChatService(self.db, self.engine, sessions, forget, sealer=sealer),
            threads=ThreadService(self.db, sealer, max_checkpoint_bytes=settings.thread_max_checkpoint_bytes),
            subjects=SubjectService(self.db, sealer),
            subject_erasure=erasure,
            holds=HoldService(self.db, erasure),
            retention=RetentionService(self.db, sealer, sessions, memory, self.shredder, self.metrics,
                                       horizon_s=horizon_s, sweep_s=settings.retention_sweep_s),
        )

    def forget_worker(self) -> ForgetWorker:
        settings = self.settings
        return ForgetWorker(
            self.db, self.metrics, self.services.forget_executor, lease_s=settings.forget_lease_s,
            poll_s=settings.forget_poll_s, ready=lambda: self.engine.ready, wake=self.forget_wake,
            shredder=self.shredder, retention=self.services.retention.sweep,
        )
