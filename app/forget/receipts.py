"""A forget job's receipt: what it did per session, to memory and to side effects, built once as typed objects.

A receipt holds artifact ids, counts and digests, never a copy of the forgotten text. These are the stored form, as
JSON in `forget_jobs.receipt` (`JobReceipt.stored` / `JobReceipt.load`: the same JSON jobs stored before still load);
the API answers with its own schemas (forget/schemas.py), built from these, so the stored form can change without
changing the contract and the other way round. A dry run's plan uses the same session entry, with `trace` and
estimates instead of counts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict


class TokenCounts(BaseModel):
    reused: int
    prefilled: int | None = None  # a receipt's
    decoded: int | None = None  # a receipt's
    verified: int | None = None  # a receipt's: reply tokens accepted from the recorded reply without decoding
    recompute_estimate: int | None = None  # a plan's
    full_reset_estimate: int


class RestorePoint(BaseModel):
    turn: int
    token_offset: int


class TraceEntry(BaseModel):
    artifact_id: str
    kind: str
    turn: int
    why: str  # "target", or "context held <artifact id>"


class SessionEntry(BaseModel):
    session_id: str
    tau: int
    T: int
    transitions_replayed: int
    checkpoint: RestorePoint | None
    closure: list[str]
    trace: list[TraceEntry] | None = None  # a plan's
    tokens: TokenCounts
    epoch_before: int
    epoch_after: int | None = None
    state_sha256_before: str | None = None
    state_sha256_after: str | None = None
    exactness: str | None = None  # KVEngine.exactness when the session was forgotten (unset in older receipts)
    replay_modes: dict[str, str] | None = None  # per replayed reply (transition index): replay_mode()


def replay_mode(verified: int, decoded: int) -> str:
    """How a replayed reply was computed: `verified` (every token accepted from the recorded reply, none decoded),
    `verified+decoded` (a prefix accepted, the rest decoded), `decoded` (decoded step by step)."""
    if verified and decoded:
        return "verified+decoded"
    return "verified" if verified else "decoded"


class MemoryEntry(BaseModel):
    namespace: str
    key: str
    tombstone_version: int | None


class PendingInput(BaseModel):
    session_id: str
    tool_call: dict[str, Any]  # {id, name, arguments} of the call the counterfactual makes


class SideEffect(TypedDict):
    """A tool call's side effect: which call of which session, never its arguments (they may hold the target)."""

    session_id: str
    tool_call_id: str
    name: str


class DerivedMemory(TypedDict):
    """A memory record a session wrote back from the closure, tombstoned with the job (its own cascade job)."""

    namespace: str
    key: str
    tombstone_version: int
    forget_id: str | None


class SubjectEntry(BaseModel):
    """A data subject's erasure (app/subjects/): what it erased, by id and count, and the jobs that did it (each
    session's deletion and each memory key's tombstone records its own shred; this job's covers all of them)."""

    subject_id: str
    sessions: list[str] = Field(default_factory=list)  # erased whole
    conversations: list[str] = Field(default_factory=list)  # their sessions are among `sessions`
    namespaces: list[str] = Field(default_factory=list)
    memory_keys: int = 0  # tombstoned
    jobs: list[str] = Field(default_factory=list)
    # What they said inside other subjects' sessions, forgotten there by selective replay: the session and the job
    # (never the text: the job's own target is sealed and erased when it ends).
    also: list[dict[str, str]] = Field(default_factory=list)
    # What a standing legal hold kept out of it: {hold_id, session_id | namespace}. Releasing the hold erases it.
    held: list[dict[str, str]] = Field(default_factory=list)
    # Per session erased: {session_id, forget_id (its deletion's job, None when nothing of it was sealed), keys (the
    # data keys destroyed with it: one per sealed artifact, checkpoint, environment or conversation object)}.
    per_session: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """How many of each kind it erased (and how many parts a hold kept)."""
        return {"sessions": len(self.sessions), "conversations": len(self.conversations),
                "namespaces": len(self.namespaces), "memory_keys": self.memory_keys, "also": len(self.also),
                "held": len(self.held)}


class RetentionEntry(BaseModel):
    """A retention sweep (app/retention/): what expired and was erased, by id and count, and what a legal hold kept
    ({hold_id, session_id | namespace, key})."""

    sessions: list[str] = Field(default_factory=list)  # erased whole, each through its own deletion job
    memory_keys: int = 0  # tombstoned, each with its own cascade job
    jobs: list[str] = Field(default_factory=list)
    held: list[dict[str, str]] = Field(default_factory=list)


class JobReceipt(BaseModel):
    """A job's receipt as stored while it runs and once it ended."""

    model_config = ConfigDict(populate_by_name=True)

    sessions: list[SessionEntry] = Field(default_factory=list)
    memory: MemoryEntry | None = None
    suppressed_side_effects: list[SideEffect] = Field(default_factory=list)
    committed_side_effects: list[SideEffect] = Field(default_factory=list)
    derived_memory: list[DerivedMemory] = Field(default_factory=list)
    subject: SubjectEntry | None = None  # a data subject's erasure
    retention: RetentionEntry | None = None  # a retention sweep
    pending: PendingInput | None = None  # the call a needs_input job waits on
    # The client's answers to calls a replay made anew (tool call id → result), until the job ends; stored as
    # `inputs`, the key jobs have always stored them under.
    provided: dict[str, str] = Field(default_factory=dict, alias="inputs")
    duration_ms: int | None = None
    # Erasure at rest: the horizon promised when the forget recorded leaves to shred (forget_jobs.shred_leaves);
    # None: nothing promised (it erased nothing sealed, or some of what it erased was stored in the clear).
    erasure_horizon_s: int | None = None

    @classmethod
    def load(cls, stored: dict[str, Any] | None) -> JobReceipt:
        return cls.model_validate(stored or {})

    def stored(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def done(self, session_id: str) -> bool:
        return any(entry.session_id == session_id for entry in self.sessions)


def side_effects(session_id: str, calls: Iterable[Any]) -> list[SideEffect]:
    """Side effects of tool calls (anything with `id` and `name`) for a receipt."""
    return [SideEffect(session_id=session_id, tool_call_id=c.id, name=c.name) for c in calls]


def state_sha256(rows: Iterable[tuple[str, int, Sequence[int]]]) -> str:
    """A digest of a session's live state: per artifact in log order its kind, transition and tokens. Receipts carry
    it before and after, so an auditor can tell two states apart without the receipt holding any of their text."""
    digest = hashlib.sha256()
    for kind, turn, tokens in rows:
        digest.update(f"{kind}\t{turn}\t{','.join(map(str, tokens))}\n".encode())
    return digest.hexdigest()
