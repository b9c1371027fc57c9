"""Which sessions a target reaches, and whether a strategy may forget in them (checked before anything is queued)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.errors import InvalidRequest, NotFound
from app.forget.locate import Target, locate_in
from app.forget.per_policy import ForgetLookup
from app.forget.strategies import ForgetStrategy
from app.keys.content import Sealer
from app.memory.validation import check_key, check_namespace
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo


async def sessions_reached(tx: AsyncSession, sealer: Sealer, tenant_id: str, target: Target) -> list[str] | None:
    """The sessions a target reaches (None: an artifact id that is not, or no longer, live)."""
    if target.artifact_id is not None:
        artifact = await artifacts_repo.find(tx, sealer, tenant_id, target.artifact_id)
        if artifact is None:
            return None
        if target.session_id is not None and artifact.session_id != target.session_id:
            raise NotFound(f"no artifact {target.artifact_id!r} in session {target.session_id!r}")
        return [artifact.session_id]
    if target.namespace is not None:
        assert target.key is not None
        check_namespace(target.namespace)
        check_key(target.key)
        return await artifacts_repo.sessions_with_memory(tx, tenant_id, target.namespace, target.key)
    assert target.session_id is not None
    if await sessions_repo.get(tx, sealer, tenant_id, target.session_id) is None:
        raise NotFound(f"no session {target.session_id!r}")
    return [target.session_id]


def check_session(strategy: ForgetStrategy, session: AgentSession, policies: ForgetLookup) -> None:
    """422 for a strategy that cannot forget in this kind of session (its policy says which it supports)."""
    if not policies.of(session).forget.supports(strategy.name):
        raise InvalidRequest(
            f"{strategy.name} cannot forget in a session with context_policy {session.context_policy!r}"
        )


async def check_target(
    tx: AsyncSession, sealer: Sealer, tenant_id: str, target: Target, strategy: ForgetStrategy, session_ids: list[str],
    policies: ForgetLookup,
) -> None:
    """Refuse (422) what the strategy cannot do with this target in these sessions."""
    if strategy.targets is not None and target.kind not in strategy.targets:
        raise InvalidRequest(f"{strategy.name} takes a {' or '.join(sorted(strategy.targets))} target")
    sessions = [await sessions_repo.get(tx, sealer, tenant_id, i) for i in session_ids]
    for session in sessions:
        if session is not None:
            check_session(strategy, session, policies)
    if target.kind not in ("artifact", "text"):
        return
    session = sessions[0]
    if session is None:
        raise NotFound(f"no session {session_ids[0]!r}")
    located = locate_in(target, await artifacts_repo.list_all(tx, sealer, tenant_id, session.id))
    if located is not None:
        strategy.check(located)
