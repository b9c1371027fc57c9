"""SQL statements written once and run two ways: inside a SQLAlchemy unit of work, or straight on asyncpg.

The memory API's hot path is one or two statements per request; run through the ORM session each cost more Python
than the database spent on it (py-spy under bench.memory_bench: the session, its transaction bookkeeping and
statement compilation were about a third of the server's CPU). So those requests run their statements on a plain
asyncpg pool (`Database.pg`), while the same statements still take part in a caller's ORM transaction where one is
open (a forget job tombstoning a record atomically with the session it rebuilt). A `Statement` holds the text once,
with `:name` parameters, and renders it for both; a repository function takes `Sql`, either side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from json import dumps
from typing import Any, Protocol

import asyncpg
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.expression import Executable

_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_ROWCOUNT = re.compile(r"(\d+)$")

Row = Mapping[Any, Any]  # SQLAlchemy's RowMapping or an asyncpg Record: columns by name


class Statement:
    """One statement with `:name` parameters; `json` names the JSONB parameters and result columns (both sides
    encode and decode them with the same json module, so a value reads back the same whichever way it was written)."""

    def __init__(self, sql: str, *, json: Sequence[str] = ()) -> None:
        self.sql = sql
        self.names: list[str] = list(dict.fromkeys(_PARAM.findall(sql)))
        params = [bindparam(name, type_=JSONB) for name in json if name in self.names]
        clause = text(sql).bindparams(*params)
        columns = {name: JSONB for name in json if name not in self.names}
        self.clause: Executable = clause.columns(**columns) if columns else clause
        # asyncpg side: a JSONB parameter travels as its JSON text, so Python None is JSON null on both sides
        # (SQLAlchemy's JSONB type stores None as JSON null, not SQL NULL)
        self._json_params = {name for name in json if name in self.names}

        def placeholder(match: re.Match[str]) -> str:
            name = match.group(1)
            cast = "::text::jsonb" if name in self._json_params else ""
            return f"${self.names.index(name) + 1}{cast}"

        self.dollar = _PARAM.sub(placeholder, sql)

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        return [dumps(params[name]) if name in self._json_params else params[name] for name in self.names]


class Sql(Protocol):
    """Where a repository function runs its statements."""

    async def one(self, statement: Statement, params: Mapping[str, Any]) -> Row | None: ...

    async def all(self, statement: Statement, params: Mapping[str, Any]) -> list[Row]: ...

    async def rowcount(self, statement: Statement, params: Mapping[str, Any]) -> int: ...


class InSession:
    """Statements in an ORM session's transaction."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def one(self, statement: Statement, params: Mapping[str, Any]) -> Row | None:
        row = (await self.session.execute(statement.clause, dict(params))).one_or_none()
        return None if row is None else row._mapping

    async def all(self, statement: Statement, params: Mapping[str, Any]) -> list[Row]:
        return [row._mapping for row in await self.session.execute(statement.clause, dict(params))]

    async def rowcount(self, statement: Statement, params: Mapping[str, Any]) -> int:
        result = await self.session.execute(statement.clause, dict(params))
        return int(result.rowcount)  # type: ignore[attr-defined]


class OnConnection:
    """Statements on a plain asyncpg connection (prepared and cached by asyncpg, no ORM in between)."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self.connection = connection

    async def one(self, statement: Statement, params: Mapping[str, Any]) -> Row | None:
        row: Row | None = await self.connection.fetchrow(statement.dollar, *statement.args(params))
        return row

    async def all(self, statement: Statement, params: Mapping[str, Any]) -> list[Row]:
        return list(await self.connection.fetch(statement.dollar, *statement.args(params)))

    async def rowcount(self, statement: Statement, params: Mapping[str, Any]) -> int:
        status: str = await self.connection.execute(statement.dollar, *statement.args(params))
        found = _ROWCOUNT.search(status)  # "UPDATE 3"
        return int(found.group(1)) if found else 0
