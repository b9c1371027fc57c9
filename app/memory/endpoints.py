"""Memory records with versioned tombstones: HTTP in and out; the rules live in app/memory/service.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Response
from starlette.convertors import StringConvertor, register_url_convertor

from app.keys.shred import SHRED_DOC, Shred
from app.memory.catalog import MemoryCatalog
from app.memory.repositories.values import LiveRecord
from app.memory.schemas import (
    KEY_PATTERN,
    NAMESPACE_PATTERN,
    SOURCE_PATTERN,
    BatchOut,
    BatchRequest,
    BatchResult,
    HistoryEntry,
    HistoryOut,
    KeyList,
    MemoryForgetOut,
    MemoryRecordOut,
    MemoryWrite,
    MemoryWriteOut,
    NamespaceList,
    NamespaceOut,
    SearchItemOut,
    SearchOut,
    SearchRequest,
)
from app.memory.search import MemorySearch, SearchQuery
from app.memory.service import MAX_VALUES_PAGE, MemoryService, WriteOutcome, WriteRequest
from app.memory.validation import base_version_from_headers, etag
from app.web.consistency import ReadFromDep, stamp, token_responses
from app.web.deps import ContainerDep, PrincipalDep
from app.web.openapi import link
from app.web.params import Cursor
from app.web.problems import problem_doc

router = APIRouter(prefix="/v1/memory", tags=["memory"])


class NamespaceSegment(StringConvertor):
    """A path segment `GET /v1/memory/{namespace}` serves: anything but `<name>:batch`, the batch route's path, so
    another method on it answers 405 (Allow: POST) rather than a 422 for a namespace holding ':'."""

    regex = r"(?![^/]*:batch$)[^/]+"


register_url_convertor("memory_namespace", NamespaceSegment())



STALE: dict[int | str, dict[str, Any]] = {
    412: problem_doc("Stale version: `current_version` and `forgotten` say where the key stands"),
}
PRECONDITIONS: dict[int | str, dict[str, Any]] = {
    **STALE, 428: problem_doc("PUT without If-Match or If-None-Match, or with `If-Match: *`"),
}
# Values are sealed at rest: a write (or a read) that needs a key this process has not cached while the key provider
# is down answers this, with Retry-After, and writes nothing.
KEYS_DOWN: dict[int | str, dict[str, Any]] = {
    503: problem_doc(
        "The database connection was lost, or the key provider is unreachable (`keys-unavailable`): nothing was "
        "written; retry (Retry-After)"
    ),
}
# An ETag (the version, quoted, maybe weak) or `*`; both headers at once answer 422 (app/memory/validation.py).
IF_MATCH_PATTERN = r'^(\*|(W/)?"?[0-9]{1,18}"?)$'

Namespace = Annotated[str, Path(min_length=1, max_length=200, pattern=NAMESPACE_PATTERN)]
Key = Annotated[str, Path(min_length=1, max_length=200, pattern=KEY_PATTERN)]


async def get_memory(container: ContainerDep) -> MemoryService:
    return container.services.memory


MemoryDep = Annotated[MemoryService, Depends(get_memory)]


@router.post(
    "/{namespace}:batch", response_model=BatchOut, summary="Batch of conditional writes",
    responses={**STALE, **KEYS_DOWN, **token_responses(200)},
)
async def batch_write(
    namespace: Namespace, body: BatchRequest, principal: PrincipalDep, memory: MemoryDep, container: ContainerDep,
    response: Response,
) -> BatchOut:
    writes = [
        WriteRequest(key=w.key, value=w.value, base_version=w.base_version, source=w.source, ttl_s=w.ttl_s)
        for w in body.writes
    ]
    outcomes = await memory.batch(principal.tenant_id, namespace, writes, atomic=body.atomic)
    await stamp(response, container.db)
    results = [
        BatchResult(key=o.key, status=201 if o.created else 200, version=o.version, current_version=o.version)
        if isinstance(o, WriteOutcome)
        else BatchResult(key=o.key, status=412, current_version=o.current_version, forgotten=o.forgotten)
        for o in outcomes
    ]
    return BatchOut(results=results)


async def get_search(container: ContainerDep) -> MemorySearch:
    return container.services.memory_search


SearchDep = Annotated[MemorySearch, Depends(get_search)]


# `/v1/memory:search`, beside the collection (not under it): a namespace may be called "search".
@router.post(":search", response_model=SearchOut, summary="Search the tenant's live records under a namespace prefix")
async def search_records(body: SearchRequest, principal: PrincipalDep, search: SearchDep) -> SearchOut:
    query = SearchQuery(
        prefix=body.namespace_prefix, query=body.query, fields=body.fields, filter=body.filter, limit=body.limit,
        offset=body.offset, refresh_ttl=body.refresh_ttl,
    )
    hits = await search.search(principal.tenant_id, query)
    return SearchOut(
        items=[
            SearchItemOut(
                namespace=h.namespace, key=h.key, value=h.value, version=h.version, updated_at=h.updated_at,
                score=h.score, created_at=h.created_at, expires_at=h.expires_at,
            )
            for h in hits
        ]
    )


async def get_catalog(container: ContainerDep) -> MemoryCatalog:
    return container.services.memory_catalog


CatalogDep = Annotated[MemoryCatalog, Depends(get_catalog)]
Limit = Annotated[int, Query(ge=1, le=1000)]


@router.get("", response_model=NamespaceList, summary="The tenant's namespaces with key counts, in name order")
async def list_namespaces(
    principal: PrincipalDep, catalog: CatalogDep, where: ReadFromDep, limit: Limit = 100, cursor: Cursor = None
) -> NamespaceList:
    rows, next_cursor = await catalog.page_namespaces(principal.tenant_id, cursor=cursor, limit=limit, where=where)
    return NamespaceList(
        namespaces=[
            NamespaceOut(namespace=r.namespace, live_keys=r.live_keys, forgotten_keys=r.forgotten_keys,
                         updated_at=r.updated_at)
            for r in rows
        ],
        next_cursor=next_cursor,
    )


def _record_out(namespace: str, r: LiveRecord) -> MemoryRecordOut:
    return MemoryRecordOut(namespace=namespace, key=r.key, value=r.value, version=r.version, source=r.source,
                           updated_at=r.updated_at, created_at=r.created_at, expires_at=r.expires_at)


# exclude_unset: without include_forgotten the page keeps its original shape (no empty `forgotten`).
@router.get(
    "/{namespace:memory_namespace}", response_model=KeyList, response_model_exclude_unset=True,
    summary="Live keys of a namespace",
)
async def list_keys(
    namespace: Namespace,
    principal: PrincipalDep,
    memory: MemoryDep,
    catalog: CatalogDep,
    where: ReadFromDep,
    limit: Limit = 100,
    cursor: Cursor = None,
    include_forgotten: Annotated[
        bool, Query(description="Also list tombstoned keys (their names, never a value), named in `forgotten`")
    ] = False,
    values: Annotated[
        bool, Query(description=f"Also answer each live record with its value in `records` (then at most "
                    f"{MAX_VALUES_PAGE} keys a page, whatever `limit` asks)")
    ] = False,
) -> KeyList:
    if include_forgotten:
        size = min(limit, MAX_VALUES_PAGE) if values else limit
        rows, after = await catalog.page_keys(principal.tenant_id, namespace, cursor=cursor, limit=size, where=where)
        forgotten = [r.key for r in rows if r.forgotten]
        if not values:
            return KeyList(keys=[r.key for r in rows], next_cursor=after, forgotten=forgotten)
        live = await memory.records_of(principal.tenant_id, namespace, [r.key for r in rows if not r.forgotten],
                                       where=where)
        return KeyList(keys=[r.key for r in rows], next_cursor=after, forgotten=forgotten,
                       records=[_record_out(namespace, r) for r in live])
    if values:
        found, next_cursor = await memory.list_records(
            principal.tenant_id, namespace, cursor=cursor, limit=limit, where=where
        )
        return KeyList(keys=[r.key for r in found], next_cursor=next_cursor,
                       records=[_record_out(namespace, r) for r in found])
    keys, next_cursor = await memory.list_keys(principal.tenant_id, namespace, cursor=cursor, limit=limit, where=where)
    return KeyList(keys=keys, next_cursor=next_cursor)


@router.get("/{namespace}/{key}", response_model=MemoryRecordOut, summary="Read a record")
async def read_record(
    namespace: Namespace, key: Key, principal: PrincipalDep, memory: MemoryDep, response: Response, where: ReadFromDep,
    refresh_ttl: Annotated[bool, Query(description="Restart the record's time to live (if it has one)")] = False,
) -> MemoryRecordOut:
    head = await memory.read(principal.tenant_id, namespace, key, where=where, refresh_ttl=refresh_ttl)
    response.headers["ETag"] = etag(head.version)
    return MemoryRecordOut(
        namespace=namespace,
        key=key,
        value=head.value,
        version=head.version,
        source=head.source,
        updated_at=head.updated_at,
        created_at=head.created_at,
        expires_at=head.expires_at,
    )


RECORD = {"namespace": "$request.path.namespace", "key": "$request.path.key"}
RECORD_LINKS = {
    "ReadRecord": link("read_record_v1_memory__namespace___key__get", "Read it", **RECORD),
    "RecordHistory": link("record_history_v1_memory__namespace___key__history_get", "Its versions", **RECORD),
    "ForgetRecord": link("forget_record_v1_memory__namespace___key__delete", "Forget it", **RECORD),
}


@router.put(
    "/{namespace}/{key}", response_model=MemoryWriteOut, summary="Conditional write",
    responses={
        **PRECONDITIONS,
        **KEYS_DOWN,
        200: {"description": "Written over the version If-Match named", "links": RECORD_LINKS,
              **token_responses(200)[200]},
        201: {"model": MemoryWriteOut, "description": "Created", "links": RECORD_LINKS, **token_responses(201)[201]},
    },
)
async def write_record(
    namespace: Namespace,
    key: Key,
    body: MemoryWrite,
    principal: PrincipalDep,
    memory: MemoryDep,
    container: ContainerDep,
    response: Response,
    if_match: Annotated[
        str | None,
        Header(
            pattern=IF_MATCH_PATTERN,
            description='"<version you read>"; the tombstone version re-establishes a forgotten key (`*` answers 428)',
        ),
    ] = None,
    if_none_match: Annotated[Literal["*"] | None, Header(description="* creates a key that was never written")] = None,
) -> MemoryWriteOut:
    base = base_version_from_headers(if_match, if_none_match)
    outcome = await memory.write(
        principal.tenant_id, namespace, key, value=body.value, source=body.source, base_version=base, ttl_s=body.ttl_s
    )
    response.status_code = 201 if outcome.created else 200
    response.headers["ETag"] = etag(outcome.version)
    await stamp(response, container.db)
    return MemoryWriteOut(
        namespace=namespace, key=key, version=outcome.version, created=outcome.created, updated_at=outcome.updated_at
    )


@router.delete(
    "/{namespace}/{key}", response_model=MemoryForgetOut, summary="Forget: write a tombstone",
    responses={409: problem_doc("The key kept changing while it was being forgotten: retry; or `legal_hold`: a "
                                "standing legal hold covers the namespace (`hold_id` names the hold)"),
               503: problem_doc("`keys-unavailable` (with `Retry-After`): `shred=now` and the key provider does not "
                                "answer, so nothing was written; or it refused the shred after the tombstone "
                                "committed: the key is forgotten and `forget_id` names the job that completes the "
                                "shred within the erasure horizon"),
               **token_responses(200)},
)
async def forget_record(
    namespace: Namespace,
    key: Key,
    principal: PrincipalDep,
    memory: MemoryDep,
    container: ContainerDep,
    response: Response,
    source: Annotated[
        str,
        Query(
            min_length=1,
            max_length=100,
            pattern=SOURCE_PATTERN,
            description="Recorded on the tombstone's history entry",
        ),
    ] = "user",
    shred: Annotated[Shred, Query(description=SHRED_DOC)] = "horizon",
) -> MemoryForgetOut:
    outcome = await memory.forget(principal.tenant_id, namespace, key, source=source, shred_now=shred == "now")
    if outcome.forget_id is not None:
        container.forget_wake.set()  # this process's worker starts the cascade now
    response.headers["ETag"] = etag(outcome.version)
    await stamp(response, container.db)
    return MemoryForgetOut(
        version=outcome.version, forget_id=outcome.forget_id, already_forgotten=outcome.already_forgotten
    )


@router.get("/{namespace}/{key}/history", response_model=HistoryOut, summary="Versions without forgotten values")
async def record_history(
    namespace: Namespace, key: Key, principal: PrincipalDep, memory: MemoryDep, where: ReadFromDep
) -> HistoryOut:
    items = await memory.history(principal.tenant_id, namespace, key, where=where)
    return HistoryOut(
        versions=[
            HistoryEntry(version=i.version, op=i.op, source=i.source, at=i.at, value=i.value, erased=i.erased)
            for i in items
        ]
    )
