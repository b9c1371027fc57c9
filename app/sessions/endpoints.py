"""Sessions: the stateful agent runtime. HTTP in and out; the service is app/sessions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from app.engine.protocol import TokenSink
from app.errors import InvalidRequest
from app.forget.proposals import Proposal
from app.forget.schemas import job_out
from app.runtime.blocks import Observation
from app.runtime.tool_catalog import normalize as normalize_tools
from app.sessions.schemas import (
    ArtifactList,
    ArtifactOut,
    CompactionPolicy,
    CompactRequest,
    DocumentInput,
    InputRef,
    MemoryLink,
    ReplyOut,
    RetrievalConfig,
    SamplingConfig,
    SessionCreate,
    SessionList,
    SessionOut,
    ToolCallOut,
    ToolResultInput,
    ToolSpec,
    TurnInput,
    TurnOut,
    TurnRequest,
    UsageOut,
)
from app.sessions.service import SessionService
from app.sessions.views import ArtifactView, SessionConfig, SessionView, TurnResult
from app.web.consistency import ReadFromDep, stamp, token_responses
from app.web.deps import ContainerDep, PrincipalDep
from app.web.disconnect import until_disconnect
from app.web.openapi import link
from app.web.params import Cursor, ObjectId
from app.web.problems import problem_doc
from app.web.sse import stream_turn

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])



LEGAL_HOLD = "`legal_hold`: a standing legal hold covers it (`hold_id` names the hold)"
BUSY: dict[int | str, dict[str, Any]] = {409: problem_doc("Another turn or a forget holds the session (`Retry-After`)")}
TURN_ERRORS: dict[int | str, dict[str, Any]] = {
    **BUSY,
    503: problem_doc("The model is not loaded yet (`Retry-After`)"),
}


async def get_sessions(container: ContainerDep) -> SessionService:
    return container.services.sessions


SessionsDep = Annotated[SessionService, Depends(get_sessions)]


def _session_out(view: SessionView) -> SessionOut:
    row = view.row
    return SessionOut(
        id=row.id,
        epoch=row.epoch,
        status=view.status,
        turns=row.turns,
        token_count=row.token_count,
        pending_tool_calls=[ToolCallOut(id=c.id, name=c.name, arguments=c.arguments) for c in view.pending],
        system_prompt=row.system_prompt,
        memory_namespace=row.memory_namespace,
        subject_id=row.subject_id,
        context_policy=row.context_policy,
        retrieval=RetrievalConfig.model_validate(row.retrieval) if row.retrieval else None,
        checkpoint_policy=row.checkpoint_policy,
        tools=[ToolSpec.model_validate(t) for t in row.tools],
        # `per_turn`: sampling an OpenAI-compatible request set for one transition (kept for replays, not shown).
        sampling=SamplingConfig.model_validate({k: v for k, v in row.sampling.items() if k != "per_turn"})
        if row.sampling else None,
        compaction=CompactionPolicy.model_validate(row.compaction) if row.compaction else None,
    )


def _artifact_out(view: ArtifactView) -> ArtifactOut:
    row = view.row
    return ArtifactOut(
        id=row.id,
        kind=row.kind,
        turn=row.turn,
        content=None if row.erased else row.content,
        erased=row.erased,
        token_span=(row.token_start, row.token_end),
        parents=view.parents,
        source_ids=list(row.source_ids),
        committed=row.committed,
        source=row.meta.get("source"),
        tool_call_id=row.meta.get("tool_call_id"),
        memory=_memory_link(row.meta) if row.kind == "memory" else None,
    )


def _memory_link(meta: dict[str, Any]) -> MemoryLink:
    return MemoryLink(namespace=meta["namespace"], key=meta["key"], version=int(meta["version"]))


def _observation(item: TurnInput) -> Observation:
    if isinstance(item, DocumentInput):
        return Observation("document", item.content, {"source": item.source} if item.source else {})
    if isinstance(item, ToolResultInput):
        return Observation("tool_result", item.content, {"tool_call_id": item.tool_call_id})
    return Observation("user", item.content)


def _tools(specs: list[ToolSpec]) -> list[dict[str, Any]]:
    try:
        return normalize_tools([t.model_dump() for t in specs])
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


SESSION = "$response.body#/id"
SESSION_LINKS = {
    "GetSession": link("get_session_v1_sessions__id__get", "Read it", id=SESSION),
    "PostTurn": link("post_turn_v1_sessions__id__turns_post", "Run a transition", id=SESSION),
    "ListArtifacts": link("list_artifacts_v1_sessions__id__artifacts_get", "Its artifacts", id=SESSION),
    "CompactSession": link("compact_session_v1_sessions__id__compact_post", "Compact it", id=SESSION),
    "DeleteSession": link("delete_session_v1_sessions__id__delete", "Purge it", id=SESSION),
}


@router.post(
    "", status_code=201, response_model=SessionOut, summary="Create a session",
    responses={
        201: {"description": "The session", "links": SESSION_LINKS, **token_responses(201)[201]},
        422: problem_doc("Invalid options, or options the retrieval policy cannot honour (tools)"),
    },
)
async def create_session(
    body: SessionCreate, principal: PrincipalDep, sessions: SessionsDep, container: ContainerDep, response: Response
) -> SessionOut:
    if body.compaction.write_back and body.memory_namespace is None:
        raise InvalidRequest("compaction.write_back needs a memory_namespace")
    config = SessionConfig(
        system_prompt=body.system_prompt,
        memory_namespace=body.memory_namespace,
        context_policy=body.context_policy,
        retrieval=body.retrieval.model_dump(),
        checkpoint_policy=body.checkpoint_policy,
        tools=_tools(body.tools),
        sampling=body.sampling.model_dump(),
        compaction=body.compaction.model_dump() if body.compaction.max_tokens else {},
        subject_id=body.subject_id,
    )
    view = await sessions.create(principal.tenant_id, config)
    await stamp(response, container.db)
    return _session_out(view)


@router.get("", response_model=SessionList, summary="The tenant's sessions, newest first")
async def list_sessions(
    principal: PrincipalDep,
    sessions: SessionsDep,
    where: ReadFromDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Cursor = None,
    status: Annotated[Literal["idle", "running", "forgetting"] | None, Query()] = None,
    context_policy: Annotated[Literal["full", "retrieval"] | None, Query()] = None,
) -> SessionList:
    views, next_cursor = await sessions.page(
        principal.tenant_id, cursor=cursor, limit=limit, status=status, context_policy=context_policy, where=where
    )
    return SessionList(sessions=[_session_out(v) for v in views], next_cursor=next_cursor)


@router.get("/{id}", response_model=SessionOut, summary="Get a session")
async def get_session(id: ObjectId, principal: PrincipalDep, sessions: SessionsDep, where: ReadFromDep) -> SessionOut:
    return _session_out(await sessions.get(principal.tenant_id, id, where=where))


@router.delete(
    "/{id}", status_code=204, summary="Purge a session, its artifacts, checkpoints and cache",
    responses={409: problem_doc("Another turn or a forget holds the session (`Retry-After`), or " + LEGAL_HOLD),
               **token_responses(204)},
)
async def delete_session(
    id: ObjectId, principal: PrincipalDep, sessions: SessionsDep, container: ContainerDep
) -> Response:
    await sessions.delete(principal.tenant_id, id, erasure=True)
    purged = Response(status_code=204)
    await stamp(purged, container.db)
    return purged


def _sse_event(name: str, data: dict[str, Any], description: str) -> dict[str, Any]:
    """One server-sent event as a client parses it: its name and its `data` line, a JSON document."""
    return {
        "type": "object",
        "description": description,
        "required": ["event", "data"],
        "properties": {
            "event": {"const": name},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": data},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }


TURN_EVENTS: dict[str, Any] = {
    "oneOf": [
        _sse_event(
            "delta",
            {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
            "Text of the reply as it is sampled",
        ),
        _sse_event("turn", {"$ref": "#/components/schemas/TurnOut"}, "The last event: the transition"),
        _sse_event("error", {"$ref": "#/components/schemas/ProblemDetails"}, "The last event of a failed turn"),
    ]
}

TURN_RESPONSES: dict[int | str, dict[str, Any]] = {
    **TURN_ERRORS,
    200: {
        "links": {
            "ReplyDescendants": link(
                "artifact_descendants_v1_sessions__id__artifacts__artifact_id__descendants_get",
                "The taint closure of the reply", id="$request.path.id",
                artifact_id="$response.body#/reply/artifact_id",
            ),
            "InputDescendants": link(
                "artifact_descendants_v1_sessions__id__artifacts__artifact_id__descendants_get",
                "The taint closure of the first input", id="$request.path.id",
                artifact_id="$response.body#/inputs/0/artifact_id",
            ),
        },
        "description": "The transition; with `stream: true` (and a reply to sample), `text/event-stream`: `delta` "
        "events (`{\"text\": ...}`) as the reply is sampled, then one `turn` event with this object (or one "
        "`error` event with a problem document). The schema describes each event. A stream carries no "
        "Lethe-Consistency (its headers leave before the turn commits).",
        "content": {"text/event-stream": {"schema": TURN_EVENTS}},
        **token_responses(200)[200],
    },
}


@router.post("/{id}/turns", response_model=TurnOut, summary="Run one transition", responses=TURN_RESPONSES)
async def post_turn(
    id: ObjectId, body: TurnRequest, principal: PrincipalDep, sessions: SessionsDep, container: ContainerDep,
    http: Request, response: Response,
) -> TurnOut | Response:
    observations = [_observation(i) for i in body.inputs]
    proposal = await container.services.forget.propose(principal.tenant_id, id, observations, generate=body.generate)
    if proposal is not None:  # a deletion request: answered with a plan; never a transition, never stored
        return _plan_out(await sessions.get(principal.tenant_id, id), proposal)
    if body.stream and body.generate:
        async def run(on_tokens: TokenSink) -> TurnOut:
            return _turn_out(await sessions.turn(principal.tenant_id, id, observations, True, on_tokens))

        return await until_disconnect(http, stream_turn(run, await sessions.chat()))
    turn = sessions.turn(principal.tenant_id, id, observations, body.generate)
    result = await until_disconnect(http, turn)
    await stamp(response, container.db)
    return _turn_out(result)


def _plan_out(view: SessionView, proposal: Proposal) -> TurnOut:
    """A deletion request's answer (app/forget/proposals.py): the plan and its reply, in a turn that ran nothing."""
    plan = proposal.plan
    return TurnOut(
        turn=view.row.turns, epoch=view.row.epoch, inputs=[],
        reply=ReplyOut(artifact_id=None, content=proposal.reply),
        usage=UsageOut(prompt_tokens=0, reused_tokens=0, prefill_tokens=0, decode_tokens=0, closing_tokens=0),
        forget_plan=None if plan is None else job_out(plan),
    )


def _turn_out(result: TurnResult) -> TurnOut:
    usage = result.usage
    reply = None
    if result.reply_id is not None:
        reply = ReplyOut(
            artifact_id=result.reply_id,
            content=result.reply_content or "",
            tool_calls=[ToolCallOut(id=c.id, name=c.name, arguments=c.arguments) for c in result.tool_calls],
            finish_reason=result.finish_reason,
        )
    return TurnOut(
        turn=result.turn,
        epoch=result.epoch,
        inputs=[InputRef(artifact_id=i) for i in result.input_ids],
        reply=reply,
        usage=UsageOut(
            prompt_tokens=usage.prompt_tokens,
            reused_tokens=usage.reused_tokens,
            prefill_tokens=usage.prefill_tokens,
            decode_tokens=usage.decode_tokens,
            closing_tokens=usage.closing_tokens,
        ),
    )


@router.get("/{id}/artifacts", response_model=ArtifactList, summary="The ordered artifacts of the live state")
async def list_artifacts(
    id: ObjectId, principal: PrincipalDep, sessions: SessionsDep, where: ReadFromDep
) -> ArtifactList:
    views = await sessions.artifacts(principal.tenant_id, id, where=where)
    return ArtifactList(artifacts=[_artifact_out(v) for v in views])


@router.get(
    "/{id}/artifacts/{artifact_id}/descendants", response_model=ArtifactList, summary="Taint closure of an artifact"
)
async def artifact_descendants(
    id: ObjectId, artifact_id: ObjectId, principal: PrincipalDep, sessions: SessionsDep, where: ReadFromDep
) -> ArtifactList:
    views = await sessions.descendants(principal.tenant_id, id, artifact_id, where=where)
    return ArtifactList(artifacts=[_artifact_out(v) for v in views])


@router.post(
    "/{id}/compact", response_model=SessionOut, summary="Replace older turns with a model-written summary",
    responses={
        **TURN_ERRORS,
        409: problem_doc(
            "Another turn or a forget holds the session (`Retry-After`), or the session cannot be compacted as asked: "
            "nothing to compact, or write_back without a memory namespace"
        ),
        **token_responses(200),
    },
)
async def compact_session(
    id: ObjectId, principal: PrincipalDep, sessions: SessionsDep, container: ContainerDep, response: Response,
    body: CompactRequest | None = None,
) -> SessionOut:
    request = body or CompactRequest()
    view, _ = await sessions.compact(
        principal.tenant_id, id, keep_last_turns=request.keep_last_turns, write_back=request.write_back
    )
    await stamp(response, container.db)
    return _session_out(await sessions.get(principal.tenant_id, view.row.id))
