"""The MCP tools and resources: memory (read, conditional write, forget, list, history), forgetting (plan, then
confirm, for a session artifact or a text) and data subjects (the access request's export, the erasure's plan, then
its confirmation), with every forget's receipt readable as a resource.

Each call runs as the tenant whose API key the request carried (mount.py puts it in the request's scope) through the
same services as the HTTP API, so every rule holds here too: a write names the version its writer saw and loses if
that is no longer the newest (412 on HTTP; here a tool error whose text says where the key stands, for the model to
read the key again), a forgotten value is gone from history, a confirmed forget answers once its job ended.

A Lethe error becomes a tool error (`isError`) whose text is a JSON object: `status` (the HTTP status the API would
answer), `type`, `detail` and the error's fields (`current_version`, `forgotten`, ...). An agent reads it; a client
branches on it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import Field

from app.container import Container
from app.errors import InvalidRequest, LetheError, NotFound
from app.forget.jobs import JobView, Submission
from app.forget.locate import DEFAULT_MIN_SIMILARITY
from app.forget.schemas import job_out
from app.ids import SUBJECT_ID_PATTERN
from app.memory.service import Forgotten
from app.subjects.schemas import MAX_ALSO, MAX_QUERY
from app.subjects.service import SubjectService

SCOPE_KEY = "lethe.mcp"  # what mount.py leaves in the request's ASGI scope: the container and the tenant
T = TypeVar("T")

Namespace = Annotated[str, Field(min_length=1, max_length=200, description="A memory namespace, e.g. user-42")]
Key = Annotated[str, Field(min_length=1, max_length=200, description="A key in the namespace")]
SessionId = Annotated[str, Field(min_length=1, max_length=64, description="The session (ses_...) to forget in")]
Strategy = Literal["selective_replay", "full_reset", "delete_dependents"]
SubjectId = Annotated[str, Field(min_length=1, max_length=200, pattern=SUBJECT_ID_PATTERN,
                                 description="A data subject: your id for the person (an account id, a customer "
                                 "number; letters, digits and ._:@+=-)")]
AlsoText = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=1000)]] | None,
    Field(max_length=MAX_ALSO, description="What the person said inside other people's sessions (a shared support "
          "session): each session holding one of these texts is forgotten of it by selective replay"),
]
AlsoQuery = Annotated[
    str | None,
    Field(min_length=1, max_length=MAX_QUERY, description="What the person said inside other people's sessions, by "
          "meaning: each session with an observation at least also_min_similarity similar to it is forgotten of "
          "every observation that similar, by selective replay"),
]
AlsoMinSimilarity = Annotated[
    float | None,
    Field(ge=-1.0, le=1.0, description=f"The cosine similarity also_query needs (default {DEFAULT_MIN_SIMILARITY}); "
          "only with also_query"),
]


@dataclass(frozen=True)
class Caller:
    container: Container
    tenant_id: str


def caller(ctx: Context) -> Caller:
    request = ctx.request_context.request
    found = getattr(request, "scope", {}).get(SCOPE_KEY)
    if not isinstance(found, Caller):  # mount.py authenticates every request before the transport sees it
        raise ToolError(json.dumps({"status": 401, "type": "unauthorized", "detail": "no tenant on this request"}))
    return found


async def answer(call: Awaitable[T]) -> T:
    """The service's answer, or its Lethe error as a tool error (module docstring)."""
    try:
        return await call
    except LetheError as error:
        raise tool_error(error) from None


def tool_error(error: LetheError) -> ToolError:
    return ToolError(json.dumps({"status": error.status, "type": error.type_slug, "detail": error.detail,
                                 **{k: v for k, v in error.extra.items() if _plain(v)}}))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def receipt_uri(job_id: str) -> str:
    return f"lethe://forget/{job_id}"


def job(view: JobView) -> dict[str, Any]:
    out: dict[str, Any] = job_out(view).model_dump(mode="json")
    if not view.dry_run:
        out["receipt_uri"] = receipt_uri(view.id)
    return out


def build() -> MCPServer:
    server = MCPServer(
        "lethe", title="Lethe: memory and forgetting",
        instructions="Versioned memory records with durable tombstones, and forgetting that leaves a session equal "
        "to the one that never saw what was forgotten. Read a key before writing it: a write names the version it "
        "read (0 for a new key). Plan a forget before confirming it.",
    )
    for tool in (memory_read, memory_write, memory_forget, memory_list, memory_history, forget_plan, forget_confirm,
                 subject_export, subject_erase_plan, subject_erase_confirm):
        server.add_tool(tool)
    server.resource("lethe://forget/{job_id}", name="forget-receipt", mime_type="application/json",
                    description="A forget job and its receipt")(forget_receipt)
    return server


async def memory_read(namespace: Namespace, key: Key, ctx: Context) -> dict[str, Any]:
    """Read a memory record: its value and version. A key never written, or forgotten, says so (with the version a
    write must name: 0, or the tombstone's to re-establish a forgotten key)."""
    who = caller(ctx)
    try:
        head = await who.container.services.memory.read(who.tenant_id, namespace, key)
    except Forgotten as forgotten:
        return {"namespace": namespace, "key": key, "exists": False, "forgotten": True,
                "version": forgotten.extra["version"]}
    except NotFound as missing:
        if missing.extra.get("version") != 0:
            raise tool_error(missing) from None
        return {"namespace": namespace, "key": key, "exists": False, "forgotten": False, "version": 0}
    except LetheError as error:
        raise tool_error(error) from None
    return {"namespace": namespace, "key": key, "exists": True, "value": head.value, "version": head.version,
            "source": head.source, "updated_at": head.updated_at.isoformat()}


async def memory_write(
    namespace: Namespace, key: Key, value: Any,
    base_version: Annotated[int, Field(ge=0, description="The version you read (0: the key was never written)")],
    ctx: Context, source: Annotated[str, Field(max_length=100)] = "agent",
) -> dict[str, Any]:
    """Write a memory record, conditionally: it lands only if `base_version` is still the newest version. A stale
    version is an error (status 412) with `current_version` and `forgotten`: read the key again and decide."""
    who = caller(ctx)
    written = await answer(who.container.services.memory.write(
        who.tenant_id, namespace, key, value=value, source=source, base_version=base_version,
    ))
    return {"namespace": namespace, "key": key, "version": written.version, "created": written.created}


async def memory_forget(namespace: Namespace, key: Key, ctx: Context) -> dict[str, Any]:
    """Forget a memory record: a tombstone version, every earlier value erased from history, and a forget job that
    replays every session the record was injected into (`forget_id`; its receipt is a resource)."""
    who = caller(ctx)
    done = await answer(who.container.services.memory.forget(who.tenant_id, namespace, key))
    out: dict[str, Any] = {"namespace": namespace, "key": key, "version": done.version, "forget_id": done.forget_id,
                           "already_forgotten": done.already_forgotten}
    if done.forget_id is not None:
        out["receipt_uri"] = receipt_uri(done.forget_id)
    return out


async def memory_list(
    namespace: Namespace, ctx: Context, cursor: Annotated[str | None, Field(max_length=400)] = None,
    limit: Annotated[int, Field(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    """The live keys of a namespace, a page at a time (`next_cursor` fetches the next page)."""
    who = caller(ctx)
    keys, next_cursor = await answer(who.container.services.memory.list_keys(
        who.tenant_id, namespace, cursor=cursor, limit=limit))
    return {"namespace": namespace, "keys": keys, "next_cursor": next_cursor}


async def memory_history(namespace: Namespace, key: Key, ctx: Context) -> dict[str, Any]:
    """A key's versions: writes and forgets; a value only for versions after the last forget (a forgotten value is
    erased everywhere, history included)."""
    who = caller(ctx)
    items = await answer(who.container.services.memory.history(who.tenant_id, namespace, key))
    return {"namespace": namespace, "key": key, "versions": [
        {"version": i.version, "op": i.op, "source": i.source, "at": i.at.isoformat(),
         **({"value": i.value} if i.op == "write" and not i.erased else {})}
        for i in items
    ]}


def _target(session_id: str, artifact_id: str | None, text: str | None) -> dict[str, Any]:
    if (artifact_id is None) == (text is None):
        raise ToolError(json.dumps({"status": 422, "type": "validation", "detail": "give exactly one of "
                                    "artifact_id and text"}))
    if artifact_id is not None:
        return {"artifact_id": artifact_id, "session_id": session_id}
    return {"session_id": session_id, "text": text}


async def _forget(
    ctx: Context, session_id: str, artifact_id: str | None, text: str | None, strategy: str, dry_run: bool,
    reason: str | None,
) -> dict[str, Any]:
    who = caller(ctx)
    submitted = Submission(target=_target(session_id, artifact_id, text), strategy=strategy, dry_run=dry_run,
                           wait=True, reason=reason)
    return job(await answer(who.container.services.forget.submit(who.tenant_id, submitted)))


async def forget_plan(
    session_id: SessionId, ctx: Context,
    artifact_id: Annotated[str | None, Field(max_length=64, description="An artifact (art_...) to forget")] = None,
    text: Annotated[str | None, Field(min_length=1, max_length=10_000, description="A text to remove from the "
                                      "session's observations")] = None,
    strategy: Strategy = "selective_replay",
) -> dict[str, Any]:
    """Plan a forget without doing it (a dry run): what would be removed and why (the trace), from which transition
    the session would be replayed, and what it would cost against a full reset. Nothing changes; confirm with
    forget_confirm and the same target."""
    return await _forget(ctx, session_id, artifact_id, text, strategy, True, None)


async def forget_confirm(
    session_id: SessionId, ctx: Context,
    artifact_id: Annotated[str | None, Field(max_length=64, description="An artifact (art_...) to forget")] = None,
    text: Annotated[str | None, Field(min_length=1, max_length=10_000, description="A text to remove from the "
                                      "session's observations")] = None,
    strategy: Strategy = "selective_replay",
    reason: Annotated[str | None, Field(max_length=500)] = None,
) -> dict[str, Any]:
    """Forget, for real: the session afterwards equals the one that never saw the target. Answers once the job ended
    (or, if it runs longer than the server's wait, as it stands: read its receipt resource later)."""
    return await _forget(ctx, session_id, artifact_id, text, strategy, False, reason)


async def _export(subjects: SubjectService, tenant_id: str, subject_id: str) -> dict[str, Any]:
    """The streamed document, gathered: a tool answers one JSON object (an unknown subject fails before any byte)."""
    chunks = await subjects.export(tenant_id, subject_id)
    document: dict[str, Any] = json.loads(b"".join([chunk async for chunk in chunks]))
    return document


async def subject_export(subject_id: SubjectId, ctx: Context) -> dict[str, Any]:
    """Everything held about a data subject (an access request): their sessions with each live artifact, their
    namespaces' live memory, and past forgets as ids and counts. Erased content is not held, so not in it."""
    who = caller(ctx)
    return await answer(_export(who.container.services.subjects, who.tenant_id, subject_id))


def _also_query(query: str | None, min_similarity: float | None) -> dict[str, Any]:
    if min_similarity is not None and query is None:
        raise tool_error(InvalidRequest("also_min_similarity applies only with also_query"))
    return {"query": query, "min_similarity": min_similarity}


async def subject_erase_plan(
    subject_id: SubjectId, ctx: Context, also_text: AlsoText = None, also_query: AlsoQuery = None,
    also_min_similarity: AlsoMinSimilarity = None,
) -> dict[str, Any]:
    """Plan a data subject's erasure without doing it (a dry run): the sessions that would be deleted whole, the
    namespaces whose live keys would be tombstoned, other sessions `also_text` or `also_query` reaches, and what a
    legal hold keeps out (`held`). Nothing changes; confirm with subject_erase_confirm."""
    query = _also_query(also_query, also_min_similarity)
    who = caller(ctx)
    plan = await answer(who.container.services.subject_erasure.plan(who.tenant_id, subject_id, also_text or [],
                                                                    **query))
    return plan.out().model_dump(mode="json")


async def subject_erase_confirm(
    subject_id: SubjectId, ctx: Context, also_text: AlsoText = None, also_query: AlsoQuery = None,
    also_min_similarity: AlsoMinSimilarity = None,
) -> dict[str, Any]:
    """Erase everything a data subject owns, for real: each of their sessions deleted whole, every live key of their
    namespaces tombstoned, and a forget queued in each other session `also_text` or `also_query` reaches; answers
    the forget job, once finished (or still `running` after the server's forget wait: its receipt is a resource
    to read again), whose `subject` names it all. A legal hold on the subject refuses it (status 409, type
    legal_hold, `hold_id`)."""
    query = _also_query(also_query, also_min_similarity)
    who = caller(ctx)
    erasure = who.container.services.subject_erasure
    return job(await answer(erasure.submit(who.tenant_id, subject_id, also_text or [], **query)))


async def forget_receipt(job_id: str, ctx: Context) -> str:
    who = caller(ctx)
    try:
        view = await who.container.services.forget.get(who.tenant_id, job_id)
    except LetheError as error:
        raise ResourceError(error.detail) from None
    return json.dumps(job(view))

