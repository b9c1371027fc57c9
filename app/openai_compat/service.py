"""Conversations and Responses over sessions (SessionService) and forgets (ForgetService).

- A conversation is one session. Its opening system/developer items become the system prompt; other opening items
  are one transition without a reply. A response is one transition with a reply, placed by placement.py
  (conversation, previous_response_id, a resent history, or a session of its own; an older response branches).
- Items a client adds to a conversation are observations (a transition without a reply), except model items, which
  must be ones this server sampled: a response's output saved after it ran in the conversation's own session (then
  nothing changes), or in a session of its own that holds exactly the conversation's items followed by them (then
  the conversation takes that session, the Agents SDK's session store: its first run samples the reply outside the
  conversation and saves it afterwards).
- `temperature`, `top_p` and `max_output_tokens` apply to the response's transition only; they are stored with the
  session (`per_turn`), so a forget replays that transition with them. Omitted: the session's (greedy, 256 tokens).
  Every transition's seed derives from the session seed (0) and its index, so a conversation and its counterfactual
  draw the same randomness.
- Deleting an item is a forget of its artifact, answered once the job ended (or after LETHE_FORGET_WAIT_S with
  202): an observation by selective replay (the conversation that never had it), a model item (an assistant message,
  a function_call) by deleting it and every later model item whose context held it (`delete_dependents`: a replay
  from the same inputs would sample it again); `lethe_strategy` picks another. The job is `lethe_forget` in the answer
  and its id the `Lethe-Forget-Id` header.
- Stored rows hold ids, counts and the request's parameters only; a response's input and output are read from its
  transition's artifacts, so whatever a forget removes from the session is gone from every response too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.models import AgentSession, Artifact
from app.db.openai_models import OpenAIConversation, OpenAIResponse
from app.db.statements import InSession
from app.engine.protocol import TokenSink
from app.engine.slot import EngineSlot
from app.errors import Conflict, NotFound
from app.forget.jobs import JobView, Submission
from app.forget.proposals import Proposal
from app.forget.schemas import job_out
from app.forget.service import ForgetService
from app.forget.strategies import STRATEGIES
from app.holds import repository as holds_repo
from app.ids import has_prefix, new_id
from app.keys.content import Sealer
from app.openai_compat import history
from app.openai_compat import repository as repo
from app.openai_compat.compatibility import check_include
from app.openai_compat.errors import BadParameter, ModelNotFound
from app.openai_compat.items import ITEM_KINDS, item_of, items_of, observations, split_system
from app.openai_compat.objects import lethe_tools, page, plan_response, require_id, response_object, ts
from app.openai_compat.placement import Placement, Placer, by_digest, holder, put_head
from app.openai_compat.schemas import ResponseCreate
from app.openai_compat.subjects import subject_of
from app.sessions.branching import Branching
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.service import SessionService
from app.sessions.views import SessionConfig, TurnResult

MODEL_ARTIFACTS = ("assistant", "tool_call")


@dataclass(frozen=True)
class Deleted:
    conversation: dict[str, Any]
    job: JobView


class CompatService:
    def __init__(
        self, db: Database, engine: EngineSlot, sessions: SessionService, forget: ForgetService, *, sealer: Sealer
    ) -> None:
        self.db = db
        self.sealer = sealer  # conversations' metadata, responses' parameters and the sessions' content
        self.engine = engine
        self.sessions = sessions
        self.forget = forget
        self.placer = Placer(db, sessions)
        self.branching = Branching(sessions)

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
            conv = await repo.conversation(tx, self.sealer, tenant_id, conversation_id)
            session = None if conv is None else await sessions_repo.get(tx, self.sealer, tenant_id, conv.session_id)
        if conv is None or session is None:
            raise NotFound(f"no conversation {conversation_id!r}")
        return conv, session

    def _conversation_out(self, conv: OpenAIConversation, forget: JobView | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": conv.id, "object": "conversation", "created_at": ts(conv.created_at),
                               "metadata": dict(conv.meta), "lethe_session_id": conv.session_id}
        if forget is not None:
            out["lethe_forget"] = job_out(forget).model_dump(mode="json")
        return out

    async def create_conversation(
        self, tenant_id: str, items: list[dict[str, Any]], metadata: dict[str, str]
    ) -> dict[str, Any]:
        system, rest = split_system(items, "items")
        observed = observations(rest, "items", offset=len(items) - len(rest))
        subject = subject_of(**{"metadata.lethe_subject_id": metadata.get("lethe_subject_id")})
        view = await self.sessions.create(tenant_id, SessionConfig(system_prompt=system, subject_id=subject))
        try:
            if observed:
                await self.sessions.turn(tenant_id, view.row.id, observed, generate=False)
            async with self.db.transaction() as tx:
                conv = OpenAIConversation(id=new_id("conv"), tenant_id=tenant_id, session_id=view.row.id, meta=metadata)
                await repo.add(tx, self.sealer, conv)
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
            await repo.set_metadata(tx, self.sealer, conv, metadata)
        conv.meta = metadata
        return self._conversation_out(conv)

    async def delete_conversation(self, tenant_id: str, conversation_id: str) -> dict[str, Any]:
        conv, session = await self._conversation(tenant_id, conversation_id)
        # Its responses and the conversation go with it (cascade).
        await self.sessions.delete(tenant_id, session.id, erasure=True)
        return {"id": conv.id, "object": "conversation.deleted", "deleted": True}

    # -- items --------------------------------------------------------------------------------------------------

    async def list_items(
        self, tenant_id: str, conversation_id: str, *, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        _, session = await self._conversation(tenant_id, conversation_id)
        async with self.db.transaction() as tx:
            rows = await artifacts_repo.list_live(tx, self.sealer, tenant_id, session.id)
        return page(items_of(rows), after=after, limit=limit, order=order)

    async def input_items(
        self, tenant_id: str, response_id: str, *, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        """A response's input: its transition's observations as they are now (a forgotten one is gone)."""
        row = await self._response_row(tenant_id, response_id)
        async with self.db.transaction() as tx:
            arts = await repo.at_turn(tx, self.sealer, row.session_id, row.turn)
        inputs = [a for a in arts if a.kind in ("user", "document", "tool_result") and not (a.meta or {}).get("server")]
        return page([i for a in inputs if (i := item_of(a)) is not None], after=after, limit=limit, order=order)

    async def _item_row(self, tenant_id: str, session: AgentSession, item_id: str) -> Artifact:
        require_id(item_id, "art", "item")
        async with self.db.transaction() as tx:
            row = await artifacts_repo.find(tx, self.sealer, tenant_id, item_id)
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
        conv, session = await self._conversation(tenant_id, conversation_id)
        given = history.given(items, "items")
        if any(g.is_model for g in given):
            data = await self._sampled_items(tenant_id, conv, session, given)
        else:
            result = await self.sessions.turn(tenant_id, session.id, observations(items, "items"), generate=False)
            async with self.db.transaction() as tx:
                rows = await repo.artifacts(tx, self.sealer, session.id, result.input_ids)
            data = items_of(rows)
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": False}

    async def _sampled_items(
        self, tenant_id: str, conv: OpenAIConversation, session: AgentSession, given: list[history.Given]
    ) -> list[dict[str, Any]]:
        """Model items added to a conversation: already its newest items, or a response's output whose session the
        conversation adopts (module docstring); 400 otherwise."""
        async with self.db.transaction() as tx:
            current = history.held(await artifacts_repo.list_live(tx, self.sealer, tenant_id, session.id))
            if history.anchor(given) is not None:
                other = await holder(tx, self.sealer, tenant_id, given)
            else:
                canons = [h.canon for h in current] + [g.canon for g in given]
                other = await by_digest(tx, self.sealer, tenant_id, canons)
            if other is not None and (other.id == session.id
                                      or await repo.conversation_of_session(tx, other.id) is not None):
                other = None
            other_items = [] if other is None else history.held(
                await artifacts_repo.list_live(tx, self.sealer, tenant_id, other.id))
        tail = history.tail_of(given, current)
        if tail is not None:
            return [h.item for h in tail]
        adopted = None if other is None or session.system_prompt not in (None, other.system_prompt) else \
            history.adoptable(current, given, other_items)
        if other is None or adopted is None:
            at = next(g.index for g in given if g.is_model)
            raise BadParameter(
                f"items[{at}]", "model items added to a conversation must be ones this server sampled after its "
                "items (a response's output, with the ids it was given)",
            )
        async with self.db.transaction() as tx:
            locked = await repo.conversation(tx, self.sealer, tenant_id, conv.id, for_update=True)
            if locked is None or locked.session_id != session.id:
                raise Conflict("the conversation changed under this request; retry")
            await repo.set_session(tx, conv.id, other.id)
            await holds_repo.move_session(InSession(tx), tenant_id, session.id, other.id)
        await self.sessions.delete(tenant_id, session.id)  # it held only what the adopted session holds too
        return [h.item for h in adopted]

    async def delete_item(
        self, tenant_id: str, conversation_id: str, item_id: str, *, strategy: str | None, dry_run: bool
    ) -> Deleted:
        conv, session = await self._conversation(tenant_id, conversation_id)
        if strategy is not None and strategy not in STRATEGIES:
            raise BadParameter("lethe_strategy", f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES.names)}")
        row = await self._item_row(tenant_id, session, item_id)
        if strategy is None and row.kind in MODEL_ARTIFACTS:
            strategy = "delete_dependents"  # replaying from the same inputs would sample it again
        job = await self.forget.submit(tenant_id, Submission(
            target={"artifact_id": item_id, "session_id": session.id}, strategy=strategy, dry_run=dry_run,
            wait=True, reason="conversation item deleted",
        ))
        if job.status == "failed":
            raise Conflict(f"the forget of item {item_id!r} failed: {job.error}", headers={"Lethe-Forget-Id": job.id},
                           forget_id=job.id)
        return Deleted(self._conversation_out(conv, job), job)

    # -- responses ----------------------------------------------------------------------------------------------

    async def create_response(
        self, tenant_id: str, body: ResponseCreate
    ) -> tuple[Callable[[TokenSink | None], Awaitable[dict[str, Any]]], dict[str, Any], str]:
        """Validate and place a response; returns (run it, its in-progress skeleton, its reply id)."""
        self.check_model(body.model)
        check_include(body.include)
        if body.stream_options is not None and not body.stream:
            raise BadParameter("stream_options", "stream_options needs stream: true")
        if body.conversation is not None and body.previous_response_id is not None:
            raise BadParameter("previous_response_id", "give either conversation or previous_response_id, not both")
        tools = None if body.tools is None else lethe_tools(body.tools)
        conversation = previous = None
        if body.conversation is not None:
            conversation_id = body.conversation if isinstance(body.conversation, str) else body.conversation.id
            conversation = ((await self._conversation(tenant_id, conversation_id))[1], conversation_id)
        elif body.previous_response_id is not None:
            row = await self._response_row(tenant_id, body.previous_response_id, "previous_response_id")
            async with self.db.transaction() as tx:
                found = await sessions_repo.get(tx, self.sealer, tenant_id, row.session_id)
            if found is None:
                raise NotFound(f"no response {body.previous_response_id!r}", param="previous_response_id")
            previous = (found, row.turn, row.conversation_id)
        placed = await self.placer.place(tenant_id, body, tools, conversation, previous)
        sampling = {k: v for k, v in (("temperature", body.temperature), ("top_p", body.top_p),
                                      ("max_tokens", body.max_output_tokens)) if v is not None}
        response_id, reply_id = new_id("resp"), new_id("art")
        params = {"model": body.model, "temperature": body.temperature, "top_p": body.top_p,
                  "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {}}

        async def run(on_tokens: TokenSink | None) -> dict[str, Any]:
            session_id = placed.session_id
            if placed.branch_turn is not None:
                session_id = await self.branching.branch(
                    tenant_id, session_id, placed.branch_turn, epoch=placed.branch_epoch
                )
            # A deletion request in plain words is answered with a plan to confirm, as at every front door
            # (forget/proposals.py): never a transition, never stored as a message.
            proposal = await self.forget.propose(tenant_id, session_id, placed.observations, generate=True)
            if proposal is not None:
                return await self._plan_response(tenant_id, session_id, placed, proposal, response_id, reply_id,
                                                 body.previous_response_id, params)

            async def record(tx: AsyncSession, result: TurnResult) -> None:
                """The response row, in the transition's own commit: no response without its transition."""
                usage = result.usage
                if result.reply_id is not None:
                    await put_head(tx, self.sealer, tenant_id, session_id, result.turn, result.epoch, result.reply_id)
                await repo.add(tx, self.sealer, OpenAIResponse(
                    id=response_id, tenant_id=tenant_id, session_id=session_id, conversation_id=placed.conversation_id,
                    turn=result.turn, previous_response_id=body.previous_response_id, params=params,
                    usage={"input_tokens": usage.prompt_tokens, "cached_tokens": usage.reused_tokens,
                           "prefill_tokens": usage.prefill_tokens, "output_tokens": usage.decode_tokens},
                ))

            try:
                await self.sessions.turn(
                    tenant_id, session_id, placed.observations, True, on_tokens, sampling=sampling or None,
                    expect_turns=placed.expect_turns, reply_id=reply_id, on_commit=record,
                )
            except BaseException:
                if placed.owned:  # the session opened for this request holds nothing the client could reach
                    await self.sessions.delete(tenant_id, session_id)
                raise
            return await self.get_response(tenant_id, response_id)

        skeleton = {
            "id": response_id, "object": "response", "created_at": ts(None), "status": "in_progress",
            "model": body.model, "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "metadata": params["metadata"], "previous_response_id": body.previous_response_id,
            "conversation": {"id": placed.conversation_id} if placed.conversation_id else None,
        }
        return run, skeleton, reply_id

    async def _plan_response(
        self, tenant_id: str, session_id: str, placed: Placement, proposal: Proposal, response_id: str, reply_id: str,
        previous_response_id: str | None, params: dict[str, Any],
    ) -> dict[str, Any]:
        """The answer to a deletion request: a response whose output is the plan's reply, at the session's current
        transition (nothing of the request is in the session), so the conversation goes on from where it was."""
        if proposal.plan is None and placed.owned:
            await self.sessions.delete(tenant_id, session_id)  # opened for this request: nothing in it to forget
        plan = {"reply": proposal.reply, "reply_id": reply_id,
                "forget_id": None if proposal.plan is None else proposal.plan.id}
        async with self.db.transaction() as tx:
            session = await sessions_repo.get(tx, self.sealer, tenant_id, session_id)
            if session is None:
                return plan_response(response_id, plan, params, previous_response_id)
            await repo.add(tx, self.sealer, OpenAIResponse(
                id=response_id, tenant_id=tenant_id, session_id=session_id, conversation_id=placed.conversation_id,
                turn=session.turns, previous_response_id=previous_response_id, params={**params, "plan": plan},
                usage={},
            ))
        answer = await self.get_response(tenant_id, response_id)
        if proposal.plan is not None:
            answer["lethe_forget_plan"] = job_out(proposal.plan).model_dump(mode="json")
        return answer

    async def _response_row(self, tenant_id: str, response_id: str, param: str | None = None) -> OpenAIResponse:
        row = None
        if has_prefix(response_id, "resp"):
            async with self.db.transaction() as tx:
                row = await repo.response(tx, self.sealer, tenant_id, response_id)
        if row is None:
            raise NotFound(f"no response {response_id!r}", param=param)
        return row

    async def get_response(self, tenant_id: str, response_id: str) -> dict[str, Any]:
        row = await self._response_row(tenant_id, response_id)
        async with self.db.transaction() as tx:
            session = await sessions_repo.get(tx, self.sealer, tenant_id, row.session_id)
            arts = await repo.at_turn(tx, self.sealer, row.session_id, row.turn)
        if session is None:
            raise NotFound(f"no response {response_id!r}")
        return response_object(row, session, arts)
