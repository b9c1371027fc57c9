"""Sessions: the stateful agent runtime."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.forget.schemas import ForgetJobOut
from app.ids import SUBJECT_ID_PATTERN
from app.request_model import Name, RequestModel
from app.runtime.compaction import DEFAULT_KEEP_LAST_TURNS
from app.runtime.engine_calls import SAMPLING_DEFAULTS
from app.runtime.retrieval import Params as RetrievalParams
from app.runtime.tool_catalog import BUILTINS


class RetrievalConfig(RequestModel):
    top_k: int = Field(default=RetrievalParams.top_k, ge=1, le=100)
    min_similarity: float = Field(default=RetrievalParams.min_similarity, ge=-1.0, le=1.0)


def _tool_rules(schema: dict[str, Any]) -> None:
    """A built-in is one of BUILTINS, of its own kind (app/runtime/tool_catalog.py `normalize`; 422 otherwise)."""
    schema["if"] = {"required": ["builtin"], "properties": {"builtin": {"const": True}}}
    schema["then"] = {
        "anyOf": [
            {"properties": {"name": {"const": builtin.name}, "kind": {"enum": [builtin.kind, None]}}}
            for builtin in BUILTINS
        ]
    }


class ToolSpec(RequestModel):
    """A tool the model may call. Names are unique within a session (422 otherwise)."""

    model_config = ConfigDict(json_schema_extra=_tool_rules)

    name: Name
    description: str = Field(default="", max_length=4000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    kind: Literal["read_only", "consequential"] | None = Field(
        default=None, description="Unset: a built-in's own kind, else read_only"
    )
    builtin: bool = Field(
        default=False,
        description="Executed by the server against the session's environment (get_balance, list_transfers, "
        "transfer, list_events, add_event); otherwise the client answers the call with a tool_result",
    )


class SamplingConfig(RequestModel):
    temperature: float = Field(default=SAMPLING_DEFAULTS.temperature, ge=0.0, le=2.0)
    top_p: float = Field(default=SAMPLING_DEFAULTS.top_p, gt=0.0, le=1.0)
    max_tokens: int = Field(default=SAMPLING_DEFAULTS.max_tokens, ge=1, le=4096)
    seed: int = Field(default=SAMPLING_DEFAULTS.seed, ge=0, le=2**63 - 1)
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list, max_length=8)


class CompactionPolicy(RequestModel):
    max_tokens: int | None = Field(
        default=None, ge=64, description="Compact automatically after a turn that leaves the prompt longer than this"
    )
    keep_last_turns: int = Field(default=DEFAULT_KEEP_LAST_TURNS, ge=0, le=1000)
    write_back: bool = Field(default=False, description="Also write each summary into the memory namespace")


def _session_rules(schema: dict[str, Any]) -> None:
    """What the create route refuses with 422 beyond each field's own schema (app/sessions/endpoints.py)."""
    schema["allOf"] = [
        {   # compaction.write_back writes into the session's memory namespace
            "if": {
                "required": ["compaction"],
                "properties": {
                    "compaction": {"required": ["write_back"], "properties": {"write_back": {"const": True}}}
                },
            },
            "then": {"required": ["memory_namespace"], "properties": {"memory_namespace": {"type": "string"}}},
        },
        {   # a retrieval session answers each turn in one prompt: no tool loop, no prompt that grows past a budget
            "if": {"required": ["context_policy"], "properties": {"context_policy": {"const": "retrieval"}}},
            "then": {
                "properties": {
                    "tools": {"maxItems": 0},
                    "compaction": {"properties": {"max_tokens": {"type": "null"}}},
                }
            },
        },
    ]


class SessionCreate(RequestModel):
    model_config = ConfigDict(json_schema_extra=_session_rules)

    system_prompt: str | None = Field(default=None, max_length=100_000)
    memory_namespace: str | None = Field(default=None, min_length=1, max_length=200)
    context_policy: Literal["full", "retrieval"] = "full"
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    checkpoint_policy: Literal["every_turn", "before_injections", "session_start"] = "every_turn"
    tools: list[ToolSpec] = Field(default_factory=list, max_length=64)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    compaction: CompactionPolicy = Field(default_factory=CompactionPolicy)
    subject_id: str | None = Field(
        default=None, max_length=200, pattern=SUBJECT_ID_PATTERN,
        description="The data subject (person) the session is about: their erasure erases it, their export exports it",
    )


class ToolCallOut(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any]


class SessionOut(BaseModel):
    id: str
    epoch: int
    status: Literal["idle", "running", "forgetting"]
    turns: int
    token_count: int
    pending_tool_calls: list[ToolCallOut] = Field(default_factory=list)
    system_prompt: str | None = None
    memory_namespace: str | None = None
    context_policy: str = "full"
    retrieval: RetrievalConfig | None = None
    checkpoint_policy: str = "every_turn"
    tools: list[ToolSpec] = Field(default_factory=list)
    sampling: SamplingConfig | None = None
    compaction: CompactionPolicy | None = None
    subject_id: str | None = None


class UserInput(RequestModel):
    type: Literal["user"]
    content: str = Field(max_length=200_000)


class DocumentInput(RequestModel):
    type: Literal["document"]
    content: str = Field(max_length=200_000)
    source: str | None = Field(default=None, max_length=2000)


class ToolResultInput(RequestModel):
    type: Literal["tool_result"]
    tool_call_id: str = Field(min_length=1, max_length=64)
    content: str = Field(max_length=200_000)


TurnInput = Annotated[UserInput | DocumentInput | ToolResultInput, Field(discriminator="type")]


class TurnRequest(RequestModel):
    inputs: list[TurnInput] = Field(default_factory=list, max_length=64)
    generate: bool = True
    stream: bool = False


class InputRef(BaseModel):
    artifact_id: str


class ReplyOut(BaseModel):
    artifact_id: str | None = Field(
        description="The reply's artifact; null for the answer to a deletion request, which is never stored"
    )
    content: str
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    finish_reason: Literal["stop", "length"] | None = None


class UsageOut(BaseModel):
    """The engine's measured token counts for this transition: `prompt_tokens = reused_tokens + prefill_tokens`."""

    prompt_tokens: int = Field(description="The log the reply was sampled from (without a reply: the log after it)")
    reused_tokens: int = Field(
        description="Prompt tokens this transition did not compute: their KV came from the cache (on vllm, a "
        "transition without a reply computes nothing; the next request computes its tokens and counts them)"
    )
    prefill_tokens: int = Field(description="Prompt tokens computed by this transition")
    decode_tokens: int = Field(description="Tokens sampled, a stop token included")
    closing_tokens: int = Field(
        default=0,
        description="Tokens computed after sampling to close the turn in the cache (end-of-turn marker); 0 on vllm, "
        "whose next request computes them and counts them in its prefill_tokens",
    )


class TurnOut(BaseModel):
    turn: int
    epoch: int
    inputs: list[InputRef]
    reply: ReplyOut | None
    usage: UsageOut
    forget_plan: ForgetJobOut | None = Field(
        default=None,
        description="Set when the turn was a deletion request in plain words (\"Forget that I live in Paris\"): the "
        "plan (status `planned`), which nothing runs until `POST /v1/forget {\"plan_id\"}` confirms it. Such a turn "
        "takes no transition and stores nothing (`turn` is the session's current count, `inputs` is empty).",
    )


ArtifactKind = Literal[
    "system", "memory", "user", "document", "tool_call", "tool_result", "assistant", "summary", "instruction"
]


class MemoryLink(BaseModel):
    namespace: str
    key: str
    version: int


class ArtifactOut(BaseModel):
    id: str
    kind: ArtifactKind
    turn: int
    content: str | None = Field(description="The artifact's text; null when `erased`")
    erased: bool = Field(
        default=False,
        description="Its keys were destroyed by a forget (a database restored from a backup taken before the forget)",
    )
    token_span: tuple[int, int] = Field(description="[start, end) in the session's token log; live spans tile it")
    parents: list[str] = Field(description="The stored provenance parents (the transitive reduction of the context)")
    source_ids: list[str] = Field(description="The observations this artifact derives from (itself, if one)")
    committed: bool
    source: str | None = Field(default=None, description="Where a document came from")
    tool_call_id: str | None = Field(default=None, description="The call a tool result answers")
    memory: MemoryLink | None = Field(default=None, description="The record a memory artifact injected")


class ArtifactList(BaseModel):
    """Artifacts in log order. For `/descendants`: the taint closure, i.e. the artifact (first) and every artifact
    whose context reached it."""

    artifacts: list[ArtifactOut]


class CompactRequest(RequestModel):
    keep_last_turns: int = Field(default=DEFAULT_KEEP_LAST_TURNS, ge=0, le=1000)
    write_back: bool = False



class SessionList(BaseModel):
    sessions: list[SessionOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page")
