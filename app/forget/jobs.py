"""Forget jobs as the service answers them, and the signals a running job raises to its worker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from app.db.models import ForgetJob
from app.forget.receipts import (
    DerivedMemory,
    JobReceipt,
    MemoryEntry,
    PendingInput,
    RetentionEntry,
    SessionEntry,
    SideEffect,
    SubjectEntry,
)

DEFAULT_STRATEGY: Final = "selective_replay"
# needs_input: finished until the client answers; held: until the legal hold it waits on is released.
TERMINAL: Final = ("succeeded", "failed", "needs_input", "held")


class LeaseLost(Exception):
    """Another worker took the job over (this one stalled past its lease): nothing of this attempt may commit."""


class Retry(Exception):
    """The job cannot progress now (session busy, model loading): requeue it."""


class ShredWait(Retry):
    """A `"shred": "now"` job whose sessions are all done but whose shred the key provider refused: it runs its end
    again (no attempt limit: nothing is left to fail, only to destroy) and reads as ended once the shred landed."""


class Held(Exception):
    """A standing legal hold covers what the job would change (a session, a subject): the job waits on the hold
    (status `held`), and its release queues the job again (app/holds/service.py). `scope`: `{session_id}` or
    `{subject_id}`, recorded on the hold's `deferred` event."""

    def __init__(self, hold_id: str, scope: dict[str, str]) -> None:
        super().__init__(f"{scope} is under legal hold {hold_id}")
        self.hold_id = hold_id
        self.scope = scope


@dataclass(frozen=True)
class Outcome:
    """What a job run outside the session machinery (a `Runner`: a data subject's erasure) leaves for its end: its
    receipt, and the leaves of what it erased, shredded with the job's own."""

    receipt: JobReceipt
    leaves: list[int]


# A job whose strategy is not a session forget (`ForgetExecutor.runners`): given the claimed job, its target opened.
Runner = Callable[[ForgetJob], Awaitable[Outcome]]


@dataclass(frozen=True)
class Erasure:
    """Where a forget's erasure stands: `live` (no live row holds what it erased: the job succeeded) and `at_rest`
    (every leaf it erased is punctured in the key provider, so no copy of the database can give it back)."""

    live: Literal["pending", "complete"]
    at_rest: Literal["pending", "complete"]
    at_rest_complete_at: datetime | None
    horizon_s: int
    overdue: bool  # at_rest still pending past the horizon


DEFAULT_HORIZON_S: Final = 300  # Settings.erasure_horizon_s's default


def erasure_of(job: ForgetJob, receipt: JobReceipt) -> Erasure | None:
    """None for a job that promised nothing at rest: what it erased is not sealed yet (issue 42 seals memory values
    first; rows written before migration 0016 are plaintext), so shredding cannot make it unrecoverable."""
    if job.shred_leaves is None or receipt.erasure_horizon_s is None:
        return None
    # The horizon runs from the forget's success (a memory DELETE's job succeeds as it is created).
    since = job.finished_at or job.created_at
    overdue = job.shredded_at is None and since is not None and (
        datetime.now(UTC) - since > timedelta(seconds=receipt.erasure_horizon_s)
    )
    return Erasure(
        live="complete" if job.status == "succeeded" else "pending",
        at_rest="complete" if job.shredded_at is not None else "pending",
        at_rest_complete_at=job.shredded_at,
        horizon_s=receipt.erasure_horizon_s,
        overdue=overdue,
    )


@dataclass(frozen=True)
class Submission:
    target: dict[str, Any] | None = None  # None: `plan_id` names a stored plan to confirm
    strategy: str | None = None  # None: the plan's, or selective_replay
    dry_run: bool = False
    wait: bool = False
    reason: str | None = None
    plan_id: str | None = None
    shred_now: bool = False  # `"shred": "now"`: refused while the key provider is down; ends once shredded


@dataclass
class JobView:
    id: str
    status: str
    strategy: str
    target: dict[str, Any]
    sessions: list[SessionEntry] = field(default_factory=list)
    memory: MemoryEntry | None = None
    suppressed_side_effects: list[SideEffect] = field(default_factory=list)
    committed_side_effects: list[SideEffect] = field(default_factory=list)
    pending: PendingInput | None = None
    derived_memory: list[DerivedMemory] = field(default_factory=list)
    subject: SubjectEntry | None = None
    retention: RetentionEntry | None = None
    duration_ms: int | None = None
    erasure: Erasure | None = None
    error: str | None = None
    hold_id: str | None = None  # the legal hold a `held` job waits on
    reason: str | None = None
    target_erased: bool = False  # its sealed target and reason ended with it: `target` holds ids and lengths only
    dry_run: bool = False
    created_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL or self.dry_run


def view_of(job: ForgetJob) -> JobView:
    receipt = JobReceipt.load(job.receipt)
    return JobView(
        id=job.id,
        status=job.status,
        strategy=job.strategy,
        target=job.target,
        sessions=receipt.sessions,
        memory=receipt.memory,
        suppressed_side_effects=receipt.suppressed_side_effects,
        committed_side_effects=receipt.committed_side_effects,
        pending=receipt.pending,
        derived_memory=receipt.derived_memory,
        subject=receipt.subject,
        retention=receipt.retention,
        duration_ms=receipt.duration_ms,
        erasure=erasure_of(job, receipt),
        error=job.error,
        hold_id=job.held_by,
        reason=job.reason,
        target_erased=job.target_erased,
        created_at=job.created_at,
        finished_at=job.finished_at,
    )
