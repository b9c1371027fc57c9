"""Conversations and Responses over sessions (SessionService) and forgets (ForgetService).

- A conversation is one session. Its opening system/developer items become the system prompt; other opening items
  are one transition without a reply. A response is one transition with a reply; `previous_response_id` continues
  the session of that response when it is still the session's newest (Lethe cannot branch a session).
- A session's system prompt and tools are part of its prompt from transition 0, so a response's `instructions` and
  `tools` configure the conversation while it has no transition yet (the empty session is replaced), and must
  match it afterwards (400 naming the parameter otherwise); omitted, the conversation's stay.
- `temperature`, `top_p` and `max_output_tokens` apply to the response's transition only; they are stored with the
  session (`per_turn`), so a forget replays that transition with them. Omitted: the session's (greedy, 256 tokens).
  Every transition's seed derives from the session seed (0) and its index, so a conversation and its counterfactual
  draw the same randomness.
- Deleting an item is a forget of its artifact (selective replay unless `lethe_strategy` says otherwise),
  answered once the job ended (or after LETHE_FORGET_WAIT_S with 202); the job is `lethe_forget` in the answer and
  its id the `Lethe-Forget-Id` header.
- Stored rows hold ids, counts and the request's parameters only; a response's input and output are read from its
  transition's artifacts, so whatever a forget removes from the session is gone from every response too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.api.schemas.forget import job_out
from app.db.models import AgentSession, Artifact, OpenAIConversation, OpenAIResponse
from app.db.repositories import artifacts as artifacts_repo
from app.db.repositories import sessions as sessions_repo
from app.db.session import Database
from app.engine.protocol import TokenSink
from app.engine.slot import EngineSlot
from app.errors import Conflict, NotFound
from app.forget.jobs import JobView, Submission
from app.forget.service import ForgetService
from app.forget.strategies import STRATEGIES
from app.ids import has_prefix, new_id
from app.openai_compat import repository as repo
from app.openai_compat.errors import BadParameter, ModelNotFound
from app.openai_compat.items import ITEM_KINDS, item_of, items_of, observations, split_system
from app.openai_compat.schemas import FunctionTool, ResponseCreate
from app.runtime.blocks import Observation
from app.runtime.tool_catalog import normalize as normalize_tools
from app.sessions.service import SessionService
from app.sessions.values import SessionConfig


def page(items: list[dict[str, Any]], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """OpenAI's cursor list: `order` (asc: oldest first), the items after the one named `after`, `limit` of them."""
    if order == "desc":
        items = list(reversed(items))
    if after is not None:
        index = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if index is None:
            raise BadParameter("after", f"no item {after!r} in this list")
        items = items[index + 1:]
    chunk = items[:limit]
    return {"object": "list", "data": chunk, "first_id": chunk[0]["id"] if chunk else None,
            "last_id": chunk[-1]["id"] if chunk else None, "has_more": len(items) > limit}


def _ts(at: datetime | None) -> int:
    return int((at or datetime.now()).timestamp())


def require_id(value: str, prefix: str, what: str) -> None:
    """A malformed id is an unknown one (and never reaches SQL, whatever characters it holds)."""
    if not has_prefix(value, prefix):
        raise NotFound(f"no {what} {value!r}")


def lethe_tools(tools: list[FunctionTool]) -> list[dict[str, Any]]:
    """Function tools as a session's client tools (the model's calls wait for the client's output)."""
    specs = [{"name": t.name, "description": t.description or "", "parameters": t.parameters or {"type": "object"}}
             for t in tools]
    try:
        return normalize_tools(specs)
    except ValueError as exc:
        raise BadParameter("tools", str(exc)) from None


def function_tools(session_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "name": t["name"], "description": t.get("description") or None,
             "parameters": t.get("parameters"), "strict": False}
            for t in session_tools if not t.get("builtin")]


@dataclass(frozen=True)
class Deleted:
    conversation: dict[str, Any]
    job: JobView


class CompatService:
    def __init__(self, db: Database, engine: EngineSlot, sessions: SessionService, forget: ForgetService) -> None:
        self.db = db
        self.engine = engine
        self.sessions = sessions
        self.forget = forget

    # -- models -------------------------------------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self.engine.engine.model_id

    def check_model(self, model: str) -> None:
        if model != self.model_id:
            raise ModelNotFound(model, self.model_id)

    # -- conversations ------------------------------------------------------------------------------------------

    async def _conversation(self, tenant_id: str, conversation_id: str) -> tuple[OpenAIConversation, AgentSession]:
        require_id(conversation_id, "conv", "conversation")
        async with self.db.transaction() as tx:
            conv = await repo.conversation(tx, tenant_id, conversation_id)
            session = None if conv is None else await sessions_repo.get(tx, tenant_id, conv.session_id)
        if conv is None or session is None:
            raise NotFound(f"no conversation {conversation_id!r}")
        return conv, session

    def _conversation_out(self, conv: OpenAIConversation, forget: JobView | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": conv.id, "object": "conversation", "created_at": _ts(conv.created_at),
                               "metadata": dict(conv.meta), "lethe_session_id": conv.session_id}
        if forget is not None:
            out["lethe_forget"] = job_out(forget).model_dump(mode="json")
        return out

    async def create_conversation(
        self, tenant_id: str, items: list[dict[str, Any]], metadata: dict[str, str]
    ) -> dict[str, Any]:
        system, rest = split_system(items, "items")
        observed = observations(rest, "items", offset=len(items) - len(rest))
        view = await self.sessions.create(tenant_id, SessionConfig(system_prompt=system))
        try:
            if observed:
                await self.sessions.turn(tenant_id, view.row.id, observed, generate=False)
            async with self.db.transaction() as tx:
                conv = OpenAIConversation(id=new_id("conv"), tenant_id=tenant_id, session_id=view.row.id, meta=metadata)
                await repo.add(tx, conv)
        except BaseException:
            await self.sessions.delete(tenant_id, view.row.id)
            raise
        return self._conversation_out(conv)

    async def get_conversation(self, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        conv, _ = await self._conversation(tenant_id, conversation_id)
        return self._conversation_out(conv)

    async def update_conversation(
        self, tenant_id: str, conversation_id: str, metadata: dict[str, str]
    ) -> dict[str, Any]:
        conv, _ = await self._conversation(tenant_id, conversation_id)
        async with self.db.transaction() as tx:
            await repo.set_metadata(tx, conv.id, metadata)
        conv.meta = metadata
        return self._conversation_out(conv)

    async def delete_conversation(self, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        conv, session = await self._conversation(tenant_id, conversation_id)
        await self.sessions.delete(tenant_id, session.id)  # its responses and the conversation go with it (cascade)
        return {"id": conv.id, "object": "conversation.deleted", "deleted": True}

    # -- items --------------------------------------------------------------------------------------------------

    async def list_items(
        self, tenant_id: str, conversation_id: str, *, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        _, session = await self._conversation(tenant_id, conversation_id)
        async with self.db.transaction() as tx:
            rows = await artifacts_repo.list_live(tx, tenant_id, session.id)
        return page(items_of(rows), after=after, limit=limit, order=order)

    async def input_items(
        self, tenant_id: str, response_id: str, *, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        """A response's input: its transition's observations as they are now (a forgotten one is gone)."""
        row = await self._response_row(tenant_id, response_id)
        async with self.db.transaction() as tx:
            arts = await repo.at_turn(tx, row.session_id, row.turn)
        inputs = [a for a in arts if a.kind in ("user", "document", "tool_result") and not (a.meta or {}).get("server")]
        return page([i for a in inputs if (i := item_of(a)) is not None], after=after, limit=limit, order=order)

    async def _item_row(self, tenant_id: str, session: AgentSession, item_id: str) -> Artifact:
        require_id(item_id, "art", "item")
        async with self.db.transaction() as tx:
            row = await artifacts_repo.find(tx, tenant_id, item_id)
        if row is None or row.session_id != session.id or row.kind not in ITEM_KINDS or row.archived_by is not None:
            raise NotFound(f"no item {item_id!r} in this conversation")
        return row

    async def get_item(self, tenant_id: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        _, session = await self._conversation(tenant_id, conversation_id)
        item = item_of(await self._item_row(tenant_id, session, item_id))
        if item is None:
            raise NotFound(f"no item {item_id!r} in this conversation")
        return item

    async def create_items(self, tenant_id: str, conversation_id: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        _, session = await self._conversation(tenant_id, conversation_id)
        result = await self.sessions.turn(tenant_id, session.id, observations(items, "items"), generate=False)
        async with self.db.transaction() as tx:
            rows = await repo.artifacts(tx, session.id, result.input_ids)
        data = items_of(rows)
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": False}

    async def delete_item(
        self, tenant_id: str, conversation_id: str, item_id: str, *, strategy: str | None, dry_run: bool
    ) -> Deleted:
        conv, session = await self._conversation(tenant_id, conversation_id)
        if strategy is not None and strategy not in STRATEGIES:
            raise BadParameter("lethe_strategy", f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
        await self._item_row(tenant_id, session, item_id)
        job = await self.forget.submit(tenant_id, Submission(
            target={"artifact_id": item_id, "session_id": session.id}, strategy=strategy, dry_run=dry_run,
            wait=True, reason="conversation item deleted",
        ))
        if job.status == "failed":
            raise Conflict(f"the forget of item {item_id!r} failed: {job.error}", headers={"Lethe-Forget-Id": job.id},
                           forget_id=job.id)
        return Deleted(self._conversation_out(conv, job), job)

    # -- responses ----------------------------------------------------------------------------------------------

    async def _configure(
        self, tenant_id: str, session: AgentSession, conversation_id: str | None, instructions: str | None,
        tools: list[dict[str, Any]] | None,
    ) -> str:
        """The session that serves a response with these instructions and tools (see the module docstring)."""
        system = session.system_prompt if instructions is None else instructions
        wanted = session.tools if tools is None else tools
        if system == session.system_prompt and wanted == session.tools:
            return session.id
        if session.turns > 0:
            param = "instructions" if system != session.system_prompt else "tools"
            raise BadParameter(
                param, f"{param} differ from this conversation's: they are part of its prompt since it began, so a "
                "conversation keeps the ones it started with (omit them, or start a new conversation)",
            )
        fresh = await self.sessions.create(
            tenant_id, SessionConfig(system_prompt=system, tools=wanted, sampling=dict(session.sampling))
        )
        if conversation_id is not None:
            async with self.db.transaction() as tx:
                conv = await repo.conversation(tx, tenant_id, conversation_id, for_update=True)
                if conv is None or conv.session_id != session.id:
                    moved = True
                else:
                    moved = False
                    await repo.set_session(tx, conversation_id, fresh.row.id)
            if moved:
                await self.sessions.delete(tenant_id, fresh.row.id)
                raise Conflict("the conversation was reconfigured by another request; retry")
        await self.sessions.delete(tenant_id, session.id)
        return fresh.row.id

    async def create_response(
        self, tenant_id: str, body: ResponseCreate
    ) -> tuple[Callable[[TokenSink | None], Awaitable[dict[str, Any]]], dict[str, Any], str]:
        """Validate and place a response; returns (run it, its in-progress skeleton, its reply id)."""
        self.check_model(body.model)
        if body.conversation is not None and body.previous_response_id is not None:
            raise BadParameter("previous_response_id", "give either conversation or previous_response_id, not both")
        observed = self._input(body.input)
        tools = None if body.tools is None else lethe_tools(body.tools)
        conversation_id: str | None = None
        expect: int | None = None
        if body.conversation is not None:
            conversation_id = body.conversation if isinstance(body.conversation, str) else body.conversation.id
            _, session = await self._conversation(tenant_id, conversation_id)
        elif body.previous_response_id is not None:
            previous = await self._response_row(tenant_id, body.previous_response_id, "previous_response_id")
            async with self.db.transaction() as tx:
                found = await sessions_repo.get(tx, tenant_id, previous.session_id)
            if found is None:
                raise NotFound(f"no response {body.previous_response_id!r}")
            session = found
            if session.turns != previous.turn:
                raise BadParameter(
                    "previous_response_id", "that response is no longer its session's newest transition: Lethe "
                    "continues a session from its end and does not branch it",
                )
            conversation_id, expect = previous.conversation_id, previous.turn
        else:
            view = await self.sessions.create(
                tenant_id, SessionConfig(system_prompt=body.instructions, tools=tools or [])
            )
            session = view.row
        session_id = await self._configure(tenant_id, session, conversation_id, body.instructions, tools)
        sampling = {k: v for k, v in (("temperature", body.temperature), ("top_p", body.top_p),
                                      ("max_tokens", body.max_output_tokens)) if v is not None}
        response_id, reply_id = new_id("resp"), new_id("art")
        params = {"model": body.model, "temperature": body.temperature, "top_p": body.top_p,
                  "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {}}

        fresh = body.conversation is None and body.previous_response_id is None

        async def run(on_tokens: TokenSink | None) -> dict[str, Any]:
            try:
                result = await self.sessions.turn(
                    tenant_id, session_id, observed, True, on_tokens, sampling=sampling or None, expect_turns=expect,
                    reply_id=reply_id,
                )
            except BaseException:
                if fresh:  # the session opened for this request holds nothing the client could reach
                    await self.sessions.delete(tenant_id, session_id)
                raise
            usage = result.usage
            async with self.db.transaction() as tx:
                await repo.add(tx, OpenAIResponse(
                    id=response_id, tenant_id=tenant_id, session_id=session_id, conversation_id=conversation_id,
                    turn=result.turn, previous_response_id=body.previous_response_id, params=params,
                    usage={"input_tokens": usage.prompt_tokens, "cached_tokens": usage.reused_tokens,
                           "prefill_tokens": usage.prefill_tokens, "output_tokens": usage.decode_tokens},
                ))
            return await self.get_response(tenant_id, response_id)

        skeleton = {
            "id": response_id, "object": "response", "created_at": _ts(None), "status": "in_progress",
            "model": body.model, "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "metadata": params["metadata"], "previous_response_id": body.previous_response_id,
            "conversation": {"id": conversation_id} if conversation_id else None,
        }
        return run, skeleton, reply_id

    def _input(self, value: str | list[dict[str, Any]] | None) -> list[Observation]:
        if value is None or value == [] or value == "":
            raise BadParameter("input", "input is required: a string or a list of items")
        if isinstance(value, str):
            return [Observation("user", value)]
        return observations(value, "input")

    async def _response_row(self, tenant_id: str, response_id: str, param: str | None = None) -> OpenAIResponse:
        row = None
        if has_prefix(response_id, "resp"):
            async with self.db.transaction() as tx:
                row = await repo.response(tx, tenant_id, response_id)
        if row is None:
            raise NotFound(f"no response {response_id!r}", param=param)
        return row

    async def get_response(self, tenant_id: str, response_id: str) -> dict[str, Any]:
        row = await self._response_row(tenant_id, response_id)
        async with self.db.transaction() as tx:
            session = await sessions_repo.get(tx, tenant_id, row.session_id)
            arts = await repo.at_turn(tx, row.session_id, row.turn)
        if session is None:
            raise NotFound(f"no response {response_id!r}")
        return response_object(row, session, arts)


def response_object(row: OpenAIResponse, session: AgentSession, arts: list[Artifact]) -> dict[str, Any]:
    """A response as OpenAI's object, its output read from its transition's artifacts as they are now."""
    output = [item for a in arts if a.kind in ("assistant", "tool_call") and (item := item_of(a)) is not None]
    replies = [a for a in arts if a.kind == "assistant"]
    finish = (replies[-1].meta or {}).get("finish_reason") if replies else None
    config = {**session.sampling, **((session.sampling.get("per_turn") or {}).get(str(row.turn)) or {})}
    params, usage = row.params, row.usage
    incomplete = finish == "length"
    return {
        "id": row.id, "object": "response", "created_at": _ts(row.created_at), "completed_at": _ts(row.created_at),
        "status": "incomplete" if incomplete else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": session.system_prompt, "metadata": params.get("metadata") or {}, "model": params["model"],
        "output": output, "parallel_tool_calls": True,
        "temperature": float(config.get("temperature", 0.0)), "top_p": float(config.get("top_p", 1.0)),
        "max_output_tokens": int(config.get("max_tokens", 256)), "tool_choice": "auto",
        "tools": function_tools(session.tools), "previous_response_id": row.previous_response_id,
        "conversation": {"id": row.conversation_id} if row.conversation_id else None,
        "store": True, "background": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": {
            "input_tokens": usage.get("input_tokens", 0),
            "input_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0),
                                     "cache_write_tokens": usage.get("prefill_tokens", 0)},
            "output_tokens": usage.get("output_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
        },
        "lethe_session_id": row.session_id, "lethe_turn": row.turn,
    }
