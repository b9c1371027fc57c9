"""The one place that turns errors into HTTP answers, in the format of the route that failed.

Each error type declares its problem once (status, type slug, title: app/errors.py). How it is written is the
route's: a router chooses its `ErrorFormat` by its route class (`FormattedRoute`); the native routes, and requests
that matched no route, answer RFC 9457 problem+json (`PROBLEMS`). The OpenAI-compatible router answers OpenAI's
error body (app/openai_compat/errors.py), so an SDK parses it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import Scope

from app.errors import DatabaseUnavailable, LetheError, NotFound
from app.web.deps import authenticate_first
from app.web.params import UNKNOWN_ID
from app.web.schemas import ProblemDetails

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://lethe.dev/problems/"
log = logging.getLogger(__name__)

_HTTP_TITLES = {
    400: "Bad request", 401: "Missing or invalid credentials", 404: "Not found", 405: "Method not allowed",
    406: "Not acceptable", 409: "Conflicting state", 413: "Payload too large", 415: "Unsupported media type",
    422: "Invalid request", 429: "Too many requests",
}

_BODY_ERRORS = frozenset({400, 415, 422})


def problem(status: int, slug: str, title: str, detail: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": TYPE_BASE + slug, "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return body


def problem_doc(description: str) -> dict[str, Any]:
    """An OpenAPI `responses` entry for a problem+json answer."""
    return {"description": description, "model": ProblemDetails, "content": {PROBLEM_JSON: {}}}


def problem_response(error: LetheError, *, instance: str | None = None) -> JSONResponse:
    body = problem(error.status, error.type_slug, error.title, error.detail, **error.extra)
    if instance:
        body["instance"] = instance
    headers = dict(error.headers)
    if error.status == 401:
        headers.setdefault("WWW-Authenticate", 'Bearer realm="lethe"')
    return JSONResponse(body, status_code=error.status, headers=headers, media_type=PROBLEM_JSON)


_LOC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")


def _loc_step(step: Any) -> Any:
    """A location step as it may be echoed: an index or a name. An unknown member's name is the client's text (a
    NUL in it, or words it wants forgotten): it is replaced."""
    return step if isinstance(step, int) or (isinstance(step, str) and _LOC_NAME.fullmatch(step)) else "<member>"


def _jsonable_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        # Echo where and why, never the offending input: it may be the very text a client wants forgotten.
        loc = [_loc_step(step) for step in err.get("loc", ())]
        msg = str(err.get("msg", ""))
        for given in (err.get("input"), (err.get("ctx") or {}).get("tag")):  # a few messages quote the input
            if isinstance(given, str) and given and given in msg:
                msg = msg.replace(given, "<input>")
        out.append({"loc": loc, "msg": msg, "type": err.get("type", "")})
    return out


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path: Starlette's 405 names only the first route matching the path
    (`POST /v1/sessions` when `GET /v1/sessions` is a second route)."""
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods |= route.methods
    return ", ".join(sorted(methods))


def _unparsable_body(path: str) -> JSONResponse:
    """A body FastAPI cannot even decode (not UTF-8) is a validation error like a body that is not JSON: 422."""
    body = problem(422, "validation-error", "Invalid request", "the request does not match the schema",
                   errors=[{"loc": ["body"], "msg": "the body is not JSON in UTF-8", "type": "json_invalid"}],
                   instance=path)
    return JSONResponse(body, status_code=422, media_type=PROBLEM_JSON)


class ErrorFormat(Protocol):
    """How a front door writes its errors."""

    def domain(self, error: LetheError, path: str) -> JSONResponse: ...

    def validation(self, errors: Sequence[Mapping[str, Any]], path: str) -> JSONResponse:
        """A request that does not match the schema (`errors`: where and why, never the input)."""
        ...

    def http(self, status: int, message: str | None, headers: Mapping[str, str], path: str) -> JSONResponse:
        """Routing and protocol errors (404, 405, 415, a body that does not parse...)."""
        ...

    def unexpected(self, path: str) -> JSONResponse: ...


class ProblemFormat:
    """RFC 9457 problem+json, the native routes' format."""

    def domain(self, error: LetheError, path: str) -> JSONResponse:
        return problem_response(error, instance=path)

    def validation(self, errors: Sequence[Mapping[str, Any]], path: str) -> JSONResponse:
        body = problem(422, "validation-error", "Invalid request", "the request does not match the schema",
                       errors=list(errors), instance=path)
        return JSONResponse(body, status_code=422, media_type=PROBLEM_JSON)

    def http(self, status: int, message: str | None, headers: Mapping[str, str], path: str) -> JSONResponse:
        if status == 400:
            return _unparsable_body(path)
        title = _HTTP_TITLES.get(status, "HTTP error")
        detail = message if message != title else None
        body = problem(status, "http-" + str(status), title, detail, instance=path)
        return JSONResponse(body, status_code=status, headers=dict(headers), media_type=PROBLEM_JSON)

    def unexpected(self, path: str) -> JSONResponse:
        body = problem(500, "internal-error", "Internal error", "an unexpected error occurred; see the server log",
                       instance=path)
        return JSONResponse(body, status_code=500, media_type=PROBLEM_JSON)


PROBLEMS = ProblemFormat()


class FormattedRoute(APIRoute):
    """A route whose errors are written in its router's format: `APIRouter(route_class=...)` with a subclass that
    sets `error_format`. FastAPI puts the matched route in the scope (a path that matched with another method too),
    which is where the handlers below read it."""

    error_format: ClassVar[ErrorFormat] = PROBLEMS


def format_of(scope: Scope) -> ErrorFormat:
    route = scope.get("route")
    return route.error_format if isinstance(route, FormattedRoute) else PROBLEMS


def error_response(scope: Scope, error: LetheError) -> JSONResponse:
    """A domain error in the format of the route the request matched (problem+json when none)."""
    return format_of(scope).domain(error, scope.get("path", ""))


def _error_response(request: Request, error: LetheError) -> JSONResponse:
    return error_response(request.scope, error)


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(LetheError)
    async def _domain(request: Request, exc: LetheError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        try:
            await authenticate_first(request)
        except LetheError as denied:
            return _error_response(request, denied)
        if any(e.get("type") == UNKNOWN_ID and tuple(e.get("loc", ()))[:1] == ("path",) for e in exc.errors()):
            # A path id that cannot exist (app/web/params.py) is an unknown id, answered before any lookup.
            return _error_response(request, NotFound("no object has this id"))
        return format_of(request.scope).validation(_jsonable_errors(exc), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in _BODY_ERRORS:  # a body FastAPI could not even parse: authenticate first, as above
            try:
                await authenticate_first(request)
            except LetheError as denied:
                return _error_response(request, denied)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request)
        message = exc.detail if isinstance(exc.detail, str) else None
        return format_of(request.scope).http(exc.status_code, message, headers, request.url.path)

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:  # the connection died under the request (a restart, a failover)
            log.warning("database connection lost; the pool reconnects", extra={"path": request.url.path})
            lost = DatabaseUnavailable("the database connection was lost; retry", headers={"Retry-After": "1"})
            return _error_response(request, lost)
        return await _unexpected(request, exc)

    # The same on the hot path's asyncpg pool (app/db/database.py `Database.pg`): the backend was terminated or the
    # socket died mid-statement. The pool replaces a closed connection at its next checkout. A backend terminated
    # while its connection sat idle in the pool can also surface, at the next statement, as the protocol still
    # "in" the operation the termination interrupted (InternalClientError); the pool's reset then drops it.
    @app.exception_handler(asyncpg.PostgresConnectionError)
    @app.exception_handler(asyncpg.exceptions.OperatorInterventionError)
    @app.exception_handler(asyncpg.InterfaceError)
    @app.exception_handler(asyncpg.InternalClientError)
    async def _pg_connection(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, asyncpg.InterfaceError) and "closed" not in str(exc):
            return await _unexpected(request, exc)  # a misuse of the driver, not a lost connection
        if isinstance(exc, asyncpg.InternalClientError) and "in progress" not in str(exc):
            return await _unexpected(request, exc)
        log.warning("database connection lost; the pool reconnects", extra={"path": request.url.path})
        lost = DatabaseUnavailable("the database connection was lost; retry", headers={"Retry-After": "1"})
        return _error_response(request, lost)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"path": request.url.path})
        return format_of(request.scope).unexpected(request.url.path)
