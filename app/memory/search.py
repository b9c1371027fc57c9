"""Search over a tenant's memory: `POST /v1/memory:search` (docs/API.md "Memory").

Ranking happens here, in the process, per request, over the tenant's live records under the namespace prefix: the
values are decrypted in the process once erasure at rest encrypts them (issue 42), so no index over their text or
their vectors is kept in the database. What a search opens and embeds is kept by the `Sealer` under the record's leaf
(`Sealer.keep`): the value by the exact ciphertext it was opened from, its vectors by (version, fields), so a hit is
what opening and embedding again would give. They go with the leaf's key: a forget's shred drops them in every
process (at once, or within the key caches' time to live), so nothing derived from a forgotten value stays here.
Query vectors are kept by their text for that time to live too: a query may quote what is forgotten later.

Filters follow LangGraph's store semantics (its InMemoryStore's `_compare_values`): a plain value matches by equality
(objects member by member, arrays element by element), `{"$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte": v}`
compares. Paths in `fields` follow LangGraph's too: `a.b`, `list[0]`, `list[-1]`, `list[*]`, and `$` (the whole value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from app.db.database import Database
from app.embeddings import Embedder
from app.errors import InvalidRequest
from app.keys.cache import KeyCache
from app.keys.content import Sealer
from app.memory.cascade import Expiry
from app.memory.repositories import search as repo
from app.memory.repositories.search import Found
from app.memory.validation import check_namespace

OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
QUERY_CACHE_SIZE = 1_000
_TOKEN = re.compile(r"\[(\*|-?\d+)\]|([^.\[\]]+)")


@dataclass(frozen=True)
class SearchQuery:
    prefix: str
    query: str | None
    fields: Sequence[str] | None
    filter: dict[str, Any] | None
    limit: int
    offset: int
    refresh_ttl: bool = False


@dataclass(frozen=True)
class Hit:
    namespace: str
    key: str
    value: Any
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    score: float | None


def _compare(item: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_apply(item, op, operand) for op, operand in wanted.items())
        return isinstance(item, dict) and all(_compare(item.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(item, list) and len(item) == len(wanted) and all(map(_compare, item, wanted))
        )
    return bool(item == wanted)


def _apply(item: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(item == operand)
    if op == "$ne":
        return bool(item != operand)
    # Order comparisons hold between numbers, or between strings; anything else (a missing member included) fails.
    if isinstance(item, bool) or isinstance(operand, bool):
        return False
    comparable = (isinstance(item, int | float) and isinstance(operand, int | float)) or (
        isinstance(item, str) and isinstance(operand, str)
    )
    if not comparable:
        return False
    if op == "$gt":
        return bool(item > operand)
    if op == "$gte":
        return bool(item >= operand)
    if op == "$lt":
        return bool(item < operand)
    return bool(item <= operand)


def matches(value: Any, filter: dict[str, Any] | None) -> bool:
    """Whether an object value passes the filter (a value that is not an object passes only an empty filter)."""
    if not filter:
        return True
    return isinstance(value, dict) and all(_compare(value.get(k), v) for k, v in filter.items())


def check_filter(filter: dict[str, Any] | None) -> None:
    for field, wanted in (filter or {}).items():
        if isinstance(wanted, dict) and any(k.startswith("$") for k in wanted):
            unknown = sorted(set(wanted) - OPERATORS)
            if unknown:
                raise InvalidRequest(f"filter on {field!r}: unknown operator {unknown[0]!r} (use {sorted(OPERATORS)})")


def _tokens(path: str) -> list[str]:
    tokens: list[str] = []
    at = 0
    for found in _TOKEN.finditer(path):
        if path[at:found.start()] not in ("", "."):
            raise InvalidRequest(f"field path {path!r} is not of the form a.b, a[0], a[-1], a[*]")
        tokens.append(f"[{found.group(1)}]" if found.group(1) is not None else found.group(2))
        at = found.end()
    if not tokens or path[at:] != "":
        raise InvalidRequest(f"field path {path!r} is not of the form a.b, a[0], a[-1], a[*]")
    return tokens


def check_fields(fields: Sequence[str] | None) -> None:
    for path in fields or ():
        if path != "$":
            _tokens(path)


def _as_text(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str | int | float | bool):
        return [str(value)]
    return [json.dumps(value, sort_keys=True, ensure_ascii=False)]


def texts_at(value: Any, path: str) -> list[str]:
    """The texts a field path selects in a value (several for `[*]`; none when the path is absent)."""
    if path == "$":
        return [json.dumps(value, sort_keys=True, ensure_ascii=False)]
    items = [value]
    for token in _tokens(path):
        step: list[Any] = []
        for item in items:
            if token.startswith("["):
                if not isinstance(item, list):
                    continue
                if token == "[*]":
                    step.extend(item)
                elif -len(item) <= (index := int(token[1:-1])) < len(item):
                    step.append(item[index])
            elif isinstance(item, dict) and token in item:
                step.append(item[token])
        items = step
    return [text for item in items for text in _as_text(item)]


def _unit(vectors: list[list[float]]) -> Any:
    """Rows scaled to unit length (the embedder's already are; kept exact for any other), as one matrix."""
    matrix = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)


class MemorySearch:
    def __init__(self, db: Database, sealer: Sealer, embedder: Embedder, expiry: Expiry) -> None:
        self.db = db
        self.sealer = sealer
        self.embedder = embedder
        self.expiry = expiry
        # Agents ask the same question of their memory again and again (module docstring: why it is time-bounded).
        self.queries: KeyCache[list[float]] = KeyCache(
            capacity=QUERY_CACHE_SIZE, ttl_s=sealer.opened.ttl_s, clock=sealer.opened.clock)

    async def search(self, tenant_id: str, q: SearchQuery) -> list[Hit]:
        if q.prefix:
            check_namespace(q.prefix)
        check_filter(q.filter)
        check_fields(q.fields)
        async with self.db.pg() as sql:
            found = await repo.under_prefix(sql, self.sealer, tenant_id, q.prefix)
        expired = [(f.namespace, f.key) for f in found if f.expired]
        if expired:  # an expired record is never served, and it is forgotten now rather than merely hidden
            await self.expiry.expire_all(tenant_id, expired)
        candidates = [f for f in found if not f.expired and matches(f.value, q.filter)]
        if q.query:
            ranked = await self._rank(tenant_id, q, candidates)
        else:
            ranked = [(None, f) for f in candidates]
        page = ranked[q.offset:q.offset + q.limit]
        expiries = {(f.namespace, f.key): f.expires_at for _, f in page}
        if q.refresh_ttl and any(e is not None for e in expiries.values()):
            async with self.db.pg() as sql:
                expiries.update(await repo.refresh(sql, tenant_id, [k for k, e in expiries.items() if e is not None]))
        return [
            Hit(f.namespace, f.key, f.value, f.version, f.created_at, f.updated_at, expiries[(f.namespace, f.key)],
                score)
            for score, f in page
        ]

    async def _rank(self, tenant_id: str, q: SearchQuery, candidates: list[Found]) -> list[tuple[float | None, Found]]:
        """By the best cosine of the query against any text the fields select; records with no such text follow,
        unscored (LangGraph's InMemoryStore does the same)."""
        assert q.query
        paths = list(q.fields) if q.fields else ["$"]
        vectors: dict[int, list[Any]] = {}
        missing: list[tuple[int, tuple[str, ...], list[str]]] = []
        for i, f in enumerate(candidates):
            tag = ("vectors", f.namespace, f.key, str(f.version), *paths)  # a version's value never changes
            cached = None if f.leaf is None else self.sealer.recall(tenant_id, f.leaf, tag)
            if cached is not None:
                vectors[i] = cached
                continue
            texts = [t for path in paths for t in texts_at(f.value, path)]
            missing.append((i, tag, texts))
        flat = [t for _, _, texts in missing for t in texts]
        cached_query = self.queries.get(q.query)
        wanted = flat if cached_query else [q.query, *flat]
        computed = await self.embedder.embed(wanted) if wanted else []
        query_vector = cached_query if cached_query else computed[0]
        if not cached_query:  # kept from when it was embedded, however often it is asked again (docstring)
            self.queries.put(q.query, query_vector)
        rest = iter(computed if cached_query else computed[1:])
        for i, tag, texts in missing:
            # float32 arrays: 1.5 KB a vector kept, where a list of 384 Python floats takes 8 times that
            vectors[i] = [np.asarray(next(rest), dtype=np.float32) for _ in texts]
            leaf = candidates[i].leaf
            if leaf is not None:  # a legacy plaintext row has no leaf to keep it by (sealed online, soon)
                self.sealer.keep(tenant_id, leaf, tag, vectors[i])
        with_text = [i for i in range(len(candidates)) if vectors[i]]
        owners = [i for i in with_text for _ in vectors[i]]
        if owners:
            similarities = _unit([v for i in with_text for v in vectors[i]]) @ _unit([query_vector])[0]
        best: dict[int, float] = {}
        for owner, similarity in zip(owners, similarities.tolist() if owners else [], strict=True):
            best[owner] = max(best.get(owner, -2.0), float(similarity))
        scored = [(best[i], candidates[i]) for i in with_text]
        scored.sort(key=lambda pair: pair[0], reverse=True)  # stable: ties keep the newest write first
        unscored: list[tuple[float | None, Found]] = [(None, f) for i, f in enumerate(candidates) if not vectors[i]]
        return [*scored, *unscored]
