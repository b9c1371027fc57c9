"""`Lethe-Consistency` over HTTP: the token a write's answer carries, and the one a read may send back.

One mechanism for every write: the route calls `stamp` once its work is durable (a memory write or forget has
committed, a turn has committed, a forget job has succeeded), and the primary's position read *then* is at or past
every commit the request made or saw, so a read carrying it is served only by a replica that has replayed all of it
(app/db/replicas.py). A streamed turn carries none: its headers leave before the turn commits.

A read's token is parsed by `read_from`; a malformed one answers 422 rather than being ignored, which would silently
turn a read-your-forgets read into an eventually consistent one.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, Header, Response

from app.db.consistency import HEADER, TOKEN_PATTERN, ConsistencyToken, ReadFrom, replica_after
from app.db.database import Database
from app.errors import InvalidRequest
from app.web.deps import PrincipalDep

log = logging.getLogger(__name__)

_TOKEN_SCHEMA = {"type": "string", "pattern": TOKEN_PATTERN, "example": "v16b11e6a2e4b1a0c9000000010000000003017a58"}
TOKEN_HEADER: dict[str, Any] = {
    HEADER: {
        "description": "The primary's WAL position once this write was durable, tagged with the cluster and "
        "timeline: send it back on reads to never see an older state (the Python client does so by itself).",
        "schema": _TOKEN_SCHEMA,
    }
}


def token_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries saying that answers with these statuses carry the token (merged into a route's)."""
    return {status: {"headers": TOKEN_HEADER} for status in statuses}


async def read_from(
    principal: PrincipalDep,  # authentication answers first: a caller without a key learns nothing about its token
    token: Annotated[
        str | None,
        Header(
            alias=HEADER, pattern=TOKEN_PATTERN,
            description="A token from an earlier answer: the read is served by a replica only once it has replayed "
            "past it, else by the primary. Without one, any replica may serve the read (eventually consistent). "
            "A malformed token answers 422.",
        ),
    ] = None,
) -> ReadFrom:
    """Where a read that a replica may serve can go, as the request's token allows."""
    if token is None:
        return replica_after(None)
    try:
        return replica_after(ConsistencyToken.parse(token))
    except ValueError:  # the header's pattern lets only tokens through; this keeps the rule here too
        raise InvalidRequest(f"{HEADER} is not a token this service hands out", header=HEADER) from None


ReadFromDep = Annotated[ReadFrom, Depends(read_from)]


async def stamp(response: Response, db: Database) -> None:
    """Give the answer the primary's position now (call once the request's writes are durable)."""
    try:
        response.headers[HEADER] = (await db.consistency_token()).encode()
    except Exception as exc:  # the write stands; its answer only lacks the token (the client keeps its older one)
        log.warning("no consistency token for this answer", extra={"error": type(exc).__name__})

