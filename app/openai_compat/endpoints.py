"""The OpenAI-compatible routes: thin, parse and authenticate, then the services (service.py, chat.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from app.openai_compat import streaming
from app.openai_compat.chat import ChatService
from app.openai_compat.compatibility import check_include
from app.openai_compat.errors import OPENAI_ERRORS, BadParameter
from app.openai_compat.items import check_text
from app.openai_compat.schemas import (
    ChatCompletionCreate,
    ChatCompletionOut,
    ConversationCreate,
    ConversationDeleted,
    ConversationOut,
    ConversationUpdate,
    ItemList,
    ItemsCreate,
    ModelList,
    ModelOut,
    ResponseCreate,
    ResponseOut,
)
from app.openai_compat.service import CompatService
from app.web import sse
from app.web.consistency import stamp, token_responses
from app.web.deps import ContainerDep, PrincipalDep
from app.web.disconnect import until_disconnect
from app.web.problems import FormattedRoute


class OpenAIRoute(FormattedRoute):
    """Errors in OpenAI's body, which the official SDKs parse (their typed exceptions come from the status)."""

    error_format = OPENAI_ERRORS


router = APIRouter(prefix="/v1", tags=["openai-compatible"], route_class=OpenAIRoute)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorDetail


def _doc(description: str) -> dict[str, Any]:
    return {"description": description, "model": ErrorBody}


ERRORS: dict[int | str, dict[str, Any]] = {
    400: _doc("Invalid or unsupported parameter (`param` names it)"),
    401: _doc("Missing or invalid API key"),
    404: _doc("Unknown id (or another tenant's), or a model this server does not serve"),
    413: _doc("Body or prompt too large"),
    422: _doc("A value the session cannot take (e.g. a function_call_output answering no pending call)"),
    503: _doc("The database connection was lost under the request; retry (`Retry-After`)"),
}
TURN_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    409: _doc("The session is busy (another turn or a forget; `Retry-After`), or moved on; deleting: a legal hold "
              "covers it (Lethe's `POST /v1/holds`)"),
    503: _doc("The model is not loaded yet, or the database connection was lost (`Retry-After`)"),
}


def _events(name: dict[str, Any], data: str) -> dict[str, dict[str, Any]]:
    """`text/event-stream` whose schema describes each event as a client parses it (name, `data` line)."""
    event = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {"event": name, "data": {"type": "string", "description": data}, "id": {"type": "string"}},
    }
    return {"text/event-stream": {"schema": event}}


RESPONSE_STREAM = _events(
    {"type": "string", "pattern": r"^(response\.[a-z_.]+|error)$"},
    "JSON: the event's object (`type` is the event's name, `sequence_number` grows)",
)
CHAT_STREAM = _events({"const": "message"}, "JSON: a chat.completion.chunk or `{\"error\": ...}`; last `[DONE]`")


async def get_compat(container: ContainerDep) -> CompatService:
    return container.services.conversations


async def get_chat(container: ContainerDep) -> ChatService:
    return container.services.chat


INCLUDE = "Values naming output kinds this server never produces (app/openai_compat/compatibility.py); others 400"
CompatDep = Annotated[CompatService, Depends(get_compat)]
ChatDep = Annotated[ChatService, Depends(get_chat)]


def _checked(body: BaseModel) -> None:
    check_text(body.model_dump(exclude_none=True), "")


# -- models -----------------------------------------------------------------------------------------------------

@router.get("/models", response_model=ModelList, summary="The model this server serves", responses=ERRORS)
async def list_models(principal: PrincipalDep, compat: CompatDep) -> dict[str, Any]:
    return {"object": "list", "data": [_model(compat.model_id)]}


@router.get("/models/{model}", response_model=ModelOut, summary="A served model", responses=ERRORS)
async def get_model(model: str, principal: PrincipalDep, compat: CompatDep) -> dict[str, Any]:
    compat.check_model(model)
    return _model(model)


def _model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "lethe"}


# -- conversations ----------------------------------------------------------------------------------------------

@router.post("/conversations", response_model=ConversationOut, summary="Create a conversation (a session)",
             responses=TURN_ERRORS)
async def create_conversation(body: ConversationCreate, principal: PrincipalDep, compat: CompatDep) -> dict[str, Any]:
    _checked(body)
    return await compat.create_conversation(principal.tenant_id, body.items or [], body.metadata or {})


@router.get("/conversations/{conversation_id}", response_model=ConversationOut, summary="A conversation",
            responses=ERRORS)
async def get_conversation(conversation_id: str, principal: PrincipalDep, compat: CompatDep) -> dict[str, Any]:
    return await compat.get_conversation(principal.tenant_id, conversation_id)


@router.post("/conversations/{conversation_id}", response_model=ConversationOut,
             summary="Replace a conversation's metadata", responses=ERRORS)
async def update_conversation(
    conversation_id: str, body: ConversationUpdate, principal: PrincipalDep, compat: CompatDep
) -> dict[str, Any]:
    _checked(body)
    return await compat.update_conversation(principal.tenant_id, conversation_id, body.metadata)


@router.delete("/conversations/{conversation_id}", response_model=ConversationDeleted,
               summary="Delete a conversation: its session, artifacts, responses and cache", responses=TURN_ERRORS)
async def delete_conversation(conversation_id: str, principal: PrincipalDep, compat: CompatDep) -> dict[str, Any]:
    return await compat.delete_conversation(principal.tenant_id, conversation_id)


@router.get("/conversations/{conversation_id}/items", response_model=ItemList,
            summary="A conversation's items (its live artifacts)", responses=ERRORS)
async def list_items(
    conversation_id: str, principal: PrincipalDep, compat: CompatDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    include: Annotated[list[str] | None, Query(description=INCLUDE)] = None,
) -> dict[str, Any]:
    check_include(include)
    return await compat.list_items(principal.tenant_id, conversation_id, after=after, limit=limit, order=order)


@router.post("/conversations/{conversation_id}/items", response_model=ItemList,
             summary="Add items (one transition without a reply)", responses=TURN_ERRORS)
async def create_items(
    conversation_id: str, body: ItemsCreate, principal: PrincipalDep, compat: CompatDep,
    include: Annotated[list[str] | None, Query(description=INCLUDE)] = None,
) -> dict[str, Any]:
    check_include(include)
    _checked(body)
    return await compat.create_items(principal.tenant_id, conversation_id, body.items)


@router.get("/conversations/{conversation_id}/items/{item_id}", summary="An item", responses=ERRORS)
async def get_item(conversation_id: str, item_id: str, principal: PrincipalDep, compat: CompatDep) -> dict[str, Any]:
    return await compat.get_item(principal.tenant_id, conversation_id, item_id)


@router.delete(
    "/conversations/{conversation_id}/items/{item_id}", response_model=ConversationOut,
    summary="Delete an item: a forget (selective replay by default), answered once durable",
    description="The conversation afterwards is the one that never had the item. Answers 200 once the forget job "
    "succeeded (202 while it still runs after LETHE_FORGET_WAIT_S, or waits on a tool result: `needs_input`); "
    "`lethe_forget` is the job and its receipt, "
    "`Lethe-Forget-Id` its id (GET /v1/forget/{id}). `lethe_dry_run=true` answers the plan and changes nothing.",
    responses={**TURN_ERRORS, 202: {"model": ConversationOut, "description": "The forget still runs"},
               **token_responses(200)},
)
async def delete_item(
    conversation_id: str, item_id: str, principal: PrincipalDep, compat: CompatDep, container: ContainerDep,
    lethe_strategy: Annotated[str | None, Query(max_length=40, description="A forget strategy (default "
                                                "selective_replay)")] = None,
    lethe_dry_run: bool = False,
) -> JSONResponse:
    done = await compat.delete_item(
        principal.tenant_id, conversation_id, item_id, strategy=lethe_strategy, dry_run=lethe_dry_run
    )
    headers = {} if lethe_dry_run else {"Lethe-Forget-Id": done.job.id}
    # 202 while the job runs, and for needs_input (the replay waits on a tool result: the item is not gone yet).
    finished = done.job.dry_run or done.job.status == "succeeded"
    answer = JSONResponse(done.conversation, status_code=200 if finished else 202, headers=headers)
    if finished and not lethe_dry_run:  # Lethe-Consistency (app/web/consistency.py): the forget is durable
        await stamp(answer, container.db)
    return answer


# -- responses --------------------------------------------------------------------------------------------------

@router.post(
    "/responses", response_model=ResponseOut, summary="Create a response (one transition with a reply)",
    responses={**TURN_ERRORS, 200: {"description": "The response; with `stream: true`, OpenAI's event stream "
                                    "(response.created … response.output_text.delta … response.completed)",
                                    "content": RESPONSE_STREAM}},
)
async def create_response(
    body: ResponseCreate, principal: PrincipalDep, compat: CompatDep, http: Request
) -> dict[str, Any] | Response:
    _checked(body)
    run, skeleton, reply_id = await compat.create_response(principal.tenant_id, body)
    if body.stream:
        started = await until_disconnect(http, sse.start(run, await compat.sessions.chat()))
        return sse.respond(streaming.response_events(started, skeleton, reply_id), started)
    return await until_disconnect(http, run(None))


@router.get("/responses/{response_id}", response_model=ResponseOut, summary="A response, as its transition is now",
            responses=ERRORS)
async def get_response(response_id: str, principal: PrincipalDep, compat: CompatDep) -> dict[str, Any]:
    return await compat.get_response(principal.tenant_id, response_id)


@router.get("/responses/{response_id}/input_items", response_model=ItemList,
            summary="A response's input items, as its transition is now", responses=ERRORS)
async def list_input_items(
    response_id: str, principal: PrincipalDep, compat: CompatDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    include: Annotated[list[str] | None, Query(description=INCLUDE)] = None,
) -> dict[str, Any]:
    check_include(include)
    return await compat.input_items(principal.tenant_id, response_id, after=after, limit=limit, order=order)


# -- chat completions -------------------------------------------------------------------------------------------

@router.post(
    "/chat/completions", response_model=ChatCompletionOut,
    summary="A chat completion (stateless; a resent history reuses its session's cache)",
    responses={**TURN_ERRORS, 200: {"description": "The completion; with `stream: true`, chat.completion.chunk "
                                    "events then `[DONE]`", "content": CHAT_STREAM}},
)
async def create_chat_completion(
    body: ChatCompletionCreate, principal: PrincipalDep, chat: ChatDep, http: Request
) -> JSONResponse | Response:
    _checked(body)
    run, head = await chat.create(principal.tenant_id, body)
    session_header = {"Lethe-Session-Id": head["lethe_session_id"]}
    if body.stream:
        started = await until_disconnect(http, sse.start(run, await chat.sessions.chat()))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        response = sse.respond(streaming.chat_chunks(started, head, include_usage), started)
        response.headers.update(session_header)
        return response
    if body.stream_options is not None:
        raise BadParameter("stream_options", "stream_options needs stream: true")
    return JSONResponse(await until_disconnect(http, run(None)), headers=session_header)
