"""SQL for forget jobs and detector-webhook deliveries.

A job is a durable queue entry: workers in any API process claim it with `FOR UPDATE SKIP LOCKED` and hold it
under a lease they renew; a job whose lease expired (its worker died) is claimable again, so a crash mid-replay
only delays the job. Every lookup a client's id reaches is tenant scoped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, and_, cast, func, literal, or_, select, tuple_, update
from sqlalchemy.dialects.postgresql import ARRAY, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact, ForgetJob, WebhookDelivery
from app.db.statements import Sql, Statement
from app.forget.repositories.sealing import STREAM, open_jobs, opened_as, seal_job, seal_receipt
from app.keys.content import Sealer
from app.pagination import Position

ACTIVE = ("queued", "running")


# A job written beside a memory tombstone, in its transaction (the memory API's hot path runs on asyncpg: no ORM):
# queued for a worker, or already finished when it has nothing to replay.
_QUEUE = Statement(
    """
    INSERT INTO forget_jobs (id, tenant_id, status, strategy, target, reason, receipt, attempts, shred_leaves,
                             target_sealed, reason_sealed, leaf)
    VALUES (:id, :tenant_id, 'queued', :strategy, :target, :reason, :receipt, 0, :shred_leaves,
            :target_sealed, :reason_sealed, :leaf)
    """,
    json=["target", "receipt"],
)
_FINISHED = Statement(
    """
    INSERT INTO forget_jobs
           (id, tenant_id, status, strategy, target, reason, receipt, attempts, started_at, finished_at, shred_leaves,
            target_sealed, reason_sealed, leaf)
    VALUES (:id, :tenant_id, 'succeeded', :strategy, :target, :reason, :receipt, 1,
            clock_timestamp(), clock_timestamp(), :shred_leaves, :target_sealed, :reason_sealed, :leaf)
    """,
    json=["target", "receipt"],
)


async def queue(
    sql: Sql, sealer: Sealer | None, *, id: str, tenant_id: str, strategy: str, target: dict[str, Any],
    reason: str | None, receipt: dict[str, Any], finished: bool = False, shred_leaves: list[int] | None = None,
) -> None:
    """`shred_leaves`: the leaves the forget erased, to shred once it committed (None: it erased nothing sealed). A
    job written finished never needs its reason again: it is not stored at all, and its leaf (drawn, never used)
    only says so (its views show the target erased, as every ended job's)."""
    if finished:
        columns = await seal_job(sealer, tenant_id, id, target, None)
        if reason is not None and sealer is not None:
            columns["leaf"] = await sealer.leaf(tenant_id, STREAM)
    else:
        columns = await seal_job(sealer, tenant_id, id, target, reason)
    params = {"id": id, "tenant_id": tenant_id, "strategy": strategy, "receipt": receipt,
              "shred_leaves": shred_leaves, **columns}
    await sql.rowcount(_FINISHED if finished else _QUEUE, params)


# Only when every leaf the job records was among those punctured: a job written finished with its own leaf, or one a
# swap added leaves to meanwhile, stays pending for the worker's sweep (which passes the whole recorded set).
_MARK_SHREDDED = Statement(
    """
    UPDATE forget_jobs SET shredded_at = clock_timestamp()
     WHERE id = :id AND shredded_at IS NULL AND shred_leaves <@ CAST(:leaves AS bigint[])
    """
)
_PENDING_SHREDS = Statement(
    """
    SELECT id, tenant_id, shred_leaves FROM forget_jobs
     WHERE shred_leaves IS NOT NULL AND shredded_at IS NULL
     ORDER BY created_at
     LIMIT :limit
    """
)


@dataclass(frozen=True)
class PendingShred:
    id: str
    tenant_id: str
    leaves: list[int]


async def mark_shredded(sql: Sql, job_id: str, leaves: list[int]) -> None:
    """`leaves` are punctured in the key provider: the job's erasure at rest is complete if they are all it recorded
    (the first time counts)."""
    await sql.rowcount(_MARK_SHREDDED, {"id": job_id, "leaves": leaves})


async def pending_shreds(sql: Sql, *, limit: int) -> list[PendingShred]:
    """Jobs of any tenant whose leaves are not shredded yet, oldest first."""
    rows = await sql.all(_PENDING_SHREDS, {"limit": limit})
    return [PendingShred(r["id"], r["tenant_id"], list(r["shred_leaves"])) for r in rows]


_PENDING_BY_TENANT = Statement(
    """
    SELECT tenant_id, count(*) AS jobs, extract(epoch FROM clock_timestamp() - min(created_at)) AS oldest_s
      FROM forget_jobs
     WHERE shred_leaves IS NOT NULL AND shredded_at IS NULL
     GROUP BY tenant_id
    """
)


@dataclass(frozen=True)
class PendingSummary:
    jobs: int
    oldest_s: float  # the age of the oldest pending shred's job


async def pending_shreds_by_tenant(sql: Sql) -> dict[str, PendingSummary]:
    """Per tenant with any: how many jobs' shreds are pending, and how long the oldest has waited."""
    rows = await sql.all(_PENDING_BY_TENANT, {})
    return {r["tenant_id"]: PendingSummary(int(r["jobs"]), float(r["oldest_s"])) for r in rows}


async def create(
    db: AsyncSession, sealer: Sealer, *, id: str, tenant_id: str, target: dict[str, Any], reason: str | None,
    **values: Any,
) -> ForgetJob:
    """A new job, its target and reason sealed (sealing.py); the row returned holds them opened."""
    row = ForgetJob(id=id, tenant_id=tenant_id, **await seal_job(sealer, tenant_id, id, target, reason), **values)
    db.add(row)
    await db.flush()
    opened_as(row, target, reason)
    return row


async def get(
    db: AsyncSession, sealer: Sealer, tenant_id: str, job_id: str, *, for_update: bool = False
) -> ForgetJob | None:
    """The job with its target and reason opened (sealing.open_jobs)."""
    stmt = select(ForgetJob).where(ForgetJob.id == job_id, ForgetJob.tenant_id == tenant_id)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await db.execute(stmt.execution_options(populate_existing=True))).scalar_one_or_none()
    return None if row is None else (await open_jobs(sealer, [row]))[0]


async def opened(db: AsyncSession, sealer: Sealer, job: ForgetJob) -> ForgetJob:
    """A claimed job (`claim` returns it as stored) with its target and reason opened, for its worker."""
    return (await open_jobs(sealer, [job]))[0]


async def succeeded_for_artifact(
    db: AsyncSession, sealer: Sealer, tenant_id: str, artifact_id: str
) -> ForgetJob | None:
    """The latest succeeded job that forgot `artifact_id` (a repeated forget of a gone artifact answers it)."""
    stmt = (
        select(ForgetJob)
        .where(
            ForgetJob.tenant_id == tenant_id,
            ForgetJob.status == "succeeded",
            ForgetJob.target["artifact_id"].astext == artifact_id,
        )
        .order_by(ForgetJob.created_at.desc())
        .limit(1)
    )
    row = (await db.execute(stmt)).scalar_one_or_none()
    return None if row is None else (await open_jobs(sealer, [row]))[0]


async def claim(db: AsyncSession, owner: str, lease_s: float) -> ForgetJob | None:
    """Take the most urgent queued job (the oldest among equals: a detector's before any other forget), or a running
    one whose lease expired, and lease it to `owner`."""
    now = func.now()
    claimable = or_(
        and_(ForgetJob.status == "queued", or_(ForgetJob.run_after.is_(None), ForgetJob.run_after <= now)),
        and_(ForgetJob.status == "running", ForgetJob.lease_expires_at < now),
    )
    pick = (
        select(ForgetJob.id)
        .where(claimable)
        .order_by(ForgetJob.priority.desc(), ForgetJob.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    stmt = (
        update(ForgetJob)
        .where(ForgetJob.id == pick)
        .values(
            status="running",
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_s),
            attempts=ForgetJob.attempts + 1,
            started_at=func.coalesce(ForgetJob.started_at, now),
        )
        .returning(ForgetJob)
    )
    return (await db.execute(stmt.execution_options(populate_existing=True))).scalar_one_or_none()


async def renew(db: AsyncSession, job_id: str, owner: str, lease_s: float) -> bool:
    """Extend the lease; False when the job is no longer ours (expired and claimed by another worker)."""
    stmt = (
        update(ForgetJob)
        .where(ForgetJob.id == job_id, ForgetJob.lease_owner == owner, ForgetJob.status == "running")
        .values(lease_expires_at=func.now() + timedelta(seconds=lease_s))
        .returning(ForgetJob.id)
    )
    return (await db.execute(stmt)).scalar_one_or_none() is not None


async def lock_owned(db: AsyncSession, job_id: str, owner: str) -> ForgetJob | None:
    """Lock the job row if `owner` still holds its lease (the check that a stale worker cannot write)."""
    stmt = (
        select(ForgetJob)
        .where(ForgetJob.id == job_id, ForgetJob.lease_owner == owner, ForgetJob.status == "running")
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return (await db.execute(stmt)).scalar_one_or_none()


async def requeue(db: AsyncSession, job_id: str, owner: str, *, after_s: float = 0.0) -> None:
    """Back to the queue, claimable again `after_s` from now (its session was busy: let the turn end)."""
    await db.execute(
        update(ForgetJob)
        .where(ForgetJob.id == job_id, ForgetJob.lease_owner == owner)
        .values(status="queued", lease_owner=None, lease_expires_at=None,
                run_after=func.now() + timedelta(seconds=after_s))
    )


async def finish(
    db: AsyncSession,
    job_id: str,
    *,
    status: str,
    target: dict[str, Any],
    receipt: dict[str, Any],
    error: str | None,
    finished_at: datetime | None,
) -> None:
    """`target`: the id-only form a finished job keeps (sealing.clear_target). Its ciphertexts go with its end (their
    leaf joined the shred set before: `add_shred_leaves`)."""
    await db.execute(
        update(ForgetJob)
        .where(ForgetJob.id == job_id)
        .values(
            status=status, target=target, receipt=receipt, error=error, finished_at=finished_at,
            lease_owner=None, lease_expires_at=None, target_sealed=None, reason_sealed=None, receipt_sealed=None,
        )
    )


async def park(db: AsyncSession, sealer: Sealer, job: ForgetJob, receipt: dict[str, Any]) -> None:
    """needs_input: released from its worker, waiting for the client (the call it waits on sealed: sealing.py)."""
    columns = await seal_receipt(sealer, job, receipt)
    await db.execute(
        update(ForgetJob)
        .where(ForgetJob.id == job.id)
        .values(status="needs_input", lease_owner=None, lease_expires_at=None, **columns)
    )


async def confirm_plan(
    db: AsyncSession, sealer: Sealer, job: ForgetJob, strategy: str, reason: str | None, *, shred_now: bool = False
) -> bool:
    """A planned job (opened) becomes queued (its plan, kept in the receipt, gives way to the receipt to come), its
    target and `reason` sealed again under its leaf; False when it was confirmed already."""
    columns = await seal_job(sealer, job.tenant_id, job.id, job.target, reason, leaf=job.leaf)
    stmt = (
        update(ForgetJob)
        .where(ForgetJob.tenant_id == job.tenant_id, ForgetJob.id == job.id, ForgetJob.status == "planned")
        .values(status="queued", strategy=strategy, receipt={}, shred_now=shred_now, **columns)
        .returning(ForgetJob.id)
    )
    return (await db.execute(stmt)).first() is not None


async def requeue_with(db: AsyncSession, sealer: Sealer, job: ForgetJob, receipt: dict[str, Any]) -> None:
    """Queued again with the client's tool result in its receipt (sealed: sealing.py)."""
    columns = await seal_receipt(sealer, job, receipt)
    await db.execute(update(ForgetJob).where(ForgetJob.id == job.id).values(status="queued", **columns))


async def save_receipt(db: AsyncSession, sealer: Sealer, job: ForgetJob, receipt: dict[str, Any]) -> None:
    """`job`: the row as stored (`lock_owned`'s), whose leaf seals what of the receipt is content."""
    await db.execute(update(ForgetJob).where(ForgetJob.id == job.id).values(**await seal_receipt(sealer, job, receipt)))


async def add_shred_leaves(db: AsyncSession, job_id: str, leaves: Sequence[int]) -> None:
    """Leaves one more swap of the job erased, to shred once it committed; the job's shred is pending again (a
    memory forget's cascade job may have shredded its record's leaf already: shredding that again is a no-op)."""
    if leaves:
        await db.execute(
            update(ForgetJob).where(ForgetJob.id == job_id).values(
                shred_leaves=func.array_cat(func.coalesce(ForgetJob.shred_leaves, cast([], ARRAY(BigInteger))),
                                            cast(list(leaves), ARRAY(BigInteger))),
                shredded_at=None,
            )
        )


async def queue_depth(db: AsyncSession) -> int:
    stmt = select(func.count()).select_from(ForgetJob).where(ForgetJob.status.in_(ACTIVE))
    return int((await db.execute(stmt)).scalar_one())


# -- webhook deliveries ---------------------------------------------------------------------------------------


async def record_delivery(db: AsyncSession, tenant_id: str, webhook_id: str) -> bool:
    """Insert the delivery; False when this webhook id was seen before. A concurrent first delivery makes this
    wait for its transaction, so exactly one of two racing deliveries starts a job."""
    stmt = (
        insert(WebhookDelivery)
        .values(tenant_id=tenant_id, webhook_id=webhook_id)
        .on_conflict_do_nothing(index_elements=["tenant_id", "webhook_id"])
        .returning(WebhookDelivery.webhook_id)
    )
    return (await db.execute(stmt)).scalar_one_or_none() is not None


async def delivery_job(db: AsyncSession, tenant_id: str, webhook_id: str) -> str | None:
    stmt = select(WebhookDelivery.forget_id).where(
        WebhookDelivery.tenant_id == tenant_id, WebhookDelivery.webhook_id == webhook_id
    )
    return (await db.execute(stmt)).scalar_one_or_none()


async def link_delivery(db: AsyncSession, tenant_id: str, webhook_id: str, forget_id: str) -> None:
    await db.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.tenant_id == tenant_id, WebhookDelivery.webhook_id == webhook_id)
        .values(forget_id=forget_id)
    )


async def page(
    db: AsyncSession,
    sealer: Sealer,
    tenant_id: str,
    *,
    after: Position | None,
    limit: int,
    status: str | None = None,
    session_id: str | None = None,
) -> list[ForgetJob]:
    """Up to `limit` jobs, newest first, older than `after`. A session filter matches the job's target session (also
    through a target artifact's session) and every session its receipt (or plan) reached, so a memory cascade's job
    lists under each session it replayed."""
    stmt = select(ForgetJob).where(ForgetJob.tenant_id == tenant_id)
    if after is not None:
        stmt = stmt.where(
            tuple_(ForgetJob.created_at, ForgetJob.id) < tuple_(literal(after.created_at), literal(after.id))
        )
    if status is not None:
        stmt = stmt.where(ForgetJob.status == status)
    if session_id is not None:
        stmt = stmt.where(
            or_(
                ForgetJob.target["session_id"].astext == session_id,
                ForgetJob.receipt.contains({"sessions": [{"session_id": session_id}]}),
                # a queued artifact target names no session until it runs: its artifact still does
                select(Artifact.id)
                .where(Artifact.id == ForgetJob.target["artifact_id"].astext, Artifact.session_id == session_id)
                .exists(),
            )
        )
    stmt = stmt.order_by(ForgetJob.created_at.desc(), ForgetJob.id.desc()).limit(limit)
    return await open_jobs(sealer, list((await db.execute(stmt)).scalars()))


async def deliveries(
    db: AsyncSession, tenant_id: str, *, after: Position | None, limit: int
) -> list[tuple[WebhookDelivery, str | None]]:
    """Up to `limit` detector-webhook deliveries, newest first, each with its job's status (None: no job)."""
    stmt = (
        select(WebhookDelivery, ForgetJob.status)
        .outerjoin(ForgetJob, ForgetJob.id == WebhookDelivery.forget_id)
        .where(WebhookDelivery.tenant_id == tenant_id)
    )
    if after is not None:
        stmt = stmt.where(
            tuple_(WebhookDelivery.received_at, WebhookDelivery.webhook_id)
            < tuple_(literal(after.created_at), literal(after.id))
        )
    stmt = stmt.order_by(WebhookDelivery.received_at.desc(), WebhookDelivery.webhook_id.desc()).limit(limit)
    return [(row, status) for row, status in (await db.execute(stmt)).all()]
