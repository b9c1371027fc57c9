"""`LetheStorage`: CrewAI's unified-memory `StorageBackend` over Lethe memory, where delete is a forget.

One Lethe namespace holds one storage's records, one key per record id, the whole record as the value (records.py).
CrewAI hands the backend its own embedding vectors and searches by vector (the protocol's `search` gets no query
text), so the vector is kept in the record and ranked here by cosine similarity over the namespace's live records:
the scores stay the ones CrewAI's consolidation and recall thresholds were made for (docs/crewai.md says why).

- `save` creates (an atomic batch of create-only writes: a record id that exists fails the whole batch, 412);
- `update` writes on condition that the record still has the version this storage last read of it, so an update
  based on a stale read is refused (PreconditionFailed), and a forgotten record is never brought back (Forgotten);
- `delete` and `reset` forget: a tombstone per record, the value erased from the key and its history, the forget
  cascading into every Lethe session the record was injected into. They return once the tombstones are committed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from crewai.memory.storage.backend import EmbeddingDimensionMismatchError
from crewai.memory.types import MemoryRecord, ScopeInfo

from lethe_client.crewai import records as rec
from lethe_client.crewai.scan import live_records
from lethe_client.errors import NotFound
from lethe_client.sync import LetheClient

BATCH = 500  # Lethe's most writes in one batch


class LetheStorage:
    """`Memory(storage=LetheStorage(LetheClient(url, key), "crew-research"), embedder=..., llm=...)`."""

    def __init__(self, lethe: LetheClient, namespace: str = "crewai-memory", *, source: str = "agent") -> None:
        self.lethe = lethe
        self.namespace = namespace
        self.source = source
        self._versions: dict[str, int] = {}  # record id -> the version this storage last read or wrote
        self._lock = threading.Lock()  # CrewAI saves in a background thread and searches from a pool

    # ---- reading ---------------------------------------------------------------------------------------------

    def _records(self) -> Iterator[MemoryRecord]:
        for key, value, version in live_records(self.lethe, self.namespace):
            record = rec.from_value(value)
            if record is not None and record.id == key:
                self._seen(key, version)
                yield record

    def _seen(self, record_id: str, version: int) -> None:
        with self._lock:
            self._versions[record_id] = version

    def get_record(self, record_id: str) -> MemoryRecord | None:
        try:
            found = self.lethe.get(self.namespace, record_id)
        except NotFound:  # never written, or forgotten
            return None
        record = rec.from_value(found.value)
        if record is not None:
            self._seen(record_id, found.version)
        return record

    def search(
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        scored: list[tuple[MemoryRecord, float]] = []
        for record in self._records():
            if not rec.selected(record, scope_prefix=scope_prefix, categories=categories,
                                metadata_filter=metadata_filter):
                continue
            vector = record.embedding or []
            if vector and len(vector) != len(query_embedding):
                raise EmbeddingDimensionMismatchError(len(vector), len(query_embedding))
            score = rec.cosine(query_embedding, vector) if vector else 0.0
            if score >= min_score:
                scored.append((record, score))
        scored.sort(key=lambda pair: pair[1], reverse=True)
        return scored[:limit]

    def list_records(self, scope_prefix: str | None = None, limit: int = 200, offset: int = 0) -> list[MemoryRecord]:
        if limit <= 0 or offset < 0:
            return []
        found = [r for r in self._records() if rec.in_scope(r, scope_prefix)]
        found.sort(key=lambda r: rec.naive_utc(r.created_at), reverse=True)
        return found[offset : offset + limit]

    def get_scope_info(self, scope: str) -> ScopeInfo:
        path = rec.scope_path(scope)
        inside = [r for r in self._records() if rec.in_scope(r, path)]
        created = [rec.naive_utc(r.created_at) for r in inside]
        return ScopeInfo(
            path=path,
            record_count=len(inside),
            categories=sorted({c for r in inside for c in r.categories}),
            oldest_record=min(created, default=None),
            newest_record=max(created, default=None),
            child_scopes=_children(path, inside),
        )

    def list_scopes(self, parent: str = "/") -> list[str]:
        path = rec.scope_path(parent)
        return _children(path, [r for r in self._records() if rec.in_scope(r, path)])

    def list_categories(self, scope_prefix: str | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self._records():
            if rec.in_scope(record, scope_prefix):
                for category in record.categories:
                    counts[category] = counts.get(category, 0) + 1
        return counts

    def count(self, scope_prefix: str | None = None) -> int:
        return sum(1 for r in self._records() if rec.in_scope(r, scope_prefix))

    # ---- writing ---------------------------------------------------------------------------------------------

    def save(self, records: list[MemoryRecord]) -> None:
        if not records:
            return
        dims = {len(r.embedding) for r in records if r.embedding}
        if len(dims) > 1:
            first, *others = sorted(dims)
            raise EmbeddingDimensionMismatchError(first, others[0])
        for start in range(0, len(records), BATCH):
            chunk = records[start : start + BATCH]
            writes = [
                {"key": r.id, "value": rec.to_value(r), "base_version": 0, "source": self.source} for r in chunk
            ]
            for item in self.lethe.batch(self.namespace, writes, atomic=True):
                if item.version is not None:
                    self._seen(item.key, item.version)

    def update(self, record: MemoryRecord) -> None:
        """Replace the record, on condition that it is still the version this storage read (or, never read here,
        the version it has now). A stale base raises PreconditionFailed; a forgotten record raises Forgotten and
        stays forgotten."""
        with self._lock:
            base = self._versions.get(record.id)
        if base is None:
            try:
                base = self.lethe.get(self.namespace, record.id).version
            except NotFound as absent:
                if absent.version:  # a tombstone: never resurrect
                    raise
                base = 0
        value = rec.to_value(record)
        if base == 0:
            written = self.lethe.put(self.namespace, record.id, value, if_none_match=True, source=self.source)
        else:
            written = self.lethe.put(self.namespace, record.id, value, if_match=base, source=self.source)
        self._seen(record.id, written.version)

    def delete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        """Forget every live record matching all the criteria given; the number forgotten."""
        if record_ids is not None and not (scope_prefix or categories or older_than or metadata_filter):
            doomed = [r.id for r in map(self.get_record, dict.fromkeys(record_ids)) if r is not None]
        else:
            doomed = [
                r.id
                for r in self._records()
                if rec.selected(r, scope_prefix=scope_prefix, categories=categories, record_ids=record_ids,
                                older_than=older_than, metadata_filter=metadata_filter)
            ]
        return sum(self._forget(record_id) for record_id in doomed)

    def _forget(self, record_id: str) -> int:
        done = self.lethe.forget(self.namespace, record_id, source=self.source)
        with self._lock:  # the tombstone's version must never be a base: that would re-establish the record
            self._versions.pop(record_id, None)
        return 0 if done.already_forgotten else 1

    def reset(self, scope_prefix: str | None = None) -> None:
        self.delete(scope_prefix=scope_prefix)

    # ---- the protocol's async half: the same calls, off the event loop -----------------------------------------

    async def asave(self, records: list[MemoryRecord]) -> None:
        await asyncio.to_thread(self.save, records)

    async def asearch(
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        return await asyncio.to_thread(
            self.search, query_embedding, scope_prefix, categories, metadata_filter, limit, min_score
        )

    async def adelete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        return await asyncio.to_thread(self.delete, scope_prefix, categories, record_ids, older_than, metadata_filter)


def _children(path: str, inside: list[MemoryRecord]) -> list[str]:
    """The immediate child scopes of `path` that hold records."""
    base = path.rstrip("/")
    children: set[str] = set()
    for record in inside:
        rest = rec.scope_path(record.scope)[len(base) :].strip("/")
        if rest:
            children.add(f"{base}/{rest.split('/', 1)[0]}")
    return sorted(children)
