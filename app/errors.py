"""Typed domain errors. Services raise these; the API layer maps them once to problem+json (app/web/problems.py).

Each error carries its HTTP status, a stable `type` slug and optional extra members, so a client can branch on
`type` instead of parsing `detail`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class LetheError(Exception):
    status: ClassVar[int] = 500
    type_slug: ClassVar[str] = "internal-error"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str | None = None, *, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.headers = headers or {}
        self.extra = extra


class Unauthorized(LetheError):
    status = 401
    type_slug = "unauthorized"
    title = "Missing or invalid credentials"


class NotFound(LetheError):
    status = 404
    type_slug = "not-found"
    title = "Not found"


class Conflict(LetheError):
    status = 409
    type_slug = "conflict"
    title = "Conflicting state"


class SessionBusy(Conflict):
    type_slug = "session_busy"  # the name API.md gives clients
    title = "Session is busy"


class LegalHold(Conflict):
    """What a standing legal hold covers cannot be erased; the problem names the hold (`hold_id`)."""

    type_slug = "legal_hold"  # the name API.md gives clients
    title = "Under legal hold"

    def __init__(self, hold_id: str, what: str) -> None:
        super().__init__(f"{what} is under legal hold {hold_id!r}; release the hold first", hold_id=hold_id)
        self.hold_id = hold_id


class DatabaseUnavailable(LetheError):
    status = 503
    type_slug = "database-unavailable"
    title = "Database unavailable"


class PreconditionFailed(LetheError):
    status = 412
    type_slug = "precondition-failed"
    title = "Precondition failed"


class PreconditionRequired(LetheError):
    status = 428
    type_slug = "precondition-required"
    title = "Precondition required"


class PayloadTooLarge(LetheError):
    status = 413
    type_slug = "payload-too-large"
    title = "Payload too large"


class InvalidRequest(LetheError):
    """Well-formed JSON whose meaning is invalid (e.g. two forget targets). Malformed payloads are 422 too."""

    status = 422
    type_slug = "invalid-request"
    title = "Invalid request"


class RateLimited(LetheError):
    status = 429
    type_slug = "rate-limited"
    title = "Too many requests"


class NotReady(LetheError):
    status = 503
    type_slug = "not-ready"
    title = "Service not ready"


class EngineUnavailable(NotReady):
    """The engine went away under a request: the engine process died or restarts, or a vLLM server of the fleet
    died mid-request. Nothing of the request was committed; a retry (after `Retry-After`) is served by the engine as
    it comes back, or by another server of the fleet."""

    type_slug = "engine-unavailable"
    title = "Engine unavailable"

    def __init__(self, detail: str | None = None, *, retry_after_s: int = 1, **extra: Any) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after_s)}, **extra)
