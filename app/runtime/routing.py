"""The routing key of a session: the one key its engine caches are kept under and its requests are routed by.

It names the session and nothing else, so every turn and every forget of a session reaches the same cache handles
(engine/session_caches.py) and, on a fleet, the same worker (engine/fleet.py). Which cached blocks a request may
reuse is the salt's business (salts.py), not the route's.
"""

from __future__ import annotations

from app.db.models import AgentSession


def route_of(session: AgentSession) -> str:
    """The key of a session's cache handles: what they are opened with and kept under (engine/session_caches.py);
    on a fleet it is the `X-Session-ID` by which vllm-router keeps the session on one worker (engine/fleet.py). No
    cache generation in it: a forget that moves the session to a new salt keeps its worker (and its clean prefix
    cached there, where the salt did not change)."""
    return session_route(session.tenant_id, session.id)


def session_route(tenant_id: str, session_id: str) -> str:
    """`route_of` for a session known by its ids."""
    return f"{tenant_id}:{session_id}"
