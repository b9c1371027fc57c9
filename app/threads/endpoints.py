"""LangGraph threads (checkpoints, blobs, pending writes): HTTP in and out; the rules live in app/threads/service.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import BaseModel

from app.threads.schemas import (
    CHECKPOINT_ID_PATTERN,
    TEXT_PATTERN,
    THREAD_ID_PATTERN,
    CheckpointOut,
    CheckpointPage,
    CopyIn,
    CopyOut,
    DeletedOut,
    DeleteOut,
    PruneIn,
    PutCheckpoint,
    PutOut,
    PutWrites,
    PutWritesOut,
    RewriteIn,
    RewriteOut,
    RunsIn,
    ThreadValues,
)
from app.threads.service import ThreadService
from app.web.deps import ContainerDep, PrincipalDep
from app.web.params import Cursor
from app.web.problems import problem_doc

router = APIRouter(prefix="/v1/threads", tags=["threads"])

ThreadId = Annotated[str, Path(min_length=1, max_length=200, pattern=THREAD_ID_PATTERN)]
CheckpointId = Annotated[str, Path(min_length=1, max_length=200, pattern=CHECKPOINT_ID_PATTERN)]
NamespaceQuery = Annotated[str, Query(max_length=500, pattern=TEXT_PATTERN, description="The checkpoint namespace")]
Limit = Annotated[int, Query(ge=1, le=1000)]

DELETED: dict[int | str, dict[str, Any]] = {
    412: problem_doc("`thread-deleted`: the checkpoint, or the one it follows, was deleted; `thread-rewritten`: the "
                     "thread was rewritten (forget_message) after this write's base was read"),
    413: problem_doc("The checkpoint's or the writes' bytes are over LETHE_THREAD_MAX_CHECKPOINT_BYTES"),
}


def _json(model: BaseModel) -> Response:
    """The answer serialized once by its own model: the hot routes (a LangGraph run's put and get_tuple) skip
    FastAPI's second validation and encoding pass; `response_model` still documents the shape."""
    return Response(model.model_dump_json(), media_type="application/json")


async def get_threads(container: ContainerDep) -> ThreadService:
    return container.services.threads


ThreadsDep = Annotated[ThreadService, Depends(get_threads)]


@dataclass(frozen=True)
class PageQuery:
    """A checkpoint listing's query, one thread's or the tenant's."""

    checkpoint_ns: str | None
    before: str | None
    metadata: str | None
    limit: int
    cursor: str | None


async def page_query(
    checkpoint_ns: Annotated[str | None, Query(
        max_length=500, pattern=TEXT_PATTERN, description="Only this namespace; absent: every namespace"
    )] = None,
    before: Annotated[str | None, Query(
        min_length=1, max_length=200, pattern=CHECKPOINT_ID_PATTERN, description="Only checkpoints older than this id"
    )] = None,
    metadata: Annotated[str | None, Query(max_length=10_000, include_in_schema=False)] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> PageQuery:
    # `async def` on purpose, as app/web/deps.py's: FastAPI runs a plain `def` dependency in its thread pool, a thread
    # hop on every listing (get_tuple of a thread's latest checkpoint is one).
    return PageQuery(checkpoint_ns, before, metadata, limit, cursor)


PageDep = Annotated[PageQuery, Depends(page_query)]


@router.post(":delete_for_runs", response_model=DeletedOut, summary="Delete every checkpoint of these runs")
async def delete_for_runs(body: RunsIn, principal: PrincipalDep, threads: ThreadsDep) -> DeletedOut:
    return await threads.delete_for_runs(principal.tenant_id, body.run_ids)


@router.post(":prune", response_model=DeletedOut, summary="Keep only each namespace's latest checkpoint, or none")
async def prune(body: PruneIn, principal: PrincipalDep, threads: ThreadsDep) -> DeletedOut:
    return await threads.prune(principal.tenant_id, body.thread_ids, body.strategy)


@router.put(
    "/{thread_id}/checkpoints/{checkpoint_id}", response_model=PutOut, summary="Store a checkpoint", responses=DELETED,
)
async def put_checkpoint(
    thread_id: ThreadId, checkpoint_id: CheckpointId, body: PutCheckpoint, principal: PrincipalDep,
    threads: ThreadsDep,
) -> Response:
    return _json(await threads.put(principal.tenant_id, thread_id, checkpoint_id, body))


@router.post(
    "/{thread_id}/checkpoints/{checkpoint_id}/writes", response_model=PutWritesOut,
    summary="Store a task's pending writes", responses=DELETED,
)
async def put_writes(
    thread_id: ThreadId, checkpoint_id: CheckpointId, body: PutWrites, principal: PrincipalDep, threads: ThreadsDep,
) -> Response:
    return _json(await threads.put_writes(principal.tenant_id, thread_id, checkpoint_id, body))


@router.get("/{thread_id}/checkpoints/{checkpoint_id}", response_model=CheckpointOut, summary="Read a checkpoint")
async def get_checkpoint(
    thread_id: ThreadId, checkpoint_id: CheckpointId, principal: PrincipalDep, threads: ThreadsDep,
    checkpoint_ns: NamespaceQuery = "",
) -> Response:
    return _json(await threads.get(principal.tenant_id, thread_id, checkpoint_ns, checkpoint_id))


# The `metadata` filter is a JSON object in the query string: declared with its media type, so the contract says
# which strings are accepted (FastAPI declares a query parameter by a schema only).
METADATA_FILTER = {
    "name": "metadata", "in": "query", "required": False,
    "description": 'A JSON object: only checkpoints whose metadata holds it ({"source": "loop"}); at most 10000 '
                   "characters",
    "content": {"application/json": {"schema": {"type": "object"}}},
}


@router.get(
    ":checkpoints", response_model=CheckpointPage,
    summary="Every thread's checkpoints, newest first (LangGraph's list without a thread)",
    openapi_extra={"parameters": [METADATA_FILTER]},
)
async def list_tenant_checkpoints(principal: PrincipalDep, threads: ThreadsDep, page: PageDep) -> Response:
    return _json(await threads.tenant_page(principal.tenant_id, **vars(page)))


@router.get(
    "/{thread_id}/checkpoints", response_model=CheckpointPage, summary="A thread's checkpoints, newest first",
    openapi_extra={"parameters": [METADATA_FILTER]},
)
async def list_checkpoints(
    thread_id: ThreadId, principal: PrincipalDep, threads: ThreadsDep, page: PageDep
) -> Response:
    return _json(await threads.page(principal.tenant_id, thread_id, **vars(page)))


@router.delete("/{thread_id}", response_model=DeleteOut, summary="Delete a thread, durably")
async def delete_thread(thread_id: ThreadId, principal: PrincipalDep, threads: ThreadsDep) -> DeleteOut:
    return await threads.delete(principal.tenant_id, thread_id)


@router.post(
    "/{thread_id}/copy", response_model=CopyOut, summary="Copy a thread's checkpoints and writes to another thread",
    responses={
        409: problem_doc("`target_thread_id` is the thread itself"),
        412: problem_doc("Some of these checkpoints were deleted from the target thread before"),
    },
)
async def copy_thread(thread_id: ThreadId, body: CopyIn, principal: PrincipalDep, threads: ThreadsDep) -> CopyOut:
    return await threads.copy(principal.tenant_id, thread_id, body.target_thread_id)


@router.get("/{thread_id}/values", response_model=ThreadValues, summary="Every serialized value of a thread")
async def thread_values(thread_id: ThreadId, principal: PrincipalDep, threads: ThreadsDep) -> ThreadValues:
    return await threads.values(principal.tenant_id, thread_id)


@router.post(
    "/{thread_id}/rewrite", response_model=RewriteOut, summary="Replace serialized values, atomically",
    responses={412: problem_doc("`thread-changed`: the thread was written since `revision`")},
)
async def rewrite_thread(
    thread_id: ThreadId, body: RewriteIn, principal: PrincipalDep, threads: ThreadsDep,
) -> RewriteOut:
    return await threads.rewrite(principal.tenant_id, thread_id, body)
