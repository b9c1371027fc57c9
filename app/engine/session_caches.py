"""Which cache handle a session's next transition starts from: session id → the engine handle last used for it.

A handle is an optimisation, never the truth: before each transition the runtime compares the handle's log with the
log stored in the database and crops or extends it (runtime/engine_calls.sync), so a stale handle (another process ran
turns, a forget rewrote the suffix) costs work, not correctness. Hence handles can be forgotten freely.

- `LocalSessionCaches`: the engine runs in this process (hf, in-process vLLM, or a vLLM fleet called directly). The
  most recently used handles are kept; dropping one frees its cache (engines hold caches weakly), and no release call
  is needed, which matters because a handle pushed out may still be in use by a transition of its session.
- the engine process's (app/engine/process/client.py): the engine process keeps one handle per session, whichever
  HTTP worker last used it, and a worker *attaches* to it at the start of a transition (one round trip), so a
  session's turns reuse one warm cache wherever they land.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from app.engine.protocol import CacheHandle

DEFAULT_MAX_HANDLES = 1024


class SessionCaches(Protocol):
    async def checkout(self, session_id: str) -> CacheHandle | None:
        """The handle a transition of the session starts from (None: open one); the caller holds the session's
        lease, so nothing else uses it until the transition ends."""
        ...

    def keep(self, session_id: str, handle: CacheHandle) -> None:
        """Remember `handle` as the session's, for its next transition."""
        ...

    async def drop(self, session_id: str) -> CacheHandle | None:
        """Forget the session's handle (its log is in doubt, or the session is gone); returns it if it was here."""
        ...


class LocalSessionCaches:
    def __init__(self, max_handles: int = DEFAULT_MAX_HANDLES) -> None:
        self.max_handles = max_handles
        self._handles: OrderedDict[str, CacheHandle] = OrderedDict()

    async def checkout(self, session_id: str) -> CacheHandle | None:
        return self.peek(session_id)

    def peek(self, session_id: str) -> CacheHandle | None:
        """The session's handle without waiting (tests and benches look at it)."""
        handle = self._handles.get(session_id)
        if handle is not None:
            self._handles.move_to_end(session_id)
        return handle

    def keep(self, session_id: str, handle: CacheHandle) -> None:
        self._handles[session_id] = handle
        self._handles.move_to_end(session_id)
        while len(self._handles) > self.max_handles:
            self._handles.popitem(last=False)

    async def drop(self, session_id: str) -> CacheHandle | None:
        return self._handles.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._handles)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._handles
