"""Which prefix-cache blocks a session's engine requests may reach: the cache salt of (tenant, session, generation).

vLLM caches KV blocks by a hash chained from the first block, and `cache_salt` enters only the first block's hash: a
request reaches exactly the blocks earlier requests computed for a prefix of its log *under the same salt*. After a
forget the blocks that held the target stay cached until evicted (vLLM has no per-prefix eviction), so what keeps
them out of reach is who may send their salt and which logs those requests carry:

- the salt is per session, so no other session (of any tenant) reaches a session's blocks: a probe that rebuilds
  the exact forgotten prefix in a session of its own finds nothing cached (it pays its own system prompt too: sessions
  of a tenant no longer share blocks);
- a session's own requests always carry its stored log (a turn extends it). After a forget that replayed something,
  the rebuilt log differs from the old one *inside* the rebuilt log, so no extension of it matches the old chain past
  that point: the replay keeps the salt and reuses the clean prefix exactly as before (no cost, and the exactness
  conditions of docs/engines.md hold). When the rebuilt log is a proper *prefix* of the old one (the forgotten
  transitions were the last ones: nothing was replayed), the next turn could send the forgotten text at the same
  position and hit the old blocks, so the session's cache *generation* is bumped: a new salt, hence a new chain from
  block 0. The next turn then prefills the whole log once (vLLM's `reused` is 0 for it), as after an eviction;
- a retrieval session's prompts are not one growing log (each reply is preamble + retrieved context + request), so
  the prefix argument does not hold there: every forget that changes such a session bumps its generation.

The hf engine keeps no shared cache: the salt means nothing to it, and a bumped salt changes nothing there
(engine_calls.sync re-labels the handle instead of rebuilding it).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.db.models import AgentSession


def session_salt(tenant_id: str, session_id: str, generation: int = 0) -> str:
    """The engines digest it (vllm_local.cache_salt), so neither id reaches a fleet's logs."""
    return f"{tenant_id}:{session_id}:{generation}"


def salt_of(session: AgentSession) -> str:
    return session_salt(session.tenant_id, session.id, session.cache_generation or 0)


def rotates(before: Sequence[int], after: Sequence[int], *, retrieval: bool = False) -> bool:
    """Whether a forget that turned the log `before` into `after` must give the session a new cache salt: when a
    request extending `after` could match `before`'s blocks past what `after` holds (`after` is a proper prefix of
    `before`), or, in a retrieval session, whenever the forget changed anything."""
    if retrieval:
        return True
    return len(after) < len(before) and list(before[: len(after)]) == list(after)
