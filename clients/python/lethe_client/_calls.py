"""What each client method sends and how it reads the answer, written once for the sync and the async client.

A `Call` is pure data plus a parser; the two clients differ only in how they perform it (and how they sleep).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

import httpx

T = TypeVar("T")
TERMINAL_FORGET_STATUSES = frozenset({"succeeded", "failed", "needs_input", "held"})


@dataclass(frozen=True)
class MemoryRecord:
    namespace: str
    key: str
    value: Any
    version: int
    source: str
    updated_at: datetime


@dataclass(frozen=True)
class WriteResult:
    namespace: str
    key: str
    version: int
    created: bool


@dataclass(frozen=True)
class ForgetResult:
    version: int  # the tombstone version: If-Match with it re-establishes the key
    forget_id: str | None
    already_forgotten: bool


@dataclass(frozen=True)
class BatchItem:
    key: str
    status: int  # 200, 201 or 412
    version: int | None
    current_version: int
    forgotten: bool


@dataclass(frozen=True)
class KeyPage:
    keys: list[str]
    next_cursor: str | None


@dataclass(frozen=True)
class RecordPage:
    """A page of a namespace's live records with their values, in key order (`list_records`)."""

    records: list[MemoryRecord]
    next_cursor: str | None


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    op: str  # "write" | "forget"
    source: str
    at: datetime
    value: Any  # None for forgets and for writes a later forget erased
    erased: bool


class BytesSink(Protocol):
    """Where a streamed answer's bytes go: a file opened "wb", a BytesIO, a socket's writer."""

    def write(self, data: bytes, /) -> object: ...


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str | int] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def _seg(value: str) -> str:
    """One path segment, percent-encoded: keys may hold spaces, '?', '#', '%' or ':'."""
    return quote(value, safe="")


def _memory_path(namespace: str, key: str | None = None) -> str:
    base = f"/v1/memory/{_seg(namespace)}"
    return base if key is None else f"{base}/{_seg(key)}"


def _json(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    return body


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


# ---- memory ----------------------------------------------------------------------------------------------------


def get(namespace: str, key: str) -> Call[MemoryRecord]:
    def parse(r: httpx.Response) -> MemoryRecord:
        b = _json(r)
        return MemoryRecord(b["namespace"], b["key"], b["value"], b["version"], b["source"], _ts(b["updated_at"]))

    return Call("GET", _memory_path(namespace, key), parse)


def put(
    namespace: str, key: str, value: Any, *, source: str, if_match: int | None, if_none_match: bool
) -> Call[WriteResult]:
    if (if_match is None) == (not if_none_match):
        raise ValueError("give exactly one of if_match=<version you read> or if_none_match=True")
    headers = {"If-None-Match": "*"} if if_none_match else {"If-Match": f'"{if_match}"'}

    def parse(r: httpx.Response) -> WriteResult:
        b = _json(r)
        return WriteResult(b["namespace"], b["key"], b["version"], b["created"])

    return Call("PUT", _memory_path(namespace, key), parse, json={"value": value, "source": source}, headers=headers)


def forget(namespace: str, key: str, *, source: str) -> Call[ForgetResult]:
    def parse(r: httpx.Response) -> ForgetResult:
        b = _json(r)
        return ForgetResult(b["version"], b.get("forget_id"), b["already_forgotten"])

    return Call("DELETE", _memory_path(namespace, key), parse, params={"source": source})


def batch(namespace: str, writes: Sequence[Mapping[str, Any]], *, atomic: bool) -> Call[list[BatchItem]]:
    def parse(r: httpx.Response) -> list[BatchItem]:
        return [
            BatchItem(i["key"], i["status"], i.get("version"), i["current_version"], i.get("forgotten", False))
            for i in _json(r)["results"]
        ]

    body = {"atomic": atomic, "writes": [dict(w) for w in writes]}
    return Call("POST", f"{_memory_path(namespace)}:batch", parse, json=body)


def list_keys(namespace: str, *, limit: int, cursor: str | None) -> Call[KeyPage]:
    params: dict[str, str | int] = {"limit": limit}
    if cursor is not None:
        params["cursor"] = cursor

    def parse(r: httpx.Response) -> KeyPage:
        b = _json(r)
        return KeyPage(list(b["keys"]), b.get("next_cursor"))

    return Call("GET", _memory_path(namespace), parse, params=params)


def list_records(namespace: str, *, limit: int, cursor: str | None) -> Call[RecordPage]:
    """One request a page (`GET /v1/memory/{namespace}?values=true`, at most 100 records a page)."""
    params: dict[str, str | int] = {"limit": limit, "values": "true"}
    if cursor is not None:
        params["cursor"] = cursor

    def parse(r: httpx.Response) -> RecordPage:
        b = _json(r)
        return RecordPage(
            [MemoryRecord(e["namespace"], e["key"], e["value"], e["version"], e["source"], _ts(e["updated_at"]))
             for e in b["records"]],
            b.get("next_cursor"),
        )

    return Call("GET", _memory_path(namespace), parse, params=params)


def history(namespace: str, key: str) -> Call[list[HistoryEntry]]:
    def parse(r: httpx.Response) -> list[HistoryEntry]:
        return [
            HistoryEntry(e["version"], e["op"], e["source"], _ts(e["at"]), e.get("value"), e.get("erased", False))
            for e in _json(r)["versions"]
        ]

    return Call("GET", f"{_memory_path(namespace, key)}/history", parse)


# ---- sessions and forget jobs (typed to API.md) -------------------------------------------------------------------


def create_session(fields: Mapping[str, Any]) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/sessions", _json, json=dict(fields))


def get_session(session_id: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/v1/sessions/{_seg(session_id)}", _json)


def post_turn(session_id: str, inputs: Sequence[Mapping[str, Any]], *, generate: bool) -> Call[dict[str, Any]]:
    body = {"inputs": [dict(i) for i in inputs], "generate": generate, "stream": False}
    return Call("POST", f"/v1/sessions/{_seg(session_id)}/turns", _json, json=body)


def list_artifacts(session_id: str) -> Call[list[dict[str, Any]]]:
    def parse(r: httpx.Response) -> list[dict[str, Any]]:
        return list(_json(r)["artifacts"])

    return Call("GET", f"/v1/sessions/{_seg(session_id)}/artifacts", parse)


def create_forget(
    target: Mapping[str, Any], *, strategy: str, dry_run: bool, wait: bool, reason: str | None
) -> Call[dict[str, Any]]:
    body: dict[str, Any] = {"target": dict(target), "strategy": strategy, "dry_run": dry_run, "wait": wait}
    if reason is not None:
        body["reason"] = reason
    return Call("POST", "/v1/forget", _json, json=body)


def run_forget_plan(plan_id: str, *, strategy: str | None, wait: bool) -> Call[dict[str, Any]]:
    body: dict[str, Any] = {"plan_id": plan_id, "wait": wait}
    if strategy is not None:
        body["strategy"] = strategy
    return Call("POST", "/v1/forget", _json, json=body)


def get_forget(forget_id: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/v1/forget/{_seg(forget_id)}", _json)


# ---- data subjects and legal holds --------------------------------------------------------------------------------


def _subject_path(subject_id: str, rest: str = "") -> str:
    return f"/v1/subjects/{_seg(subject_id)}{rest}"


def put_subject(subject_id: str, memory_namespaces: Sequence[str]) -> Call[dict[str, Any]]:
    return Call("PUT", _subject_path(subject_id), _json, json={"memory_namespaces": list(memory_namespaces)})


def get_subject(subject_id: str) -> Call[dict[str, Any]]:
    return Call("GET", _subject_path(subject_id), _json)


def export_subject(subject_id: str) -> Call[dict[str, Any]]:
    """The parsed document; the clients' `export_subject_to` performs the same request streamed."""
    return Call("GET", _subject_path(subject_id, "/export"), _json)


def erase_subject(
    subject_id: str, *, dry_run: bool, also_text: Sequence[str] | None, reason: str | None,
    also_query: str | None = None, also_min_similarity: float | None = None,
) -> Call[dict[str, Any]]:
    if isinstance(also_text, str):  # a str is a Sequence[str]: it would go as one text per character
        raise TypeError("also_text is a list of texts, not one text")
    body: dict[str, Any] = {"dry_run": dry_run}
    also: dict[str, Any] = {}
    if also_text:
        also["text"] = list(also_text)
    if also_query is not None:
        also["query"] = also_query
    if also_min_similarity is not None:  # without also_query the server answers 422: it applies only to a query
        also["min_similarity"] = also_min_similarity
    if also:
        body["also"] = also
    if reason is not None:
        body["reason"] = reason
    return Call("POST", _subject_path(subject_id, "/erase"), _json, json=body)


def place_hold(
    *, subject_id: str | None, session_id: str | None, namespace: str | None, reason: str
) -> Call[dict[str, Any]]:
    scopes = {"subject_id": subject_id, "session_id": session_id, "namespace": namespace}
    given = {name: value for name, value in scopes.items() if value is not None}
    if len(given) != 1:
        raise ValueError("give exactly one of subject_id, session_id and namespace")
    return Call("POST", "/v1/holds", _json, json={**given, "reason": reason})


def get_hold(hold_id: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/v1/holds/{_seg(hold_id)}", _json)


def release_hold(hold_id: str) -> Call[dict[str, Any]]:
    return Call("DELETE", f"/v1/holds/{_seg(hold_id)}", _json)
