"""Input rules of the memory API: names, values, preconditions and cursors.

Bad input is a 422 here, never a database error turned 500 later. The name rules repeat the API schemas' patterns
because other services (the forget cascade) call the memory service without going through HTTP.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any

from app.errors import InvalidRequest, PreconditionRequired
from app.text import storable

# Used with fullmatch: Python's `$` would also accept a trailing newline.
_NAMESPACE = re.compile(r"[^/:\x00-\x1f\x7f]{1,200}")  # ':' is reserved for `{namespace}:batch`
_KEY = re.compile(r"[^/\x00-\x1f\x7f]{1,200}")
_SOURCE = re.compile(r"[^\x00-\x1f\x7f]{1,100}")
_ETAG = re.compile(r'(?:W/)?"?(\d{1,18})"?')
MAX_DEPTH = 64  # arrays and objects; facts are shallow, and pydantic refuses to serialize a few hundred levels


def etag(version: int) -> str:
    return f'"{version}"'


def check_namespace(namespace: str) -> None:
    if not _NAMESPACE.fullmatch(namespace):
        raise InvalidRequest("namespace must be 1-200 characters without '/', ':' or control characters")


def check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise InvalidRequest("key must be 1-200 characters without '/' or control characters")


def check_source(source: str) -> None:
    if not _SOURCE.fullmatch(source):
        raise InvalidRequest("source must be 1-100 characters without control characters")


def check_value(value: Any) -> None:
    """Reject what JSON parsing lets through but jsonb refuses, and nesting deeper than MAX_DEPTH (the response
    serializer has a depth limit of its own: a value it cannot render would be writable but never readable).
    Iterative, so a deep value cannot overflow the stack here."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not storable(item):
                raise InvalidRequest("value holds a NUL character or an unpaired surrogate")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidRequest("value holds NaN or Infinity, which JSON cannot represent")
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise InvalidRequest(f"value nests deeper than {MAX_DEPTH} levels")
            if isinstance(item, list):
                stack.extend((inner, depth + 1) for inner in item)
                continue
            for member, inner in item.items():
                if not isinstance(member, str) or not storable(member):
                    raise InvalidRequest("value holds an object member name that cannot be stored")
                stack.append((inner, depth + 1))


def base_version_from_headers(if_match: str | None, if_none_match: str | None) -> int:
    """The version a PUT is based on: If-Match's ETag, or 0 for `If-None-Match: *` (create a never-written key).

    `If-Match: "0"` (the ETag a never-written key's 404 carries) is the same as `If-None-Match: *`.
    Bare digits and weak ETags are accepted: the ETag is only ever a version number, so there is nothing to
    compare weakly. `If-Match: *` ("whatever is there") is refused with 428: it would let a stale writer overwrite
    a tombstone without proving it saw the forget.
    """
    if if_match is not None and if_none_match is not None:
        raise InvalidRequest("send either If-Match or If-None-Match, not both")
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise InvalidRequest('If-None-Match supports only "*" (create a key that was never written)')
        return 0
    if if_match is None:
        raise PreconditionRequired(
            'send If-Match: "<version you read>" to update, or If-None-Match: * to create a never-written key'
        )
    if if_match.strip() == "*":
        raise PreconditionRequired('If-Match: * proves nothing: send If-Match: "<version you read>"')
    matched = _ETAG.fullmatch(if_match.strip())
    if matched is None:
        raise InvalidRequest('If-Match must be one ETag of the form "<version>"')
    return int(matched.group(1))


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        key = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest("cursor is not one this API handed out") from None
    if not _KEY.fullmatch(key):
        raise InvalidRequest("cursor is not one this API handed out")
    return key
