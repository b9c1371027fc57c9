"""Forget requests, jobs and detector webhooks as the API shows them (the stored receipt is app/forget/receipts.py;
flags: app/webhooks/schemas.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.forget.jobs import JobView
from app.keys.shred import SHRED_DOC, Shred
from app.memory.schemas import KEY_PATTERN, NAMESPACE_PATTERN
from app.request_model import RequestModel

Strategy = Literal[
    "selective_replay", "full_reset", "delete_dependents", "no_forget", "memory_delete", "forget_instruction",
    "source_redaction", "sanitize_no_replay", "sanitized_rebuild", "ifc", "ifc_replay", "semantic_deletion",
]


class MemoryRef(RequestModel):
    namespace: str = Field(min_length=1, max_length=200, pattern=NAMESPACE_PATTERN)
    key: str = Field(min_length=1, max_length=200, pattern=KEY_PATTERN)


# The target forms, the JSON type each takes, and whether it needs `session_id` (ForgetTarget._exactly_one).
_FORMS = {
    "artifact_id": ("string", False), "artifact_ids": ("array", True), "text": ("string", True),
    "memory": ("object", False), "keyword": ("string", True), "query": ("string", True),
}


def _one_form(form: str) -> dict[str, Any]:
    kind, needs_session = _FORMS[form]
    properties: dict[str, Any] = {other: {"type": "null"} for other in _FORMS if other != form}
    properties[form] = {"type": kind}
    if needs_session:
        properties["session_id"] = {"type": "string"}
    if form != "query":
        properties["min_similarity"] = {"type": "null"}
    required = [form, "session_id"] if needs_session else [form]
    return {"type": "object", "required": required, "properties": properties}


def _target_schema(schema: dict[str, Any]) -> None:
    """The validator's rules in the JSON Schema, so the spec says which bodies are accepted."""
    schema["oneOf"] = [_one_form(form) for form in _FORMS]


def _request_schema(schema: dict[str, Any]) -> None:
    schema["oneOf"] = [
        {
            "type": "object", "required": [given],
            "properties": {given: {"type": kind}, other: {"type": "null"}},
        }
        for given, kind, other in (("target", "object", "plan_id"), ("plan_id", "string", "target"))
    ]
    # semantic_deletion takes a query target only (422 otherwise).
    schema["if"] = {
        "required": ["strategy", "target"],
        "properties": {"strategy": {"const": "semantic_deletion"}, "target": {"type": "object"}},
    }
    schema["then"] = {"properties": {"target": {"required": ["query"], "properties": {"query": {"type": "string"}}}}}


class ForgetTarget(RequestModel):
    """Exactly one target form: an artifact, a set of artifacts, a text span in a session, a memory record, a keyword
    or a semantic query."""

    model_config = ConfigDict(json_schema_extra=_target_schema)

    artifact_id: str | None = Field(default=None, min_length=1, max_length=64)
    artifact_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None, min_length=1, max_length=1000,
        description="DeLLM's M by id: these artifacts of `session_id` (observations dropped, outputs' dependents "
        "with them)",
    )
    session_id: str | None = Field(default=None, min_length=1, max_length=64)
    text: str | None = Field(default=None, min_length=1, max_length=100_000)
    memory: MemoryRef | None = None
    keyword: str | None = Field(
        default=None, min_length=1, max_length=1000,
        description="The session's observations matching it under PostgreSQL full-text search (English stemming, "
        "web-search syntax: `guitar`, `\"live in Paris\"`, `guitar or piano`)",
    )
    query: str | None = Field(default=None, min_length=1, max_length=10_000)
    min_similarity: float | None = Field(default=None, ge=-1.0, le=1.0)

    @model_validator(mode="after")
    def _exactly_one(self) -> ForgetTarget:
        forms = [self.artifact_id, self.artifact_ids, self.text, self.memory, self.keyword, self.query]
        if sum(form is not None for form in forms) != 1:
            raise ValueError(
                "give exactly one of artifact_id, artifact_ids, text, memory, keyword, query "
                "(all but artifact_id and memory with session_id)"
            )
        if (self.text or self.query or self.keyword or self.artifact_ids) is not None and self.session_id is None:
            raise ValueError("artifact_ids, text, keyword and query targets need session_id")
        if self.min_similarity is not None and self.query is None:
            raise ValueError("min_similarity applies only to a query target")
        return self


class ForgetRequest(RequestModel):
    model_config = ConfigDict(json_schema_extra=_request_schema)

    target: ForgetTarget | None = None
    plan_id: str | None = Field(
        default=None, min_length=1, max_length=64,
        description="Confirm a plan a deletion request in plain words produced (a job in status `planned`) "
        "instead of giving a target",
    )
    strategy: Strategy | None = Field(default=None, description="Default: the plan's, else `selective_replay`")
    dry_run: bool = False
    wait: bool = False
    reason: str | None = Field(default=None, max_length=2000)
    shred: Shred = Field(default="horizon", description=SHRED_DOC)

    @model_validator(mode="after")
    def _target_or_plan(self) -> ForgetRequest:
        if (self.target is None) == (self.plan_id is None):
            raise ValueError("give exactly one of target and plan_id")
        return self


class TokensOut(BaseModel):
    reused: int = Field(description="Tokens of the clean prefix served from the cache")
    prefilled: int | None = Field(default=None, description="Prompt tokens computed (a receipt)")
    decoded: int | None = Field(
        default=None, description="Tokens sampled by decode steps, stop tokens included (a receipt)"
    )
    verified: int | None = Field(
        default=None,
        description="Reply tokens (stop tokens included) accepted from the recorded replies in one verification pass "
        "each, without decoding (a receipt): `verified + decoded` is every token the replay sampled",
    )
    recompute_estimate: int | None = Field(
        default=None, description="Tokens the replay is expected to compute (a plan)"
    )
    full_reset_estimate: int = Field(description="Tokens a cold full reset of the session computes")


class CheckpointOut(BaseModel):
    turn: int
    token_offset: int


class TraceStep(BaseModel):
    artifact_id: str
    kind: str
    turn: int
    why: str = Field(description="`target`, or `context held <artifact id>`: the parent it was reached through")


class SessionReceipt(BaseModel):
    session_id: str
    tau: int = Field(description="The first transition holding the target")
    T: int = Field(description="The session's last transition when the forget ran")
    transitions_replayed: int
    checkpoint: CheckpointOut | None = Field(description="The restore point (None: nothing reused)")
    closure: list[str] = Field(description="The target and every artifact whose context reached it")
    trace: list[TraceStep] | None = Field(default=None, description="Why each closure artifact is there (dry run)")
    tokens: TokensOut
    epoch_before: int
    epoch_after: int | None = None
    state_sha256_before: str | None = None
    state_sha256_after: str | None = None
    exactness: str | None = Field(
        default=None,
        description="How exactly the engine reproduced the counterfactual: `exact` (hf: bit for bit), `unbatched` or "
        "`batch-invariant` (vLLM: bit for bit while the prefix stays cached), `batched` (vLLM batching beside live "
        "traffic: a token may flip at a near-tie; docs/engines.md measures how often). Unset in a dry run and in "
        "receipts from before it was recorded.",
    )
    replay_modes: dict[str, str] | None = Field(
        default=None,
        description="Per replayed or regenerated reply, by transition index: how its tokens were computed. `verified`: "
        "every decision read off one forward pass over the recorded reply and certified (a logit margin the float "
        "noise between a pass and decode steps cannot cross: docs/engines.md); `verified+decoded`: the recorded "
        "reply's prefix verified, decoded from the first disagreement; `decoded`: decoded step by step (verification "
        "off, an engine that does not verify, or a decision too close to call). The tokens are decoding's in every "
        "mode.",
    )


class MemoryReceipt(BaseModel):
    namespace: str
    key: str
    tombstone_version: int | None


class ErasureReceipt(BaseModel):
    live: Literal["pending", "complete"] = Field(description="`complete` once no live row holds what it erased")
    at_rest: Literal["pending", "complete"] = Field(
        description="`complete` once every key able to decrypt what it erased is destroyed in the key provider"
    )
    at_rest_complete_at: datetime | None
    horizon_s: int = Field(description="LETHE_ERASURE_HORIZON_S: the bound within which `at_rest` completes")
    overdue: bool = Field(
        default=False,
        description="`at_rest` is still `pending` past the horizon (the key provider refused or was unreachable): "
        "the promise is broken until it completes; `lethe_erasure_oldest_pending_seconds` alerts on it",
    )


class SubjectReceipt(BaseModel):
    subject_id: str
    sessions: list[str] = Field(description="Sessions erased whole (a conversation's among them)")
    conversations: list[str]
    namespaces: list[str]
    memory_keys: int = Field(description="Memory keys tombstoned (each with its own cascade job)")
    jobs: list[str] = Field(description="The jobs that did it: each session deletion's and each key's, with their "
                                        "own shreds (this job's `erasure` covers every leaf of them)")
    also: list[dict[str, str]] = Field(
        default_factory=list,
        description="`{session_id, forget_id}`: a selective-replay forget of what they said in another subject's "
        "session (`also.text` or `also.query`), queued; its own receipt says when it is done",
    )
    held: list[dict[str, str]] = Field(
        default_factory=list,
        description="`{hold_id, session_id}` or `{hold_id, namespace}`: a part a standing legal hold kept out of "
        "the erasure; releasing the hold (DELETE /v1/holds/{id}) queues its erasure",
    )
    counts: dict[str, int] = Field(
        default_factory=dict,
        description="How many it erased of each kind: `sessions`, `conversations`, `namespaces`, `memory_keys`, "
        "`also` (forgets queued in others' sessions), and `held` (parts a hold kept)",
    )
    per_session: list[dict[str, Any]] = Field(
        default_factory=list,
        description="`{session_id, forget_id, keys}` per session erased: its deletion's job and how many data keys "
        "were destroyed with it (one per sealed artifact, checkpoint, environment or conversation object)",
    )


class RetentionReceipt(BaseModel):
    sessions: list[str] = Field(description="Idle sessions past their limit, erased whole")
    memory_keys: int = Field(description="Memory keys past their age limit, tombstoned (each with its own cascade)")
    jobs: list[str] = Field(description="The jobs that did it: each session deletion's and each key's")
    held: list[dict[str, str]] = Field(
        description="`{hold_id, session_id}` or `{hold_id, namespace, key}`: expired, kept by a standing legal hold"
    )


class PendingCall(BaseModel):
    session_id: str
    tool_call: dict[str, Any] = Field(description="`{id, name, arguments}` of the call the counterfactual makes")


class ForgetJobOut(BaseModel):
    id: str
    status: Literal["planned", "queued", "running", "succeeded", "failed", "needs_input", "held"] = Field(
        description="`planned`: a plan from a deletion request in plain words, waiting for `plan_id` to confirm it; "
        "`held`: a standing legal hold covers a session the job would change (`hold_id`); the sessions it reached "
        "before stay forgotten, and the hold's release queues it again"
    )
    strategy: str
    target: dict[str, Any] = Field(
        description="The target; a text, keyword or query target's words are replaced by their length once the "
        "job ends"
    )
    dry_run: bool = False
    reason: str | None = Field(default=None, description="null once `target_erased`")
    target_erased: bool = Field(
        default=False,
        description="The job's target words and reason were stored sealed and ended with it (their key is shredded "
        "with the job's others): `target` holds only ids and the words' lengths, `reason` is null",
    )
    sessions: list[SessionReceipt] = Field(default_factory=list)
    memory: MemoryReceipt | None = None
    suppressed_side_effects: list[dict[str, Any]] = Field(default_factory=list)
    committed_side_effects: list[dict[str, Any]] = Field(default_factory=list)
    pending: PendingCall | None = Field(default=None, description="What a `needs_input` job waits for")
    derived_memory: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Memory records a session wrote back from what the job forgot, tombstoned with it "
        "(`namespace`, `key`, `tombstone_version`, `forget_id` of their own cascade)",
    )
    subject: SubjectReceipt | None = Field(default=None, description="A data subject's erasure: what it erased")
    retention: RetentionReceipt | None = Field(
        default=None, description="A retention sweep (strategy `retention`): what expired and was erased")
    duration_ms: int | None = None
    erasure: ErasureReceipt | None = Field(
        default=None,
        description="Erasure at rest, for a forget that erased sealed content (today: memory values); absent "
        "while what a forget erased is not sealed yet",
    )
    error: str | None = None
    hold_id: str | None = Field(default=None, description="The legal hold a `held` job waits on")
    created_at: datetime | None = None
    finished_at: datetime | None = None


class WebhookAccepted(BaseModel):
    forget_id: str


class ToolResultForJob(RequestModel):
    """The client's answer to the tool call a `needs_input` job waits on."""

    tool_call_id: str = Field(min_length=1, max_length=64)
    content: str = Field(max_length=200_000)


class ForgetJobList(BaseModel):
    jobs: list[ForgetJobOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page")


class DeliveryOut(BaseModel):
    webhook_id: str
    forget_id: str | None = Field(description="The job the delivery started (null: none, or the job was deleted)")
    forget_status: str | None = Field(description="That job's status now")
    received_at: datetime


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page")


def job_out(view: JobView) -> ForgetJobOut:
    """The API's answer for a job: its stored receipt (app/forget/receipts.py) read into the contract's shapes."""
    return ForgetJobOut.model_validate(view, from_attributes=True)
