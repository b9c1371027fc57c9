"""A deletion request made in plain words inside a session (plain_words.py), answered with a plan to confirm.

A turn that is one user message such as "Forget that I live in Paris" is not run as a transition: M is matched in
the session, the forget is planned and stored as a job in status `planned` (its target is M's ids only, never the
words), and the turn is answered with the plan and a reply saying how to confirm it. Nothing is deleted until the
client confirms the plan (`POST /v1/forget {"plan_id": ...}`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.models import AgentSession
from app.embeddings import Embedder
from app.errors import NotFound
from app.forget import locate
from app.forget.cost import Yardstick
from app.forget.jobs import DEFAULT_STRATEGY, JobView, view_of
from app.forget.locate import Target
from app.forget.per_policy import ForgetLookup
from app.forget.plain_words import MEANING_SIMILARITY, DeletionRequest, parse
from app.forget.planner import plan
from app.forget.receipts import JobReceipt
from app.forget.repositories import jobs as jobs_repo
from app.forget.strategies import STRATEGIES
from app.ids import new_id
from app.keys.content import Sealer
from app.runtime.blocks import MODEL_KINDS, Observation
from app.sessions.repositories import artifact_search as search_repo
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo

NOTHING_MATCHES = "Nothing in this conversation matches that, so there is nothing to forget."


@dataclass(frozen=True)
class Proposal:
    plan: JobView | None  # the stored plan (None: nothing in the session matches the request)
    reply: str  # what the turn answers the user


def deletion_request(observations: Sequence[Observation], *, generate: bool) -> DeletionRequest | None:
    """The deletion request a turn's inputs are: one user message asking, in plain words, to forget something."""
    if not generate or len(observations) != 1 or observations[0].kind != "user":
        return None
    return parse(observations[0].content)


async def propose(
    db: Database, sealer: Sealer, embedder: Embedder, tenant_id: str, session_id: str, request: DeletionRequest,
    policies: ForgetLookup, yardstick: Yardstick,
) -> Proposal:
    """Match M for `request` in the session, plan its forget (its costs measured with `yardstick`) and store the
    plan as a `planned` job."""
    async with db.transaction() as tx:
        if await sessions_repo.get(tx, sealer, tenant_id, session_id) is None:
            raise NotFound(f"no session {session_id!r}")
    vector = None
    if request.how == "meaning":  # embedded in its own transactions, not while the session is read
        vector = await locate.embed_query(db, sealer, embedder, session_id, request.what)
    async with db.transaction() as tx:
        session = await sessions_repo.get(tx, sealer, tenant_id, session_id)
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        ids = await _match(tx, sealer, session, request, vector)
    if not ids:
        return Proposal(None, NOTHING_MATCHES)
    target = Target(session_id=session_id, artifact_ids=tuple(ids))
    strategy = STRATEGIES.named(DEFAULT_STRATEGY)
    planned = await plan(db, sealer, embedder, tenant_id, target, strategy, [session_id], None, policies, yardstick)
    if not planned.sessions:
        return Proposal(None, NOTHING_MATCHES)
    async with db.transaction() as tx:
        job = await jobs_repo.create(
            tx, sealer, id=new_id("fgt"), tenant_id=tenant_id, status="planned", strategy=strategy.name,
            target=target.to_dict(), reason="requested in the session",
            receipt=JobReceipt(sessions=planned.sessions).stored(), attempts=0,
        )
    stored = view_of(job)
    trace = stored.sessions[0].trace or []
    matched = sum(1 for step in trace if step.why == "target")
    reply = (
        f"I can forget {matched} message(s) and {len(trace) - matched} artifact(s) derived from them. Nothing is "
        f'deleted yet: confirm with POST /v1/forget {{"plan_id": "{stored.id}"}}.'
    )
    return Proposal(stored, reply)


async def _match(
    tx: AsyncSession, sealer: Sealer, session: AgentSession, request: DeletionRequest, vector: list[float] | None
) -> list[str]:
    """M for a request in plain words: the session's live messages it names (observations; the replies derived
    from them follow through the closure), in log order."""
    messages = [
        a for a in await artifacts_repo.list_live(tx, sealer, session.tenant_id, session.id)
        if a.kind not in MODEL_KINDS and a.kind not in ("system", "instruction")
    ]
    if request.how == "id":
        if request.what.isdigit():
            users = [a for a in messages if a.kind == "user"]
            index = int(request.what) - 1
            return [users[index].id] if 0 <= index < len(users) else []
        return [a.id for a in messages if a.id == request.what]
    if request.how == "text":
        return [a.id for a in messages if request.what in a.content]
    if request.how == "keyword":
        kinds = sorted({a.kind for a in messages})
        return await search_repo.keyword_matches(tx, sealer, session.id, request.what, kinds) if kinds else []
    assert vector is not None
    similar = set(await locate.similar(tx, sealer, session.id, vector, MEANING_SIMILARITY))
    wanted = request.what.casefold()
    return [a.id for a in messages if a.id in similar or wanted in a.content.casefold()]
