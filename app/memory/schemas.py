"""Versioned memory records with durable tombstones."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from app.request_model import RequestModel

# ':' is reserved in namespaces: `POST /v1/memory/{namespace}:batch` must not be ambiguous. Keys may hold ':'.
NAMESPACE_PATTERN = r"^[^/:\x00-\x1f\x7f]+$"
KEY_PATTERN = r"^[^/\x00-\x1f\x7f]+$"
SOURCE_PATTERN = r"^[^\x00-\x1f\x7f]+$"

Key = Annotated[str, Field(min_length=1, max_length=200, pattern=KEY_PATTERN)]
SourceStr = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        pattern=SOURCE_PATTERN,
        description="Who wrote it: user, user_correction, agent, summarizer, ... (free text).",
    ),
]


TtlS = Annotated[
    float | None,
    Field(
        ge=0, le=10 * 365 * 24 * 3600,
        description="Seconds this version lives: once it runs out the key is forgotten (a tombstone, by the sweep or "
        "the first read that meets it). A read with `refresh_ttl` restarts it. Null: never expires.",
    ),
]


class MemoryWrite(RequestModel):
    value: Any = Field(description="Any JSON value.")
    source: SourceStr = "user"
    ttl_s: TtlS = None


class MemoryRecordOut(BaseModel):
    namespace: str
    key: str
    value: Any
    version: int
    source: str
    updated_at: datetime
    created_at: datetime = Field(description="When the key's current life began: its first write after a tombstone")
    expires_at: datetime | None = Field(default=None, description="When its time to live runs out; null: never")


class MemoryWriteOut(BaseModel):
    namespace: str
    key: str
    version: int
    created: bool
    updated_at: datetime


class MemoryForgetOut(BaseModel):
    version: int = Field(description="The tombstone version.")
    forget_id: str | None = Field(description="The forget job cascading into sessions; null while there is none.")
    already_forgotten: bool


class BatchWrite(RequestModel):
    key: Key
    value: Any
    base_version: int = Field(
        ge=0, le=2**53, description="The version the writer read; 0 creates a never-written key (at most 2^53, the "
        "largest integer every JSON parser reads exactly)."
    )
    source: SourceStr = "user"
    ttl_s: TtlS = None


class BatchRequest(RequestModel):
    atomic: bool = True
    writes: list[BatchWrite] = Field(min_length=1, max_length=500)


class BatchResult(BaseModel):
    key: str
    status: Literal[200, 201, 412]
    version: int | None = Field(default=None, description="The new version; null when the write was rejected.")
    current_version: int = Field(description="The key's version after this write (or the one that rejected it).")
    forgotten: bool = False


class BatchOut(BaseModel):
    results: list[BatchResult]


class KeyList(BaseModel):
    keys: list[str]
    next_cursor: str | None
    forgotten: list[str] = Field(
        default_factory=list,
        description="With `include_forgotten=true`: the keys of this page that are tombstones (names only)",
    )
    records: list[MemoryRecordOut] = Field(
        default_factory=list,
        description="With `values=true`: the live records of this page with their values, in key order (one per "
        "key of `keys`)",
    )


class NamespaceOut(BaseModel):
    namespace: str
    live_keys: int = Field(description="Keys whose newest version is a value")
    forgotten_keys: int = Field(description="Keys whose newest version is a tombstone")
    updated_at: datetime = Field(description="The newest write or tombstone in the namespace")


class NamespaceList(BaseModel):
    namespaces: list[NamespaceOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page")


class HistoryEntry(BaseModel):
    version: int
    op: Literal["write", "forget"]
    source: str
    at: datetime
    value: Any | None = None
    erased: bool = Field(default=False, description="A write whose value a later forget erased.")


class HistoryOut(BaseModel):
    versions: list[HistoryEntry]


class SearchRequest(RequestModel):
    namespace_prefix: str = Field(
        default="", max_length=200, pattern=r"^[^/:\x00-\x1f\x7f]*$",
        description="Namespaces equal to it or starting with it + '.'; empty: every namespace of the tenant",
    )
    query: str | None = Field(
        default=None, max_length=10_000,
        description="Rank by cosine similarity to this text (Lethe's embedder); null or empty: newest write first",
    )
    fields: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, max_length=32,
        description="Paths in object values whose text is embedded (`a.b`, `a[0]`, `a[*]`, `$`); null: the whole "
        "value as JSON text",
    )
    filter: dict[str, Any] | None = Field(
        default=None,
        description="On object values: {field: value | {\"$eq\"|\"$ne\"|\"$gt\"|\"$gte\"|\"$lt\"|\"$lte\": value}} "
        "(LangGraph's store semantics)",
    )
    limit: int = Field(default=10, ge=1, le=100)
    offset: int = Field(default=0, ge=0, le=100_000)
    refresh_ttl: bool = Field(default=False, description="Restart the time to live of the records returned")


class SearchItemOut(BaseModel):
    namespace: str
    key: str
    value: Any
    version: int
    updated_at: datetime
    score: float | None = Field(description="Cosine similarity to `query`; null without a query, or for a record "
                                "with no text at `fields`")
    created_at: datetime
    expires_at: datetime | None = None


class SearchOut(BaseModel):
    items: list[SearchItemOut] = Field(description="Live records only: never a forgotten or expired value")
