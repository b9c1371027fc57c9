"""Typed exceptions for the Lethe client: one mapping from problem+json answers, shared by the sync and async clients.

Branch on the class (or `problem_type`), never on `detail`: details are prose for humans.
"""

from __future__ import annotations

from typing import Any

import httpx


class LetheAPIError(Exception):
    """Any non-2xx answer. `problem` is the problem+json body (or {} when the body was not one)."""

    def __init__(self, status: int, problem: dict[str, Any], headers: httpx.Headers | None = None) -> None:
        self.status = status
        self.problem = problem
        self.headers = headers if headers is not None else httpx.Headers()
        self.problem_type = str(problem.get("type", ""))
        self.detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
        super().__init__(f"{status}: {self.detail}")


class Unauthorized(LetheAPIError):
    """401: missing, unknown or revoked API key."""


class NotFound(LetheAPIError):
    """404: unknown id, another tenant's id, or a memory key that was never written (`version` 0)."""

    @property
    def version(self) -> int:
        return int(self.problem.get("version") or 0)


class Forgotten(NotFound):
    """404 with `forgotten: true`: the key was forgotten; `version` is the tombstone version."""


class Conflict(LetheAPIError):
    """409: conflicting state."""


class SessionBusy(Conflict):
    """409 `session_busy`: a forget is running on the session; retry after `retry_after` seconds."""

    @property
    def retry_after(self) -> float | None:
        return _retry_after(self.headers)


class LegalHold(Conflict):
    """409 `legal_hold`: a standing legal hold covers what was to be erased, and nothing was; `hold_id` names it
    (release it with `release_hold`, which also runs the erasures it deferred)."""

    @property
    def hold_id(self) -> str | None:
        value = self.problem.get("hold_id")
        return None if value is None else str(value)


class PreconditionFailed(LetheAPIError):
    """412: the write was based on a version the key no longer has (a tombstone included)."""

    @property
    def current_version(self) -> int:
        return int(self.problem.get("current_version") or 0)

    @property
    def forgotten(self) -> bool:
        return bool(self.problem.get("forgotten", False))

    @property
    def conflicts(self) -> list[dict[str, Any]]:
        """For a rejected atomic batch: every write that would not land."""
        return list(self.problem.get("conflicts") or [])


class PreconditionRequired(LetheAPIError):
    """428: a memory write without If-Match or If-None-Match."""


class PayloadTooLarge(LetheAPIError):
    """413: the body or prompt exceeds the server's limit."""


class ValidationError(LetheAPIError):
    """422: the request does not match the schema or its meaning is invalid."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.problem.get("errors") or [])


class RateLimited(LetheAPIError):
    """429: slow down for `retry_after` seconds."""

    @property
    def retry_after(self) -> float | None:
        return _retry_after(self.headers)


class ServerError(LetheAPIError):
    """5xx: a bug or an outage (503 while the service is not ready)."""


class ForgetNotDurable(RuntimeError):
    """`confirm_forget` kept reading the key as live after re-forgetting it `attempts` times."""


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _problem_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _conflict(problem_type: str) -> type[Conflict]:
    """The 409 subclass its problem type names (API.md's slugs; the hyphenated spelling accepted as well)."""
    if problem_type.endswith(("session-busy", "session_busy")):
        return SessionBusy
    if problem_type.endswith(("legal-hold", "legal_hold")):
        return LegalHold
    return Conflict


def error_for(response: httpx.Response) -> LetheAPIError:
    """The typed exception for a non-2xx response."""
    status = response.status_code
    problem = _problem_body(response)
    cls: type[LetheAPIError]
    if status == 401:
        cls = Unauthorized
    elif status == 404:
        cls = Forgotten if problem.get("forgotten") is True else NotFound
    elif status == 409:
        cls = _conflict(str(problem.get("type", "")).rstrip("/"))
    elif status == 412:
        cls = PreconditionFailed
    elif status == 413:
        cls = PayloadTooLarge
    elif status == 422:
        cls = ValidationError
    elif status == 428:
        cls = PreconditionRequired
    elif status == 429:
        cls = RateLimited
    elif status >= 500:
        cls = ServerError
    else:
        cls = LetheAPIError
    return cls(status, problem, response.headers)


def raise_for_problem(response: httpx.Response) -> None:
    if response.is_success:
        return
    raise error_for(response)
