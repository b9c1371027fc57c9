"""The process-local registry of cache handles: session id → the engine handle this process last used for it.

A handle is an optimisation, never the truth: before each transition the runtime compares the handle's log with the
log stored in the database and crops or extends it (transition.sync), so a stale handle (another process ran turns,
a forget rewrote the suffix) costs work, not correctness. Hence the registry can forget handles freely: it keeps the
most recently used ones. Dropping a handle frees its cache (engines hold caches weakly); no release call is needed,
which matters because a handle pushed out here may still be in use by a transition of its session.

The app's Container owns one registry (built in the lifespan), so every app in a process has its own and the
forget worker of the same app finds the handles its turns built.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict

from app.engine.protocol import CacheHandle

DEFAULT_MAX_HANDLES = 1024


class HandleRegistry:
    def __init__(self, max_handles: int = DEFAULT_MAX_HANDLES) -> None:
        self.max_handles = max_handles
        self._handles: OrderedDict[str, CacheHandle] = OrderedDict()
        self._turn_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def turn_lock(self, session_id: str) -> asyncio.Lock:
        """The process-local lock a session's turns (and deletes, and forgets) queue on. The session's lease in the
        database is what serializes them across processes (app/sessions/locking.py); queueing a process's own
        requests in front of it lets one of them at a time ask the database for the lease instead of all of them
        polling it."""
        lock = self._turn_locks.get(session_id)
        if lock is None:
            lock = self._turn_locks[session_id] = asyncio.Lock()
        return lock

    def get(self, session_id: str) -> CacheHandle | None:
        handle = self._handles.get(session_id)
        if handle is not None:
            self._handles.move_to_end(session_id)
        return handle

    def put(self, session_id: str, handle: CacheHandle) -> None:
        self._handles[session_id] = handle
        self._handles.move_to_end(session_id)
        while len(self._handles) > self.max_handles:
            self._handles.popitem(last=False)

    def pop(self, session_id: str) -> CacheHandle | None:
        return self._handles.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._handles)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._handles
