"""`LetheStore`: LangGraph's long-term memory (`BaseStore`, sync and async) over Lethe memory.

    from lethe_client.langgraph import LetheStore
    store = LetheStore("http://127.0.0.1:8000", api_key, index={"fields": ["text"]})
    graph = builder.compile(store=store)

One item is one Lethe memory record: the namespace tuple is one Lethe namespace (labels joined by '.', each label
percent-encoded where Lethe forbids a character: `%`, `/`, `:` and control characters), the key one Lethe key, the
value the record's value, unchanged. Beyond LangGraph's own stores:

- `delete` is a forget: a tombstone version, the key's history erased, its cascade into sessions queued.
- Writes are conditional. A put reads the key's version (the answer to a create attempt, or a GetOp of the same key
  earlier in the same batch) and writes with If-Match on it. Another put that landed in between is overwritten on a
  retry (LangGraph's last-writer-wins), but a delete that landed in between wins: the put raises
  `DeletedWhileWriting` and the key stays forgotten. A put after a delete it saw re-establishes the key.
- A put of a key this store read or wrote before, in an earlier batch, first tries the version it saw then, which is
  usually still the key's: one round trip instead of two. It is a guess, never a read: when it is stale the put goes
  on exactly as one that guessed nothing (a later write overwritten, a tombstone it never saw read as the create
  attempt's answer would be).
- `search` ranks with Lethe's embedder on the server (`POST /v1/memory:search`), over live records only.
- TTL is the server's: an item's `ttl` (minutes) becomes the record's `ttl_s`; once it runs out the record is
  forgotten (a tombstone, by the server's sweep or the first read that meets it), never merely hidden. Reads refresh
  it as `refresh_ttl` / `ttl_config["refresh_on_read"]` say.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict
from urllib.parse import quote, unquote

import httpx
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from lethe_client._consistency import HEADER, TokenKeeper
from lethe_client.errors import NotFound, PreconditionFailed, error_for

_PUT_ATTEMPTS = 8
_GUESSES = 10_000  # versions remembered per store, least recently used first out
_PAGE = 1000
# Lethe namespaces forbid '/', ':' and control characters, keys '/' and control characters; '%' is encoded so that
# decoding is exact. LangGraph labels never hold '.', the separator.
_NAMESPACE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in "%/:")
_KEY_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in "%/")
_EMPTY_KEY = "%"  # never the encoding of another key: every other '%' is followed by two hex digits


class DeletedWhileWriting(PreconditionFailed):
    """412: the key was deleted (forgotten) after this put read it; nothing was written and the key stays forgotten.
    A put issued after the delete (one that reads the tombstone) re-establishes it."""


class StoreIndex(TypedDict, total=False):
    """What the server embeds for `search(query=...)`: paths into object values (`a.b`, `a[0]`, `a[*]`, `$`).
    Without `fields`, the whole value as JSON text. The embedder is Lethe's: there is no `embed` or `dims` to give."""

    fields: list[str]


def _label(label: str) -> str:
    return quote(label, safe=_NAMESPACE_SAFE)


def namespace_name(scope: Sequence[str], namespace: Sequence[str]) -> str:
    """The Lethe namespace of a LangGraph namespace tuple under `scope`."""
    return ".".join(_label(label) for label in (*scope, *namespace))


def namespace_tuple(scope: Sequence[str], name: str) -> tuple[str, ...] | None:
    """The LangGraph namespace a Lethe namespace holds, or None when it is not under `scope`."""
    labels = tuple(unquote(label) for label in name.split("."))
    if labels[: len(scope)] != tuple(scope) or len(labels) == len(scope):
        return None
    return labels[len(scope):]


def key_name(key: str) -> str:
    return quote(key, safe=_KEY_SAFE) if key else _EMPTY_KEY


def key_of(name: str) -> str:
    return "" if name == _EMPTY_KEY else unquote(name)


def _matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path):]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None


class _Guesses:
    """The version this store last saw of each key (read, written or deleted), bounded; shared by the threads and
    tasks that use the store."""

    def __init__(self, size: int = _GUESSES) -> None:
        self._size = size
        self._versions: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: tuple[str, str]) -> int | None:
        with self._lock:
            return self._versions.get(name)

    def saw(self, name: tuple[str, str], version: int) -> None:
        with self._lock:
            if version <= 0:  # never written: nothing to guess (a create says If-None-Match)
                self._versions.pop(name, None)
                return
            self._versions[name] = version
            self._versions.move_to_end(name)
            while len(self._versions) > self._size:
                self._versions.popitem(last=False)


# A plan performs one op: it yields requests and gets their responses back (any status), so the sync and the async
# store share every rule and differ only in how a request is sent.
Plan = Generator[_Request, httpx.Response, Result]


def _raise(response: httpx.Response) -> None:
    if not response.is_success:
        raise error_for(response)


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


class LetheStore(BaseStore):
    """LangGraph's `BaseStore` over Lethe memory, per tenant (the API key's). `scope`: labels every namespace of
    this store lives under in Lethe (several apps, or test runs, sharing one tenant), invisible to LangGraph."""

    supports_ttl = True

    def __init__(
        self, base_url: str, api_key: str, *, scope: Sequence[str] = (), index: StoreIndex | None = None,
        ttl: TTLConfig | None = None, source: str = "agent", timeout: float = 60.0,
        http: httpx.Client | None = None, ahttp: httpx.AsyncClient | None = None,
    ) -> None:
        for label in scope:
            if not label or "." in label:
                raise InvalidNamespaceError(f"scope labels must be non-empty and hold no '.': {tuple(scope)}")
        self.scope = tuple(scope)
        self.index_config = index
        self.ttl_config = ttl
        self.source = source
        self._base_url, self._timeout = base_url, timeout
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self._http, self._ahttp = http, ahttp
        self._tokens = TokenKeeper()
        self._guesses = _Guesses()

    # ---- transport ---------------------------------------------------------------------------------------------

    def _headers(self, request: _Request) -> dict[str, str]:
        headers = {**self._auth, **(request.headers or {})}
        if request.method == "GET":
            headers.update(self._tokens.read_headers())
        return headers

    def _send(self, request: _Request) -> httpx.Response:
        if self._http is None:
            self._http = httpx.Client(base_url=self._base_url, timeout=self._timeout)
        response = self._http.request(request.method, request.path, params=request.params, json=request.json,
                                      headers=self._headers(request))
        self._tokens.observe(response.headers.get(HEADER))
        return response

    async def _asend(self, request: _Request) -> httpx.Response:
        if self._ahttp is None:
            self._ahttp = httpx.AsyncClient(base_url=self._base_url, timeout=self._timeout)
        response = await self._ahttp.request(request.method, request.path, params=request.params, json=request.json,
                                             headers=self._headers(request))
        self._tokens.observe(response.headers.get(HEADER))
        return response

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    async def aclose(self) -> None:
        if self._ahttp is not None:
            await self._ahttp.aclose()

    # ---- BaseStore ---------------------------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        read: dict[tuple[str, str], int] = {}
        for op in ops:
            plan = self._plan(op, read)
            try:
                request = next(plan)
                while True:
                    request = plan.send(self._send(request))
            except StopIteration as done:
                results.append(done.value)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        read: dict[tuple[str, str], int] = {}
        for op in ops:
            plan = self._plan(op, read)
            try:
                request = next(plan)
                while True:
                    request = plan.send(await self._asend(request))
            except StopIteration as done:
                results.append(done.value)
        return results

    # ---- the plans ---------------------------------------------------------------------------------------------

    def _plan(self, op: Op, read: dict[tuple[str, str], int]) -> Plan:
        """`read`: versions this batch has read, by (namespace, key): a put after a get of the same key is based on
        what the get saw."""
        validate_op_namespace(op)
        if isinstance(op, GetOp):
            return self._get(op, read)
        if isinstance(op, PutOp):
            return self._delete(op, read) if op.value is None else self._put(op, read)
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        raise TypeError(f"unknown store op {op!r}")

    def _path(self, namespace: Sequence[str], key: str | None = None) -> tuple[str, str]:
        if not namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        name = namespace_name(self.scope, namespace)
        path = f"/v1/memory/{quote(name, safe='')}"
        return name, path if key is None else f"{path}/{quote(key_name(key), safe='')}"

    def _get(self, op: GetOp, read: dict[tuple[str, str], int]) -> Plan:
        name, path = self._path(op.namespace, op.key)
        response = yield _Request("GET", path, params={"refresh_ttl": "true" if op.refresh_ttl else "false"})
        if response.status_code == 404:
            error = error_for(response)
            if not isinstance(error, NotFound) or "forgotten" not in error.problem:
                raise error  # not a memory key's answer (never written, or forgotten): not "absent"
            read[(name, op.key)] = error.version  # 0, or the tombstone's: what a later put is based on
            self._guesses.saw((name, op.key), error.version)
            return None
        _raise(response)
        body = response.json()
        read[(name, op.key)] = body["version"]
        self._guesses.saw((name, op.key), body["version"])
        return Item(value=body["value"], key=op.key, namespace=tuple(op.namespace),
                    created_at=_ts(body["created_at"]), updated_at=_ts(body["updated_at"]))

    def _put(self, op: PutOp, read: dict[tuple[str, str], int]) -> Plan:
        name, path = self._path(op.namespace, op.key)
        body = {"value": dict(op.value or {}), "source": self.source,
                "ttl_s": None if op.ttl is None else float(op.ttl) * 60}
        base = read.get((name, op.key))
        # Without a version read in this batch, the first attempt creates, or tries the version this store saw last
        # (module docstring): either way its 412 answer is the read.
        guessed = base is None and (base := self._guesses.get((name, op.key))) is not None
        error: PreconditionFailed | None = None
        for _ in range(_PUT_ATTEMPTS):
            headers = {"If-None-Match": "*"} if base is None else {"If-Match": f'"{base}"'}
            response = yield _Request("PUT", path, json=body, headers=headers)
            if response.is_success:
                read[(name, op.key)] = version = response.json()["version"]
                self._guesses.saw((name, op.key), version)
                return None
            failed = error_for(response)
            if not isinstance(failed, PreconditionFailed):
                raise failed
            error = failed
            if base is not None and not guessed and error.forgotten and error.current_version > base:
                # A delete landed after this put read the key: the delete wins, the key stays forgotten.
                raise DeletedWhileWriting(error.status, error.problem, error.headers)
            guessed = False
            # Another write landed (or this was the read): last writer wins. 0: never written after all, create.
            base = error.current_version or None
        assert error is not None
        raise error  # the key kept changing under every attempt

    def _delete(self, op: PutOp, read: dict[tuple[str, str], int]) -> Plan:
        name, path = self._path(op.namespace, op.key)
        response = yield _Request("DELETE", path, params={"source": self.source})
        _raise(response)
        read[(name, op.key)] = version = response.json()["version"]
        self._guesses.saw((name, op.key), version)
        return None

    def _search(self, op: SearchOp) -> Plan:
        prefix = namespace_name(self.scope, op.namespace_prefix)
        fields = (self.index_config or {}).get("fields")
        body = {
            "namespace_prefix": prefix, "query": op.query or None, "filter": op.filter or None,
            "fields": None if not fields or fields == ["$"] else list(fields),
            "limit": op.limit, "offset": op.offset, "refresh_ttl": bool(op.refresh_ttl),
        }
        response = yield _Request("POST", "/v1/memory:search", json=body)
        _raise(response)
        items = []
        for found in response.json()["items"]:
            namespace = namespace_tuple(self.scope, found["namespace"])
            if namespace is None:
                continue
            items.append(SearchItem(
                namespace=namespace, key=key_of(found["key"]), value=found["value"],
                created_at=_ts(found["created_at"]), updated_at=_ts(found["updated_at"]), score=found["score"],
            ))
        return items

    def _list_namespaces(self, op: ListNamespacesOp) -> Plan:
        found: set[tuple[str, ...]] = set()
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": _PAGE, **({"cursor": cursor} if cursor else {})}
            response = yield _Request("GET", "/v1/memory", params=params)
            _raise(response)
            page = response.json()
            for row in page["namespaces"]:
                namespace = namespace_tuple(self.scope, row["namespace"])
                if namespace is None or row["live_keys"] == 0:
                    continue
                if all(_matches(c, namespace) for c in op.match_conditions or ()):
                    found.add(namespace if op.max_depth is None else namespace[: op.max_depth])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return sorted(found)[op.offset: op.offset + op.limit]

