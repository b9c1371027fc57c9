"""OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`, on the compatible routes.

The official SDKs raise their typed exceptions from the status code (400 BadRequestError, 401 AuthenticationError,
404 NotFoundError, 409 ConflictError, 422 UnprocessableEntityError, ...) and read `message` from this body, so the
compatible routes answer it instead of problem+json. Statuses are the native API's; `code` is the native problem
type (e.g. `session_busy`), so a client can branch on it the same way. One difference: a request that does not
match the schema answers 400 naming the parameter (`param`), as OpenAI does, rather than the native 422.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fastapi.responses import JSONResponse

from app.errors import LetheError


class BadParameter(LetheError):
    """A parameter Lethe cannot honour, or a value it rejects: 400 naming it (never a silent ignore)."""

    status: ClassVar[int] = 400
    type_slug: ClassVar[str] = "invalid_request_error"
    title: ClassVar[str] = "Invalid request"

    def __init__(self, param: str, detail: str) -> None:
        super().__init__(detail, param=param)


class ModelNotFound(LetheError):
    status: ClassVar[int] = 404
    type_slug: ClassVar[str] = "model_not_found"
    title: ClassVar[str] = "Model not found"

    def __init__(self, model: str, served: str) -> None:
        super().__init__(f"the model {model!r} does not exist here; this server serves {served!r}", param="model")


def _type_of(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _type_of(status), "param": param, "code": code}}


def response(
    status: int, message: str, *, param: str | None = None, code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(body(status, message, param=param, code=code), status_code=status, headers=dict(headers or {}))


def from_lethe(error: LetheError) -> JSONResponse:
    headers = dict(error.headers)
    if error.status == 401:
        headers.setdefault("WWW-Authenticate", 'Bearer realm="lethe"')
    param = error.extra.get("param")
    code = "invalid_api_key" if error.status == 401 else error.type_slug
    return response(error.status, error.detail, param=param if isinstance(param, str) else None, code=code,
                     headers=headers)


def param_of(loc: Sequence[Any]) -> str | None:
    """`("body", "input", 0, "role")` → `input[0].role` (OpenAI's way of naming a nested parameter)."""
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    # pydantic names a union's branch in the location (`str`, `list[...]`, `function-after[...]`): not a parameter.
    parts = [p for p in parts if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool")))]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def from_validation(errors: Sequence[Mapping[str, Any]]) -> JSONResponse:
    """A request that does not match the schema: 400 naming the first offending parameter (never its value: it may
    be the very text a client wants forgotten)."""
    first = errors[0] if errors else {}
    param = param_of(list(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        message = f"Unsupported parameter: {param!r} is not supported by this server."
    else:
        message = f"Invalid value for {param!r}: {first.get('msg', 'invalid')}." if param else str(first.get("msg"))
    return response(400, message, param=param, code="invalid_value" if first.get("type") != "extra_forbidden"
                    else "unsupported_parameter")


class OpenAIErrors:
    """The compatible routes' `ErrorFormat` (app/web/problems.py)."""

    def domain(self, error: LetheError, path: str) -> JSONResponse:
        return from_lethe(error)

    def validation(self, errors: Sequence[Mapping[str, Any]], path: str) -> JSONResponse:
        return from_validation(errors)

    def http(self, status: int, message: str | None, headers: Mapping[str, str], path: str) -> JSONResponse:
        return response(status, message or _HTTP_MESSAGES.get(status, "HTTP error"), code=f"http_{status}",
                        headers=headers)

    def unexpected(self, path: str) -> JSONResponse:
        return response(500, "an unexpected error occurred; see the server log", code="internal-error")


_HTTP_MESSAGES = {404: "Not found", 405: "Method not allowed", 415: "Unsupported media type"}
OPENAI_ERRORS = OpenAIErrors()
