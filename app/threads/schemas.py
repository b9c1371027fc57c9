"""The API shapes of the thread routes (docs/API.md "Threads (LangGraph checkpoints)").

Serialized values travel as `{"type", "data"}`: the saver's serde type and its bytes in base64. The server stores
them and hands them back; it never decodes them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from app.request_model import RequestModel

# Thread ids are the client's own names (LangGraph's `thread_id`); no '/', no space, no control character.
THREAD_ID_PATTERN = r"^[A-Za-z0-9._:@+=~-]+$"
CHECKPOINT_ID_PATTERN = r"^[A-Za-z0-9._:-]+$"
# A checkpoint namespace ("", "node:<task id>", "outer:<id>|inner:<id>"), a channel or a task: any printable text.
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*$"

ThreadId = Annotated[str, Field(min_length=1, max_length=200, pattern=THREAD_ID_PATTERN)]
CheckpointId = Annotated[str, Field(min_length=1, max_length=200, pattern=CHECKPOINT_ID_PATTERN)]
Namespace = Annotated[str, Field(max_length=500, pattern=TEXT_PATTERN)]
Channel = Annotated[str, Field(min_length=1, max_length=500, pattern=TEXT_PATTERN)]
TaskId = Annotated[str, Field(min_length=1, max_length=200, pattern=TEXT_PATTERN)]
Version = Annotated[str, Field(min_length=1, max_length=200, pattern=TEXT_PATTERN)]
SerdeType = Annotated[str, Field(min_length=1, max_length=50, pattern=r"^[A-Za-z0-9_.+-]+$")]
# Exactly what base64.b64decode(validate=True) takes, so the schema says which strings are accepted.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
Base64 = Annotated[str, Field(
    pattern=BASE64_PATTERN, description="The serialized bytes, base64 (RFC 4648, with padding)",
)]
Generation = Annotated[int | None, Field(
    default=None, ge=0, le=2**53,
    description="The thread's `generation` where the writer read its base; a rewrite since (forget_message) refuses "
    "the write with 412",
)]


def _keys_by_pattern(schema: dict[str, Any]) -> None:
    """pydantic writes a key pattern as `patternProperties`, which leaves keys that do not match it unconstrained;
    the pattern is a rule on every key (`propertyNames`), and every value has the one schema."""
    ((pattern, values),) = schema.pop("patternProperties").items()
    schema["propertyNames"]["pattern"] = pattern
    schema["additionalProperties"] = values


class Typed(RequestModel):
    type: SerdeType
    data: Base64


class BlobIn(RequestModel):
    channel: Channel
    version: Version
    type: SerdeType
    data: Base64


class PutCheckpoint(RequestModel):
    checkpoint_ns: Namespace = ""
    parent_id: CheckpointId | None = Field(default=None, description="The checkpoint this one follows (LangGraph's "
                                           "config checkpoint_id); 412 when that one was deleted")
    generation: Generation
    checkpoint: Typed = Field(description="The checkpoint without its channel values, serialized")
    metadata: dict[str, Any] = Field(default_factory=dict, description="JSON; filters lists, `run_id` names a run")
    channel_versions: dict[Channel, Version] = Field(
        default_factory=dict, description="Each channel's version in this checkpoint (which blobs make its values)",
        json_schema_extra=_keys_by_pattern,
    )
    blobs: list[BlobIn] = Field(default_factory=list, max_length=10_000,
                                description="The channel values new in this checkpoint")


class PutOut(BaseModel):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    generation: int


class WriteIn(RequestModel):
    idx: int = Field(ge=-1000, le=1_000_000, description="Its index in the task's writes; special channels "
                     "(ERROR, INTERRUPT...) negative: those replace an earlier write, the others never do")
    channel: Channel
    type: SerdeType
    data: Base64


class PutWrites(RequestModel):
    checkpoint_ns: Namespace = ""
    task_id: TaskId
    task_path: Annotated[str, Field(max_length=1000, pattern=TEXT_PATTERN)] = ""
    generation: Generation
    writes: list[WriteIn] = Field(max_length=10_000)


class PutWritesOut(BaseModel):
    stored: int


class BlobOut(BaseModel):
    channel: str
    version: str
    type: str
    data: str


class WriteOut(BaseModel):
    task_id: str
    idx: int
    channel: str
    type: str
    data: str
    task_path: str


class TypedOut(BaseModel):
    type: str
    data: str


class CheckpointOut(BaseModel):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: TypedOut
    metadata: dict[str, Any]
    blobs: list[BlobOut] = Field(description="The values of the checkpoint's channel versions")
    writes: list[WriteOut] = Field(description="Its pending writes, in (task_path, task_id, idx) order")
    generation: int = Field(description="The thread's generation when read: name it when writing on top of this")


class CheckpointPage(BaseModel):
    checkpoints: list[CheckpointOut] = Field(description="Newest first")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page")


class DeleteOut(BaseModel):
    thread_id: str
    deleted_checkpoints: int


class RunsIn(RequestModel):
    run_ids: list[Annotated[str, Field(min_length=1, max_length=200, pattern=TEXT_PATTERN)]] = Field(max_length=1000)


class DeletedOut(BaseModel):
    deleted_checkpoints: int


class CopyIn(RequestModel):
    target_thread_id: ThreadId


class CopyOut(BaseModel):
    thread_id: str
    target_thread_id: str
    copied_checkpoints: int


class PruneIn(RequestModel):
    thread_ids: list[ThreadId] = Field(max_length=1000)
    strategy: Literal["keep_latest", "delete"] = "keep_latest"


class StoredBlob(BaseModel):
    checkpoint_ns: str
    channel: str
    version: str
    type: str
    data: str


class StoredWrite(BaseModel):
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    type: str
    data: str
    task_path: str


class ThreadValues(BaseModel):
    """Every serialized value of a thread, for a client that rewrites them (LetheSaver.forget_message)."""

    thread_id: str
    revision: int = Field(description="Name it in the rewrite: any write since refuses the rewrite with 412")
    generation: int
    blobs: list[StoredBlob]
    writes: list[StoredWrite]


class BlobKey(RequestModel):
    checkpoint_ns: Namespace = ""
    channel: Channel
    version: Version


class BlobReplacement(BlobKey):
    type: SerdeType
    data: Base64


class WriteKey(RequestModel):
    checkpoint_ns: Namespace = ""
    checkpoint_id: CheckpointId
    task_id: TaskId
    idx: int = Field(ge=-1000, le=1_000_000)


class WriteReplacement(WriteKey):
    type: SerdeType
    data: Base64


class RewriteIn(RequestModel):
    revision: int = Field(ge=0, le=2**53, description="The `revision` of the values read")
    blobs: list[BlobReplacement] = Field(default_factory=list, max_length=100_000)
    writes: list[WriteReplacement] = Field(default_factory=list, max_length=100_000)
    drop_writes: list[WriteKey] = Field(default_factory=list, max_length=100_000)


class RewriteOut(BaseModel):
    thread_id: str
    revision: int
    generation: int
