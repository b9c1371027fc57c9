"""The asyncpg pools of the memory hot path (`Database.pg`), on the primary and on each replica alike."""

from __future__ import annotations

import json

import asyncpg

APPLICATION_NAME = "lethe"  # how the service's connections show in pg_stat_activity


async def open_pg_pool(
    url: str, size: int, *, min_size: int = 1, connect_timeout_s: float = 60.0,
    connection_class: type[asyncpg.Connection] = asyncpg.Connection,
) -> asyncpg.Pool:
    """`min_size=0` connects on first use only (a replica that is down at start costs nothing until a read needs it);
    `connect_timeout_s` bounds each connection attempt."""
    return await asyncpg.create_pool(
        url, min_size=min_size, max_size=size, init=_jsonb_as_json, timeout=connect_timeout_s,
        connection_class=connection_class,
        server_settings={"application_name": APPLICATION_NAME},
        # A release would otherwise also reset session state (RESET ALL, UNLISTEN, ...): a round trip per request
        # for state these statements never set. An open transaction is still rolled back.
        reset=_nothing_to_reset,
    )


async def _jsonb_as_json(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _nothing_to_reset(connection: asyncpg.Connection) -> None:
    return None
