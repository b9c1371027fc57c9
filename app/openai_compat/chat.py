"""Chat Completions: stateless as in OpenAI, but a resent history reuses the session that holds it.

How the match is made. After each completion the service stores a *head*: the SHA-256 of the canonical message
list the client will send next time (its messages plus the answer it got: role, text, tool call ids; the tools
offered are part of it), pointing at the session that holds exactly that history. A request whose messages, up to
and including the last assistant message, hash to a head continues that session: only the messages after it (user
messages, tool results) are prefilled, on top of the session's cache. A request with no assistant message opens a
session (its leading system/developer messages are the system prompt). A history ending in an assistant message
that matches no head cannot be continued (400 `messages`): Lethe's replies are the ones it sampled itself.

Each session keeps one head, and a head row is deleted with the reply artifact it ends on, so once a forget
rewrites the history (a replay gives every later reply a new artifact) the old digest is gone with it. A session's
id comes back in the `Lethe-Session-Id` header, for a forget or a deletion through the native API.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.engine.protocol import TokenSink
from app.engine.slot import EngineSlot
from app.forget import plain_words
from app.forget.proposals import Proposal
from app.forget.schemas import job_out
from app.forget.service import ForgetService
from app.ids import new_id
from app.keys.content import Sealer
from app.openai_compat import repository as repo
from app.openai_compat.errors import BadParameter, ModelNotFound
from app.openai_compat.items import message_text
from app.openai_compat.markup import visible_text
from app.openai_compat.objects import lethe_tools
from app.openai_compat.schemas import ChatCompletionCreate, FunctionTool
from app.openai_compat.subjects import subject_of
from app.runtime.blocks import Observation
from app.runtime.engine_calls import Usage
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.service import SessionService
from app.sessions.views import SessionConfig, TurnResult

Canonical = dict[str, Any]


def canonical(messages: list[dict[str, Any]]) -> list[Canonical]:
    """The parts of each message that make the prompt (and the ids that tie tool results to calls)."""
    out: list[Canonical] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadParameter(where, f"{where} must be an object")
        role = message.get("role")
        allowed = {"role", "content", "name"}
        if role in ("system", "developer", "user"):
            text = message_text(message.get("content"), f"{where}.content")
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif role == "assistant":
            allowed |= {"tool_calls", "refusal"}
            content = message.get("content")
            text = "" if content is None else message_text(content, f"{where}.content", output=True)
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str)
                                                       for c in calls):
                raise BadParameter(f"{where}.tool_calls", "tool_calls must be a list of calls with ids")
            out.append({"role": "assistant", "content": text, "tool_call_ids": [c["id"] for c in calls]})
        elif role == "tool":
            allowed |= {"tool_call_id"}
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id or len(call_id) > 64:
                raise BadParameter(f"{where}.tool_call_id", "a tool message needs the tool_call_id it answers")
            out.append({"role": "tool", "content": message_text(message.get("content"), f"{where}.content"),
                        "tool_call_id": call_id})
        else:
            raise BadParameter(f"{where}.role", f"unsupported role {role!r}: system, developer, user, assistant, tool")
        extra = set(message) - allowed
        if extra:
            raise BadParameter(f"{where}.{sorted(extra)[0]}", "unsupported message field")
    return out


def stored_history(messages: list[Canonical]) -> list[Canonical]:
    """The history as a session holds it: without the exchanges that were deletion requests in plain words (a user
    message that is one, and the plan that answered it), which are never stored (forget/proposals.py)."""
    kept: list[Canonical] = []
    skip = False
    for index, message in enumerate(messages):
        if skip:  # the plan that answered the request just dropped
            skip = False
            continue
        answered = index + 1 < len(messages) and messages[index + 1]["role"] == "assistant"
        if message["role"] == "user" and answered and plain_words.parse(message["content"]) is not None:
            skip = True
            continue
        kept.append(message)
    return kept


def digest(tools: list[dict[str, Any]], messages: list[Canonical]) -> str:
    text = json.dumps({"tools": tools, "messages": messages}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class ChatService:
    def __init__(
        self, db: Database, engine: EngineSlot, sessions: SessionService, forget: ForgetService, *, sealer: Sealer
    ) -> None:
        self.db = db
        self.sealer = sealer
        self.engine = engine
        self.sessions = sessions
        self.forget = forget

    async def create(
        self, tenant_id: str, body: ChatCompletionCreate
    ) -> tuple[Callable[[TokenSink | None], Awaitable[dict[str, Any]]], dict[str, Any]]:
        """Validate and place a completion; returns (run it, the chunk head of its stream)."""
        served = self.engine.engine.model_id
        if body.model != served:
            raise ModelNotFound(body.model, served)
        messages = stored_history(canonical(body.messages))
        tools = [] if not body.tools else lethe_tools([
            FunctionTool(type="function", name=t.function.name, description=t.function.description,
                         parameters=t.function.parameters) for t in body.tools
        ])
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        if last < 0:
            start = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        else:
            start = last + 1
        prefix, new = messages[:start], messages[start:]
        if not new:
            raise BadParameter("messages", "the last message must be a user or tool message")
        for offset, message in enumerate(new, start=start):
            if message["role"] not in ("user", "tool"):
                raise BadParameter(
                    f"messages[{offset}].role", "after the history only user and tool messages may follow: a system "
                    "message belongs at the start",
                )
        observed = [
            Observation("tool_result", m["content"], {"tool_call_id": m["tool_call_id"]}) if m["role"] == "tool"
            else Observation("user", m["content"])
            for m in new
        ]
        if last >= 0:
            async with self.db.transaction() as tx:
                head = await repo.head(tx, tenant_id, digest(tools, prefix))
                session = None if head is None else await sessions_repo.get(tx, self.sealer, tenant_id, head.session_id)
            if head is None or session is None or session.epoch != head.epoch or session.turns != head.turn:
                raise BadParameter(
                    "messages", "this history ends in an assistant message that no session of yours holds (forgotten, "
                    "or not answered here): Lethe continues only histories whose replies it sampled",
                )
            session_id, expect = session.id, head.turn
        else:
            system = "\n\n".join(m["content"] for m in prefix) if prefix else None
            subject = subject_of(safety_identifier=body.safety_identifier, user=body.user)
            view = await self.sessions.create(tenant_id, SessionConfig(system_prompt=system, tools=tools,
                                                                       subject_id=subject))
            session_id, expect = view.row.id, 0
        stops = [body.stop] if isinstance(body.stop, str) else body.stop
        sampling = {k: v for k, v in (
            ("temperature", body.temperature), ("top_p", body.top_p),
            ("max_tokens", body.max_completion_tokens or body.max_tokens), ("seed", body.seed), ("stop", stops),
        ) if v is not None}
        completion_id = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())
        reply_id = new_id("art")

        def answered(message: dict[str, Any], finish: str, usage: Usage, **extra: Any) -> dict[str, Any]:
            return {
                "id": completion_id, "object": "chat.completion", "created": created, "model": served,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.decode_tokens,
                          "total_tokens": usage.prompt_tokens + usage.decode_tokens,
                          "prompt_tokens_details": {"cached_tokens": usage.reused_tokens}},
                "lethe_session_id": session_id, **extra,
            }

        async def run(on_tokens: TokenSink | None) -> dict[str, Any]:
            # A deletion request in plain words is answered with a plan to confirm, as at every front door
            # (forget/proposals.py): never a transition, never stored as a message.
            proposal = await self.forget.propose(tenant_id, session_id, observed, generate=True)
            if proposal is not None:
                return await plan_answer(proposal)

            async def record(tx: AsyncSession, result: TurnResult) -> None:
                """The head the client's next request resends, in the transition's own commit."""
                if result.reply_id is not None:
                    await repo.put_head(tx, session_id=session_id, tenant_id=tenant_id,
                                        digest=digest(tools, [*messages, _canonical_reply(result)]),
                                        reply_artifact_id=result.reply_id, turn=result.turn, epoch=result.epoch)

            try:
                result = await self.sessions.turn(
                    tenant_id, session_id, observed, True, on_tokens, sampling=sampling or None, expect_turns=expect,
                    reply_id=reply_id, on_commit=record,
                )
            except BaseException:
                if last < 0:  # the session opened for this request holds nothing the client could reach
                    await self.sessions.delete(tenant_id, session_id)
                raise
            finish = "tool_calls" if result.tool_calls else (result.finish_reason or "stop")
            return answered(_message(result), finish, result.usage)

        async def plan_answer(proposal: Proposal) -> dict[str, Any]:
            """The plan's reply as the assistant's message. The session is as it was, and so is its head: a history
            resent with this exchange in it matches without it (`stored_history`), so the conversation goes on."""
            message = {"role": "assistant", "content": proposal.reply, "refusal": None}
            if last < 0:
                await self.sessions.delete(tenant_id, session_id)  # opened for this request: nothing to forget
            plan = None if proposal.plan is None else job_out(proposal.plan).model_dump(mode="json")
            return answered(message, "stop", Usage(0, 0, 0, 0, 0), lethe_forget_plan=plan)

        head_chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": served}
        return run, {**head_chunk, "lethe_session_id": session_id}


def _canonical_reply(result: TurnResult) -> Canonical:
    """The reply as the client will resend it (canonical form): its visible text and its calls' ids."""
    message = _message(result)
    return {"role": "assistant", "content": message.get("content") or "",
            "tool_call_ids": [c["id"] for c in message.get("tool_calls", [])]}


def _message(result: TurnResult) -> dict[str, Any]:
    text = visible_text(result.reply_content or "")
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not result.tool_calls else None,
                               "refusal": None}
    if result.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in result.tool_calls
        ]
    return message
