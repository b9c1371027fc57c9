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


class MemoryWrite(RequestModel):
    value: Any = Field(description="Any JSON value.")
    source: SourceStr = "user"


class MemoryRecordOut(BaseModel):
    namespace: str
    key: str
    value: Any
    version: int
    source: str
    updated_at: datetime


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
