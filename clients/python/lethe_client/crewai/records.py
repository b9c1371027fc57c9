"""CrewAI's `MemoryRecord` as a Lethe memory value, and the record predicates its storage protocol filters by.

The value holds the whole record, its embedding included: the vector is derived from the content, so it must be
forgotten with it, and a Lethe forget erases the value (history included) wherever it is.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from crewai.memory.types import MemoryRecord


def to_value(record: MemoryRecord) -> dict[str, Any]:
    value = record.model_dump(mode="json")  # `embedding` is excluded from CrewAI's serialisation: added back here
    value["embedding"] = list(record.embedding) if record.embedding else None
    return value


def from_value(value: Any) -> MemoryRecord | None:
    """None for a value this storage did not write (another writer's key in the namespace)."""
    if not isinstance(value, dict) or "content" not in value:
        return None
    return MemoryRecord.model_validate(value)


def scope_path(scope: str | None) -> str:
    return "/" + (scope or "").strip("/")


def in_scope(record: MemoryRecord, prefix: str | None) -> bool:
    """Path-prefix semantics: `/a` holds `/a` and `/a/b`, not `/ab`."""
    if prefix is None or not prefix.strip("/"):
        return True
    wanted, scope = scope_path(prefix), scope_path(record.scope)
    return scope == wanted or scope.startswith(wanted + "/")


def naive_utc(moment: datetime) -> datetime:
    """CrewAI stamps records with naive UTC (`datetime.utcnow()`); an aware cutoff is compared in those terms."""
    return moment if moment.tzinfo is None else moment.astimezone(UTC).replace(tzinfo=None)


def selected(
    record: MemoryRecord,
    *,
    scope_prefix: str | None = None,
    categories: list[str] | None = None,
    record_ids: list[str] | None = None,
    older_than: datetime | None = None,
    metadata_filter: dict[str, Any] | None = None,
) -> bool:
    """The protocol's criteria, all of them at once (the ones given): any of `categories`, every metadata pair."""
    if not in_scope(record, scope_prefix):
        return False
    if record_ids is not None and record.id not in record_ids:
        return False
    if categories and not any(c in record.categories for c in categories):
        return False
    if metadata_filter and not all(record.metadata.get(k) == v for k, v in metadata_filter.items()):
        return False
    return older_than is None or naive_utc(record.created_at) < naive_utc(older_than)


def cosine(a: list[float], b: list[float]) -> float:
    """Similarity in [0, 1] (CrewAI's composite score expects that range): opposite directions score 0."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return max(0.0, dot / norms) if norms else 0.0
