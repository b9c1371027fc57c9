"""Where a response runs: which session, with which observations, continuing which transition.

- `conversation`: the conversation's session, from its end.
- `previous_response_id`: that response's session from its end when the response is still the newest transition;
  otherwise a branch holding the transitions up to that response (app/sessions/branching.py), so the client gets
  the conversation as it stood there, and the session keeps what came after.
- neither: the input alone. Leading system/developer messages are the system prompt (after `instructions`, when
  both are given); a resent history is matched to the session that holds it (history.py); anything else opens a
  session for this response.

A session's system prompt and tools are part of its prompt from transition 0, so `instructions` and `tools`
configure a session while it has no transition yet (the empty session is replaced), and must match it afterwards
(400 naming the parameter otherwise); omitted, the session's stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.models import AgentSession
from app.db.statements import InSession
from app.errors import Conflict
from app.holds import repository as holds_repo
from app.keys.content import Sealer
from app.openai_compat import history
from app.openai_compat import repository as repo
from app.openai_compat.errors import BadParameter
from app.openai_compat.items import observations, split_system
from app.openai_compat.schemas import ResponseCreate
from app.openai_compat.subjects import subject_of
from app.runtime.blocks import Observation
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.service import SessionService
from app.sessions.views import SessionConfig


@dataclass(frozen=True)
class Placement:
    session_id: str  # the session to run in, or to branch from (`branch_turn`)
    observations: list[Observation]
    expect_turns: int | None  # the transition count the session must still have (None: any)
    conversation_id: str | None
    owned: bool  # opened for this response: deleted again if the turn fails
    branch_turn: int | None = None  # run in a new branch holding the session's transitions ≤ this one
    branch_epoch: int | None = None  # the source's epoch the branch was planned against


class Placer:
    def __init__(self, db: Database, sessions: SessionService) -> None:
        self.db = db
        self.sessions = sessions

    async def place(
        self, tenant_id: str, body: ResponseCreate, tools: list[dict[str, Any]] | None,
        conversation: tuple[AgentSession, str] | None, previous: tuple[AgentSession, int, str | None] | None,
    ) -> Placement:
        """`conversation`: its (session, id); `previous`: the previous response's (session, transition,
        conversation)."""
        if conversation is not None:
            return await self._continue(tenant_id, conversation[0], body, tools, _input(body.input), conversation[1])
        if previous is not None:
            session, turn, previous_conversation = previous
            observed = _input(body.input)
            if session.turns == turn:
                return await self._continue(tenant_id, session, body, tools, observed, previous_conversation)
            self._check_same(session, body.instructions, tools)
            return Placement(session.id, observed, turn, None, True, branch_turn=turn)
        return await self._from_input(tenant_id, body, tools)

    async def _continue(
        self, tenant_id: str, session: AgentSession, body: ResponseCreate, tools: list[dict[str, Any]] | None,
        observed: list[Observation], conversation_id: str | None,
    ) -> Placement:
        session_id = await self.configure(tenant_id, session, conversation_id, body.instructions, tools)
        expect = session.turns if body.previous_response_id is not None else None
        return Placement(session_id, observed, expect, conversation_id, False)

    async def _from_input(self, tenant_id: str, body: ResponseCreate, tools: list[dict[str, Any]] | None) -> Placement:
        value = body.input
        if value is None or value == [] or value == "":
            raise BadParameter("input", "input is required: a string or a list of items")
        if isinstance(value, str):
            items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": value}]
            system, offset = body.instructions, 0
        else:
            leading, items = split_system(value, "input")
            system = "\n\n".join(s for s in (body.instructions, leading) if s is not None) or None
            offset = len(value) - len(items)
        given = history.given(items, "input", offset)
        end = history.history_end(given)
        if end == 0:
            observed = observations(items, "input", offset)
            if not observed:
                raise BadParameter("input", "input holds no user message or function_call_output to answer")
            subject = subject_of(safety_identifier=body.safety_identifier, user=body.user)
            view = await self.sessions.create(
                tenant_id, SessionConfig(system_prompt=system, tools=tools or [], subject_id=subject)
            )
            return Placement(view.row.id, observed, 0, None, True)
        return await self._resent(tenant_id, given[:end], items[end:], given[end:], system, tools, offset + end)

    async def _resent(
        self, tenant_id: str, past: list[history.Given], new_items: list[dict[str, Any]], new: list[history.Given],
        system: str | None, tools: list[dict[str, Any]] | None, offset: int,
    ) -> Placement:
        held: list[history.Held] = []
        async with self.db.transaction() as tx:
            session = await holder(tx, self.sessions.sealer, tenant_id, past)
            if session is not None:
                held = history.held(await artifacts_repo.list_live(tx, self.sessions.sealer, tenant_id, session.id))
        found = None if session is None else history.match(past, held)
        if session is None or found is None:
            at = past[-1].index
            raise BadParameter(
                f"input[{at}]", "this history holds model items that no session of yours holds in this order (not "
                "sampled here, or forgotten since): Lethe continues only histories whose replies it sampled; resend "
                "them with their ids as this server gave them",
            )
        self._check_same(session, system, tools)
        observed = observations(new_items, "input", offset)
        if not found.rest:
            return Placement(session.id, observed, session.turns, None, False)
        if history.already_added(new, found.rest):
            return Placement(session.id, [], session.turns, None, False)
        return Placement(session.id, observed, found.turn, None, True, branch_turn=found.turn,
                         branch_epoch=session.epoch)

    def _check_same(self, session: AgentSession, system: str | None, tools: list[dict[str, Any]] | None) -> None:
        """A session that has transitions keeps its system prompt and tools (a branch copies them)."""
        if system is not None and system != session.system_prompt:
            raise _differs("instructions")
        if tools is not None and tools != session.tools:
            raise _differs("tools")

    async def configure(
        self, tenant_id: str, session: AgentSession, conversation_id: str | None, instructions: str | None,
        tools: list[dict[str, Any]] | None,
    ) -> str:
        """The session that serves a response with these instructions and tools (see the module docstring)."""
        system = session.system_prompt if instructions is None else instructions
        wanted = session.tools if tools is None else tools
        if system == session.system_prompt and wanted == session.tools:
            return session.id
        if session.turns > 0:
            raise _differs("instructions" if system != session.system_prompt else "tools")
        fresh = await self.sessions.create(
            tenant_id, SessionConfig(system_prompt=system, tools=wanted, sampling=dict(session.sampling),
                                     subject_id=session.subject_id),
        )
        if conversation_id is not None:
            async with self.db.transaction() as tx:
                conv = await repo.conversation(tx, self.sessions.sealer, tenant_id, conversation_id, for_update=True)
                moved = conv is None or conv.session_id != session.id
                if not moved:
                    await repo.set_session(tx, conversation_id, fresh.row.id)
                    await holds_repo.move_session(InSession(tx), tenant_id, session.id, fresh.row.id)
            if moved:
                await self.sessions.delete(tenant_id, fresh.row.id)
                raise Conflict("the conversation was reconfigured by another request; retry")
        await self.sessions.delete(tenant_id, session.id)
        return fresh.row.id


async def holder(
    tx: AsyncSession, sealer: Sealer, tenant_id: str, items: Sequence[history.Given]
) -> AgentSession | None:
    """The session items came from: by an id they echo, else by the head digest of their content (history.py)."""
    anchor = history.anchor(items)
    if anchor is not None:
        row = await artifacts_repo.find(tx, sealer, tenant_id, anchor)
        return None if row is None else await sessions_repo.get(tx, sealer, tenant_id, row.session_id)
    return await by_digest(tx, sealer, tenant_id, [g.canon for g in items])


async def by_digest(
    tx: AsyncSession, sealer: Sealer, tenant_id: str, canons: Sequence[history.Canon | None]
) -> AgentSession | None:
    key = history.digest(canons)
    head = None if key is None else await repo.head(tx, tenant_id, key)
    session = None if head is None else await sessions_repo.get(tx, sealer, tenant_id, head.session_id)
    return session if session is not None and head is not None and session.epoch == head.epoch else None


async def put_head(
    tx: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str, turn: int, epoch: int, reply_id: str
) -> None:
    """The head a response leaves: the digest of its session's items through its transition (history.py)."""
    live = await artifacts_repo.list_live(tx, sealer, tenant_id, session_id)
    items = [h for h in history.held(live) if h.turn <= turn]
    key = history.digest([h.canon for h in items])
    if key is not None:
        await repo.put_head(tx, session_id=session_id, tenant_id=tenant_id, digest=key, reply_artifact_id=reply_id,
                            turn=turn, epoch=epoch)


def _differs(param: str) -> BadParameter:
    return BadParameter(
        param, f"{param} differ from this conversation's: they are part of its prompt since it began, so a "
        "conversation keeps the ones it started with (omit them, or start a new conversation)",
    )


def _input(value: str | list[dict[str, Any]] | None) -> list[Observation]:
    """The input of a response that continues a session: new observations only."""
    if value is None or value == [] or value == "":
        raise BadParameter("input", "input is required: a string or a list of items")
    if isinstance(value, str):
        return [Observation("user", value)]
    return observations(value, "input")

