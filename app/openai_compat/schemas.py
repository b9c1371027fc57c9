"""Request and answer shapes of the OpenAI-compatible routes (OpenAI's public API reference, as the official SDK
sends and parses them). Unknown parameters are refused (400 naming them); items are parsed in items.py, where each
unsupported form gets its own message."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.request_model import Name


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16, description="Up to 16 string pairs (keys ≤ 64 characters, values ≤ 512)"),
]
RawItem = dict[str, Any]


class ConversationRef(Request):
    id: str = Field(min_length=1, max_length=64)


class FunctionTool(Request):
    type: Literal["function"] = Field(description="Function tools only: the client runs them")
    name: Name
    description: str | None = Field(default=None, max_length=4000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(Request):
    type: Literal["text"]


class TextConfig(Request):
    format: TextFormat | None = None


Identifier = Annotated[str, Field(max_length=256)]


class ResponseStreamOptions(Request):
    include_obfuscation: Literal[False] | None = Field(
        default=None, description="Only `false`: the deltas carry no obfuscation padding"
    )


class ResponseCreate(Request):
    """Each field is honoured, accepted for the values that ask for nothing Lethe does differently (their types and
    descriptions say which), or absent (an unknown parameter is a 400 naming it). README: "Compatibility policy"."""

    model: str = Field(min_length=1, max_length=200)
    input: Annotated[str, Field(max_length=200_000)] | Annotated[list[RawItem], Field(max_length=64)] | None = None
    conversation: str | ConversationRef | None = None
    previous_response_id: str | None = Field(default=None, max_length=64)
    instructions: str | None = Field(default=None, max_length=100_000)
    max_output_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = Field(default=None, max_length=64)
    tool_choice: Literal["auto"] | None = Field(default=None, description="Only `auto`")
    parallel_tool_calls: Literal[True] | None = Field(default=None, description="Only `true`")
    stream: bool | None = None
    store: Literal[True] | None = Field(default=None, description="Only `true`: a response is a session transition")
    metadata: Metadata | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled"] | None = None
    include: list[str] | None = Field(
        default=None, max_length=16,
        description=(
            "`[]`, or values naming output kinds this server never produces (app/openai_compat/compatibility.py)"
        ),
    )
    background: Literal[False] | None = Field(default=None, description="Only `false`")
    service_tier: Literal["auto", "default"] | None = Field(default=None, description="One tier: `auto` or `default`")
    stream_options: ResponseStreamOptions | None = None
    top_logprobs: Literal[0] | None = Field(default=None, description="Only 0: no logprobs are returned")
    max_tool_calls: int | None = Field(
        default=None, ge=0, description="Bounds built-in tool calls; this server runs none"
    )
    user: Identifier | None = Field(
        default=None, description="The end user: the data subject (docs/subjects.md) of a session this request "
        "creates, unless `safety_identifier` is given (it must then match a subject id's pattern; 400 otherwise)",
    )
    safety_identifier: Identifier | None = Field(default=None, description="As `user`, and preferred to it")
    prompt_cache_key: Identifier | None = Field(
        default=None, description="A cache-bucketing hint; Lethe's cache is the conversation's own"
    )
    reasoning: None = Field(default=None, description="Only null: the served model has no reasoning settings")


class ConversationCreate(Request):
    items: list[RawItem] | None = Field(default=None, max_length=20)
    metadata: Metadata | None = None


class ConversationUpdate(Request):
    metadata: Metadata


class ItemsCreate(Request):
    items: list[RawItem] = Field(min_length=1, max_length=20)


class ChatTool(Request):
    type: Literal["function"]
    function: ChatFunction


class ChatFunction(Request):
    name: Name
    description: str | None = Field(default=None, max_length=4000)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


ChatTool.model_rebuild()


class StreamOptions(Request):
    include_usage: bool | None = None
    include_obfuscation: Literal[False] | None = Field(default=None, description="Only `false`")


class ResponseFormat(Request):
    type: Literal["text"]


class ChatCompletionCreate(Request):
    model: str = Field(min_length=1, max_length=200)
    messages: list[RawItem] = Field(min_length=1, max_length=256)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=4096)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: (
        Annotated[str, Field(min_length=1, max_length=64)]
        | Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=4)]
        | None
    ) = None
    n: Literal[1] | None = Field(default=None, description="Only 1")
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[ChatTool] | None = Field(default=None, max_length=64)
    tool_choice: Literal["auto"] | None = Field(default=None, description="Only `auto`")
    parallel_tool_calls: Literal[True] | None = Field(default=None, description="Only `true`")
    response_format: ResponseFormat | None = Field(default=None, description="Only `{\"type\": \"text\"}`")
    frequency_penalty: Literal[0] | None = Field(default=None, description="Only 0 (no penalty)")
    presence_penalty: Literal[0] | None = Field(default=None, description="Only 0 (no penalty)")
    logprobs: Literal[False] | None = Field(default=None, description="Only `false`")
    logit_bias: dict[str, int] | None = Field(default=None, max_length=0, description="Only `{}`")
    store: Literal[False] | None = Field(
        default=None, description="Only `false`: this server keeps no completions for distillation or evals"
    )
    modalities: list[Literal["text"]] | None = Field(default=None, max_length=1, description="Only `[\"text\"]`")
    service_tier: Literal["auto", "default"] | None = Field(default=None, description="One tier: `auto` or `default`")
    user: Identifier | None = Field(
        default=None, description="The end user: the data subject (docs/subjects.md) of a session this request "
        "creates, unless `safety_identifier` is given (it must then match a subject id's pattern; 400 otherwise)",
    )
    safety_identifier: Identifier | None = Field(default=None, description="As `user`, and preferred to it")
    prompt_cache_key: Identifier | None = Field(
        default=None, description="A cache-bucketing hint; Lethe's cache is the conversation's own"
    )


# -- answers (items and outputs are OpenAI's item objects, documented there) ------------------------------------

class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class ConversationOut(Answer):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str]
    lethe_session_id: str = Field(description="The session behind the conversation (native API)")
    lethe_forget: dict[str, Any] | None = Field(
        default=None, description="On an item deletion: the forget job and its receipt (a dry run: the plan)"
    )


class ConversationDeleted(Answer):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


class ItemList(Answer):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponseOut(Answer):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete"]
    model: str
    output: list[dict[str, Any]]
    lethe_forget_plan: dict[str, Any] | None = Field(
        default=None, description="When the input was a deletion request in plain words (\"Forget that I live in "
        "Paris\"): the stored plan, confirmed with POST /v1/forget {\"plan_id\": ...}; the request ran no "
        "transition and is stored nowhere",
    )


class ChatCompletionOut(Answer):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: dict[str, Any]
    lethe_forget_plan: dict[str, Any] | None = Field(
        default=None, description="When the input was a deletion request in plain words (\"Forget that I live in "
        "Paris\"): the stored plan, confirmed with POST /v1/forget {\"plan_id\": ...}; the request ran no "
        "transition and is stored nowhere",
    )


class ModelOut(Answer):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(Answer):
    object: Literal["list"] = "list"
    data: list[ModelOut]
